"""A reading command runs without Python's cyclic garbage collector (issue 42): what it
allocates is the modules it imports, which live until the process ends, so the ~150
collections its start-up triggered found nothing to free and cost ~5 % of a ``list``'s
instructions. Every other command — a worker, the dashboard, ``stats --watch`` — runs with it,
and ``main()`` gives the collector back to an in-process caller."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import geneva_drive
from geneva_drive.cli.collector import pauses_collector
from tests.ops_cli.test_commands import _ready

SRC = Path(geneva_drive.__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "args",
    [
        ["list"],
        ["list", "--limit", "5"],
        ["show", "1"],
        ["stats"],
        ["limits"],
        ["--traceback", "list"],
    ],
)
def test_a_reading_command_that_ends_runs_without_the_collector(args):
    assert pauses_collector(args)


@pytest.mark.parametrize(
    "args",
    [
        ["worker"],
        ["housekeeping"],
        ["dashboard"],
        ["dispatch"],
        ["demo"],
        ["stats", "--watch"],
        ["pause", "1"],
        ["migrate"],
        ["--help"],
        [],
    ],
)
def test_every_other_command_keeps_the_collector(args):
    assert not pauses_collector(args)


# Runs in a fresh interpreter, as the console script does: there `geneva_drive.cli.main` is
# still the function (once the `cli.main` submodule is imported, the name is the module).
PROBE = """
import gc, sys
from geneva_drive import admin
from geneva_drive.cli import main

seen = []
find = admin.find  # imported now, so the lazy loader does not undo the patch


def recording_find(*args, **kwargs):
    seen.append(gc.isenabled())
    return find(*args, **kwargs)


admin.find = recording_find
enabled_before = gc.isenabled()
try:
    main(["list", "--database-url", sys.argv[1]])
except SystemExit as ended:
    print(enabled_before, ended.code, seen, gc.isenabled())
"""


def test_list_runs_without_the_collector_and_main_gives_it_back(session, installed_database_url):
    _ready(session)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))

    done = subprocess.run(
        [sys.executable, "-c", PROBE, installed_database_url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "True 0 [False] True"

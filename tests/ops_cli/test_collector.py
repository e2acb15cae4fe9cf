"""A reading command runs without Python's cyclic garbage collector (issue 42): what it
allocates is the modules it imports, which live until the process ends, so the ~150
collections its start-up triggered found nothing to free and cost ~5 % of a ``list``'s
instructions. Every other command — a worker, the dashboard, ``stats --watch`` — runs with it,
and ``main()`` gives the collector back to an in-process caller."""

from __future__ import annotations

import gc

import pytest

from geneva_drive import admin
from geneva_drive.cli import main
from geneva_drive.cli.collector import pauses_collector
from tests.ops_cli.test_commands import _ready


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


def test_list_runs_without_the_collector_and_main_gives_it_back(
    session, installed_database_url, monkeypatch
):
    _ready(session)
    seen: list[bool] = []
    find = admin.find

    def recording_find(*args, **kwargs):
        seen.append(gc.isenabled())
        return find(*args, **kwargs)

    monkeypatch.setattr(admin, "find", recording_find)
    assert gc.isenabled()

    with pytest.raises(SystemExit) as ended:
        main(["list", "--database-url", installed_database_url])

    assert ended.value.code == 0
    assert seen == [False]
    assert gc.isenabled()

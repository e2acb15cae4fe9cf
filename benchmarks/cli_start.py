"""How long a ``geneva-drive`` command takes from the shell prompt back to the prompt.

    .venv/bin/python benchmarks/cli_start.py --runs 15
    .venv/bin/python benchmarks/cli_start.py --src /tmp/old-tree/src   # another tree's code

Creates a SQLite file with ``geneva-drive migrate`` and one workflow in it, then runs the
console script ``--version``, ``list --limit 50``, ``show <id>`` and ``stats`` ``--runs`` times
each (after one warm-up run of each, so the page cache holds the files) and reports the
median and the slowest wall time. Then runs each command once under ``python -X importtime``
and lists the top-level packages that cost the most to import (their modules' own
times, in ms, and the sum of all) — the
evidence of what a command loads. JSON lines on stdout; progress on stderr.

``--src`` puts another tree's ``src`` first on ``PYTHONPATH`` (its code, this venv's
libraries), for a before/after on the same host.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, emit, log, machine

COMMANDS: dict[str, list[str]] = {
    "--version": ["--version"],
    "list --limit 50": ["list", "--limit", "50"],
    "show <id>": ["show", "1"],
    "stats": ["stats"],
}

# Seeds the file: one workflow of a class defined here (show reads rows, not classes).
SEED = """
import sys
from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from geneva_drive import Workflow, step
from geneva_drive.runtime.configure import configured

class CliStartProbe(Workflow):
    may_proceed_without_hero = True

    @step
    def only(self):
        pass

engine = create_engine(sys.argv[1])
with configured(engine=engine), Session(engine) as session, session.begin():
    print(CliStartProbe.create(session, hero=None).id)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--src", type=Path, default=REPO / "src", help="the tree to measure")
    parser.add_argument("--top", type=int, default=8, help="import-time offenders to list")
    args = parser.parse_args()

    env = dict(os.environ, PYTHONPATH=str(args.src.resolve()))
    env.pop("GENEVA_DRIVE_DATABASE_URL", None)
    script = str(Path(sys.executable).parent / "geneva-drive")
    with tempfile.TemporaryDirectory(prefix="gd-cli-start-") as workdir:
        url = f"sqlite:///{workdir}/cli.db"
        env["GENEVA_DRIVE_DATABASE_URL"] = url
        subprocess.run([script, "migrate"], env=env, check=True, capture_output=True)
        seeded = subprocess.run(
            [sys.executable, "-c", SEED, url], env=env, check=True, capture_output=True, text=True
        )
        workflow_id = seeded.stdout.strip()
        emit(kind="setup", machine=machine(), src=str(args.src), runs=args.runs, url=url)
        for name, argv in COMMANDS.items():
            argv = [workflow_id if a == "1" and name.startswith("show") else a for a in argv]
            timings = time_command([script, *argv], env=env, runs=args.runs, cwd=workdir)
            offenders = import_offenders(argv, env=env, cwd=workdir, top=args.top)
            emit(
                kind="command",
                command=name,
                median_ms=round(statistics.median(timings) * 1000),
                max_ms=round(max(timings) * 1000),
                import_top_ms=offenders,
            )
            log(f"{name:<18} median {statistics.median(timings) * 1000:6.0f} ms")


def time_command(command: list[str], *, env: dict[str, str], runs: int, cwd: str) -> list[float]:
    subprocess.run(command, env=env, cwd=cwd, check=True, capture_output=True)  # warm-up
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, env=env, cwd=cwd, check=True, capture_output=True)
        timings.append(time.perf_counter() - started)
    return timings


def import_offenders(argv: list[str], *, env: dict[str, str], cwd: str, top: int) -> dict:
    """The top-level packages a command imported, by their modules' own import time (ms;
    self times, so a package is not charged for what its imports imported)."""
    code = "import sys\nfrom geneva_drive.cli import main\nmain(sys.argv[1:])"
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code, *argv],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    by_package: dict[str, int] = {}
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or line.count("|") != 2:
            continue
        own, _, name = line.removeprefix("import time:").split("|")
        if not own.strip().isdigit():
            continue  # the header line
        top_level = name.strip().partition(".")[0]
        by_package[top_level] = by_package.get(top_level, 0) + int(own.strip())
    by_package["(all)"] = sum(by_package.values())
    ordered = sorted(by_package.items(), key=lambda item: -item[1])[:top]
    return {name: round(us / 1000, 1) for name, us in ordered}


if __name__ == "__main__":
    main()

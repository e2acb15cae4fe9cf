"""How long a ``geneva-drive`` command takes from the shell prompt back to the prompt.

    .venv/bin/python benchmarks/cli_start.py --runs 15
    .venv/bin/python benchmarks/cli_start.py --src /tmp/old-tree/src   # another tree's code
    .venv/bin/python benchmarks/cli_start.py --src /tmp/old-tree/src --src src   # alternating

Creates a SQLite file with ``geneva-drive migrate`` and one workflow in it, then runs the
console script ``--version``, ``list --limit 50``, ``show <id>`` and ``stats`` ``--runs`` times
each (after one warm-up run of each, so the page cache holds the files) and reports the
median and the slowest wall time, and the median CPU time (user + system) of the process.
Then runs each command once under ``python -X importtime`` and lists the top-level packages
that cost the most to import (their modules' own times, in ms, and the sum of all) — the
evidence of what a command loads. JSON lines on stdout; progress on stderr.

``--src`` puts another tree's ``src`` first on ``PYTHONPATH`` (its code, this venv's
libraries), for a before/after on the same host. Given more than once, the trees take turns
run by run (old, new, old, new, …), so a host whose load moves during the measurement moves
every tree's numbers alike; each row then names its ``src``.

Every tree runs from its compiled bytecode, as an installed package does (pip compiles each
module when it installs it): each tree gets a ``PYTHONPYCACHEPREFIX`` of its own in the
temporary directory, filled by the warm-up run, whatever ``PYTHONDONTWRITEBYTECODE`` says.
Until 2026-12-05 evening the shells here set it, and every run compiled geneva-drive's ~40
modules from source (~30 ms of a ``list``).

``--instructions`` also counts each command's instructions once per tree under valgrind's
callgrind (the whole process, start-up included): unlike the wall and CPU times, the host's
load does not move them.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
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
    parser.add_argument(
        "--src", type=Path, action="append", help="a tree to measure (repeat: alternate them)"
    )
    parser.add_argument("--top", type=int, default=8, help="import-time offenders to list")
    parser.add_argument(
        "--instructions", action="store_true", help="count each command's under callgrind"
    )
    args = parser.parse_args()

    trees = [src.resolve() for src in args.src or [REPO / "src"]]
    env = dict(os.environ, PYTHONPATH=str(trees[0]))
    env.pop("GENEVA_DRIVE_DATABASE_URL", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    script = str(Path(sys.executable).parent / "geneva-drive")
    with tempfile.TemporaryDirectory(prefix="gd-cli-start-") as workdir:
        url = f"sqlite:///{workdir}/cli.db"
        env["GENEVA_DRIVE_DATABASE_URL"] = url
        subprocess.run([script, "migrate"], env=env, check=True, capture_output=True)
        seeded = subprocess.run(
            [sys.executable, "-c", SEED, url], env=env, check=True, capture_output=True, text=True
        )
        workflow_id = seeded.stdout.strip()
        envs = {
            tree: dict(env, PYTHONPATH=str(tree), PYTHONPYCACHEPREFIX=f"{workdir}/pyc-{n}")
            for n, tree in enumerate(trees)
        }
        emit(kind="setup", machine=machine(), src=[str(t) for t in trees], runs=args.runs, url=url)
        for name, argv in COMMANDS.items():
            argv = [workflow_id if a == "1" and name.startswith("show") else a for a in argv]
            timings = time_command([script, *argv], envs=envs, runs=args.runs, cwd=workdir)
            for tree, tree_env in envs.items():
                offenders = import_offenders(argv, env=tree_env, cwd=workdir, top=args.top)
                counted = (
                    instructions([script, *argv], env=tree_env, cwd=workdir)
                    if args.instructions
                    else None
                )
                walls = [wall for wall, _ in timings[tree]]
                cpu_ms = statistics.median(cpu for _, cpu in timings[tree]) * 1000
                emit(
                    kind="command",
                    command=name,
                    src=str(tree),
                    median_ms=round(statistics.median(walls) * 1000),
                    max_ms=round(max(walls) * 1000),
                    cpu_median_ms=round(cpu_ms),
                    instructions=counted,
                    loadavg=os.getloadavg(),
                    import_top_ms=offenders,
                )
                median_ms = statistics.median(walls) * 1000
                count = "" if counted is None else f"  {counted / 1e6:7.1f} M instr"
                log(f"{name:<18} median {median_ms:6.0f} ms  CPU {cpu_ms:6.0f} ms{count}  {tree}")


def time_command(
    command: list[str], *, envs: dict[Path, dict[str, str]], runs: int, cwd: str
) -> dict[Path, list[tuple[float, float]]]:
    """(wall, CPU) seconds of ``command`` per tree, the trees taking turns run by run. The
    CPU (user + system of the child) moves less than the wall time when other processes
    share the cores."""
    for env in envs.values():
        subprocess.run(command, env=env, cwd=cwd, check=True, capture_output=True)  # warm-up
    timings: dict[Path, list[tuple[float, float]]] = {tree: [] for tree in envs}
    for _ in range(runs):
        for tree, env in envs.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            subprocess.run(command, env=env, cwd=cwd, check=True, capture_output=True)
            wall = time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            timings[tree].append((wall, cpu))
    return timings


def instructions(command: list[str], *, env: dict[str, str], cwd: str) -> int:
    """The instructions ``command`` executes, counted by callgrind (needs valgrind)."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{command} under valgrind failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


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

"""Client instructions per step, counted by valgrind: a geneva-drive step thread, the bare loop.

    .venv/bin/python benchmarks/instructions.py --workflows 300
    .venv/bin/python benchmarks/instructions.py --src /tmp/old-tree/src   # another tree's code

Time per step on this shared virtual machine moves by a third from one run to the next (the
same code measured 0.40 and 0.63 ms of worker CPU per step in consecutive runs, with nothing
stolen). The instructions a process executes do not: valgrind's callgrind counts them,
repeatable to about 0.1 %. This counts the user-space instructions of a geneva-drive step
thread (``executor.claim_and_run`` in a loop, one thread, chaining on, as a worker's thread
runs it) and of the bare SQLAlchemy loop with one thread (``peers/peer_bare.py``), each on
a backlog of ``--workflows`` three-step no-op workflows on the same PostgreSQL, with the
instrumentation switched on for the run only: neither start-up nor seeding is counted.

What it leaves out: the kernel's share of a process's CPU (a round trip is a send, a poll and
a receive: the bare loop makes seven per step, geneva-drive about 2.3), and the cost of
several threads sharing one interpreter. Needs valgrind (``apt-get install valgrind``).
Prints one JSON line per system and one with the ratio.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BENCH_DIR, REPO, callgrind_instrumentation, emit, log, machine, start_postgres

STEPS = 3
VALGRIND = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=/dev/null"]


def geneva_drive_child(url: str, workflows: int) -> None:
    """Under valgrind: seed a backlog, then count one step thread's run of it."""
    import _gd
    import gd_app

    engine, config = _gd.prepare(url)
    _gd.seed(config, gd_app.BenchThreeSteps, workflows)
    with engine.begin() as conn:  # as throughput.py: what autovacuum does within a minute
        conn.exec_driver_sql("ANALYZE")
    callgrind_instrumentation(True)
    _gd.drain_with_one_step_thread(config, "instructions")
    callgrind_instrumentation(False)
    engine.dispose()


def counted(argv: list[str], env: dict[str, str]) -> int:
    done = subprocess.run([*VALGRIND, *argv], capture_output=True, text=True, env=env, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{argv[1]} under valgrind failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workflows", type=int, default=300)
    parser.add_argument("--src", default=str(REPO / "src"), help="the geneva-drive tree to count")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "geneva-drive":
        geneva_drive_child(args.url, args.workflows)
        return
    emit(bench="machine", **machine())
    env = {**os.environ, "PYTHONPATH": args.src}
    server = start_postgres()
    try:
        steps = STEPS * args.workflows
        name, url = server.create_database("instr_gd")
        log(f"instructions: geneva-drive ({args.src}), {args.workflows} workflows")
        child = ["--child", "geneva-drive", "--url", url, "--workflows", str(args.workflows)]
        gd = counted([sys.executable, __file__, *child], env)
        emit(
            bench="instructions",
            system="geneva-drive step thread",
            src=args.src,
            steps=steps,
            instructions=gd,
            per_step=round(gd / steps),
        )
        name, url = server.create_database("instr_bare")
        log("instructions: bare SQLAlchemy loop, 1 thread")
        dsn = server.url(name, driver="postgresql")
        peer = [str(BENCH_DIR / "peers" / "peer_bare.py"), "--callgrind", "--threads", "1"]
        peer += ["--url", url, "--dsn", dsn, "--dbname", name, "--workflows", str(args.workflows)]
        bare = counted([sys.executable, *peer], env)
        emit(
            bench="instructions",
            system="bare SQLAlchemy loop, 1 thread",
            steps=steps,
            instructions=bare,
            per_step=round(bare / steps),
        )
        emit(bench="instructions", ratio_geneva_drive_to_bare=round(gd / bare, 3))
    finally:
        server.stop()


if __name__ == "__main__":
    main()

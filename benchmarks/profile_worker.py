"""Where one `geneva-drive worker` process spends its time per step: py-spy on a backlog.

    .venv/bin/python benchmarks/profile_worker.py --py-spy /path/to/py-spy --workflows 3000
    .venv/bin/python benchmarks/profile_worker.py --py-spy /path/to/py-spy --gil   # Python only

py-spy is not one of the project's dependencies: install it anywhere (``python -m venv
/tmp/spy && /tmp/spy/bin/pip install py-spy``) and pass its path. The script seeds N
three-step no-op workflows on a fresh embedded PostgreSQL (``synchronous_commit=on``, TCP),
starts one worker process with its defaults, attaches ``py-spy record --format raw`` to it
until the backlog is done, and prints one JSON line: steps/s, the worker's user and system
CPU per step, the samples per step, and the functions with the largest inclusive and self
shares. Without ``--gil`` py-spy samples every thread's wall time (waiting on the socket
included); with it, only the thread holding the GIL — the Python the process runs.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _gd
import gd_app
from _common import emit, log, start_postgres

_TICK = 100  # clock ticks per second in /proc/<pid>/stat


def _cpu(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK


def shares(raw: Path, top: int) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]]:
    """Samples, and the inclusive and self shares (%) of the frames, from py-spy's raw format."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n

    def pct(counter: collections.Counter[str]) -> list[tuple[str, float]]:
        return [(f, round(100 * n / max(total, 1), 1)) for f, n in counter.most_common(top)]

    return total, pct(inclusive), pct(own)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--py-spy", required=True, help="path of the py-spy executable")
    parser.add_argument("--workflows", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=None, help="step threads")
    parser.add_argument("--gil", action="store_true", help="only the thread holding the GIL")
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    server = start_postgres("durable", transport="tcp")
    try:
        _name, url = server.create_database("prof")
        engine, config = _gd.prepare(url)
        _gd.seed(config, gd_app.BenchThreeSteps, args.workflows)
        engine.dispose()
        procs, t0 = _gd.start_worker_processes(url, 1, args.concurrency)
        pid = procs[0].pid
        raw = Path(tempfile.mkdtemp(prefix="gd-prof-")) / "profile.txt"
        spy = [args.py_spy, "record", "--pid", str(pid), "--format", "raw", "-o", str(raw)]
        spy += ["--rate", str(args.rate), "--nonblocking"] + (["--gil"] if args.gil else [])
        recorder = subprocess.Popen(spy, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started = time.time() - (time.perf_counter() - t0)
        try:
            run = _gd.run_processes(engine, procs, args.workflows, started, t0)
            user, system = _cpu(pid)
        finally:
            recorder.send_signal(2)  # py-spy writes its file on SIGINT
            recorder.wait(60)
            _gd.stop_processes(procs)
        steps = 3 * args.workflows
        samples, inclusive, own = shares(raw, args.top)
        log(f"profile_worker: raw samples in {raw}")
        emit(
            bench="profile_worker",
            mode="gil" if args.gil else "wall",
            workflows=args.workflows,
            steps_per_s=round(steps / run.seconds, 1),
            # The whole process's, its start-up (imports) included.
            user_cpu_ms_per_step=round(user * 1000 / steps, 3),
            system_cpu_ms_per_step=round(system * 1000 / steps, 3),
            samples_per_step=round(samples / steps, 4),  # ÷ rate: seconds sampled per step
            rate=args.rate,
            inclusive=inclusive,
            self=own,
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()

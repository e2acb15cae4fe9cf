"""DBOS: three no-op steps in a workflow — queued (Queue + worker) and a direct loop.

Run by ``benchmarks/peers.py`` with the peers' venv:
    .venv-peers/bin/python benchmarks/peers/peer_dbos.py --url URL --dsn DSN --dbname DB
Configuration from DBOS's docs: one queue from ``DBOS.register_queue`` with a per-process
limit (``worker_concurrency``) and a 0.1 s ``polling_interval_sec`` (default 1 s),
LISTEN/NOTIFY on (the default). The queued time includes enqueueing (DBOS dequeues only
after launch).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import commits, emit, self_gauges


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True, help="SQLAlchemy-style postgresql:// URL")
    parser.add_argument("--dsn", required=True, help="libpq DSN for the commit counter")
    parser.add_argument("--dbname", required=True)
    parser.add_argument("--workflows", type=int, default=2000)
    parser.add_argument("--mode", choices=["queued", "loop"], default="queued")
    parser.add_argument("--worker-concurrency", type=int, default=16)
    args = parser.parse_args()

    from dbos import DBOS

    DBOS(config={"name": "gdbench", "system_database_url": args.url, "log_level": "WARNING"})

    @DBOS.step()
    def one(i: int) -> int:
        return i

    @DBOS.step()
    def two(i: int) -> int:
        return i

    @DBOS.step()
    def three(i: int) -> int:
        return i

    @DBOS.workflow()
    def three_steps(i: int) -> None:
        one(i)
        two(i)
        three(i)

    DBOS.launch()
    queue = DBOS.register_queue(
        "gdbench", worker_concurrency=args.worker_concurrency, polling_interval_sec=0.1
    )
    import psycopg

    before = commits(args.dsn, args.dbname)
    cpu0 = self_gauges()["cpu_s"]
    t0 = time.perf_counter()
    enqueue_s = None
    if args.mode == "loop":
        for i in range(args.workflows):
            three_steps(i)
    else:
        for i in range(args.workflows):
            queue.enqueue(three_steps, i)
        enqueue_s = time.perf_counter() - t0
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            while True:
                done = conn.execute(
                    "SELECT count(*) FROM dbos.workflow_status "
                    "WHERE queue_name = 'gdbench' AND status = 'SUCCESS'"
                ).fetchone()[0]
                if done >= args.workflows:
                    break
                time.sleep(0.05)
    seconds = time.perf_counter() - t0
    cpu = self_gauges()["cpu_s"] - cpu0
    DBOS.destroy()
    time.sleep(0.5)
    after = commits(args.dsn, args.dbname)
    steps = 3 * args.workflows
    emit(
        bench="throughput",
        system=f"DBOS ({args.mode})",
        workflows=args.workflows,
        steps=steps,
        seconds=round(seconds, 3),
        workflows_per_s=round(args.workflows / seconds, 1),
        steps_per_s=round(steps / seconds, 1),
        enqueue_s=round(enqueue_s, 2) if enqueue_s is not None else None,
        commits_per_step=round((after - before) / steps, 2),
        cpu_ms_per_step=round(cpu * 1000 / steps, 3),
        peak_rss_mb=round(self_gauges()["peak_rss_mb"], 1),
        config=f"worker_concurrency={args.worker_concurrency}, polling_interval_sec=0.1",
    )


if __name__ == "__main__":
    main()

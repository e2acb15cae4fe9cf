"""Procrastinate: three async no-op tasks, each deferring the next (a workflow of three).

Run by ``benchmarks/peers.py``:
    .venv-peers/bin/python benchmarks/peers/peer_procrastinate.py --dsn DSN --dbname DB
The N first tasks are deferred before the worker starts. Configuration from Procrastinate's
docs: async tasks with worker ``concurrency`` (default here 10), LISTEN/NOTIFY on (default),
finished jobs kept (default ``delete_jobs="never"``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import commits, emit, self_gauges


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--dbname", required=True)
    parser.add_argument("--workflows", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=10)
    args = parser.parse_args()

    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=args.dsn))

    @app.task(name="gdbench_one")
    async def one(i: int) -> None:
        await two.defer_async(i=i)

    @app.task(name="gdbench_two")
    async def two(i: int) -> None:
        await three.defer_async(i=i)

    @app.task(name="gdbench_three")
    async def three(i: int) -> None:
        pass

    async def run() -> dict:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            for i in range(args.workflows):
                await one.defer_async(i=i)
            before = commits(args.dsn, args.dbname)
            cpu0 = self_gauges()["cpu_s"]
            t0 = time.perf_counter()
            worker = asyncio.create_task(
                app.run_worker_async(concurrency=args.concurrency, install_signal_handlers=False)
            )
            import psycopg

            async with await psycopg.AsyncConnection.connect(args.dsn, autocommit=True) as conn:
                while True:
                    cur = await conn.execute(
                        "SELECT count(*) FROM procrastinate_jobs "
                        "WHERE task_name = 'gdbench_three' AND status = 'succeeded'"
                    )
                    if (await cur.fetchone())[0] >= args.workflows:
                        break
                    await asyncio.sleep(0.05)
            seconds = time.perf_counter() - t0
            cpu = self_gauges()["cpu_s"] - cpu0
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await worker
        await asyncio.sleep(0.5)
        return {
            "seconds": seconds,
            "cpu": cpu,
            "before": before,
            "after": commits(args.dsn, args.dbname),
        }

    out = asyncio.run(run())
    steps = 3 * args.workflows
    emit(
        bench="throughput",
        system="Procrastinate (defer next)",
        workflows=args.workflows,
        steps=steps,
        seconds=round(out["seconds"], 3),
        workflows_per_s=round(args.workflows / out["seconds"], 1),
        steps_per_s=round(steps / out["seconds"], 1),
        commits_per_step=round((out["after"] - out["before"]) / steps, 2),
        cpu_ms_per_step=round(out["cpu"] * 1000 / steps, 3),
        peak_rss_mb=round(self_gauges()["peak_rss_mb"], 1),
        config=f"async tasks, worker concurrency={args.concurrency}, listen_notify on",
    )


if __name__ == "__main__":
    main()

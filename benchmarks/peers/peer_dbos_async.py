"""DBOS: async workflows whose one async step awaits a second of I/O (``async_io.py``'s peer).

Run by ``benchmarks/async_io.py`` with the peers' venv:
    .venv-peers/bin/python benchmarks/peers/peer_dbos_async.py --url URL --dsn DSN --dbname DB
DBOS's documented way to run async workflows in the background: an ``async def``
``@DBOS.workflow()`` calling an ``async def`` ``@DBOS.step()``, started with
``DBOS.start_workflow_async`` (which "runs in the same event loop as its caller"), all of them
started at once from one coroutine and awaited through their handles; DBOS's defaults
otherwise (system database pool, executor threads). One process starts and runs them, as a
DBOS application does. Wall time from the rows: the first workflow's ``created_at`` to the
last one's final status commit (``dbos.workflow_status``: ``created_at`` in epoch ms, and
PostgreSQL's commit timestamp of the row's last write).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import emit, self_gauges

IO_SECONDS = 1.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True, help="SQLAlchemy-style postgresql:// URL")
    parser.add_argument("--dsn", required=True, help="libpq DSN for reading the rows")
    parser.add_argument("--dbname", required=True)
    parser.add_argument("--workflows", type=int, default=1000)
    args = parser.parse_args()

    from dbos import DBOS

    DBOS(config={"name": "gdbench", "system_database_url": args.url, "log_level": "WARNING"})

    @DBOS.step()
    async def wait(i: int) -> int:
        await asyncio.sleep(IO_SECONDS)
        return i

    @DBOS.workflow()
    async def one_wait(i: int) -> int:
        return await wait(i)

    DBOS.launch()

    async def run_all() -> None:
        handles = await asyncio.gather(
            *(DBOS.start_workflow_async(one_wait, i) for i in range(args.workflows))
        )
        await asyncio.gather(*(handle.get_result() for handle in handles))

    cpu0 = self_gauges()["cpu_s"]
    t0 = time.perf_counter()
    asyncio.run(run_all())
    seconds = time.perf_counter() - t0
    cpu = self_gauges()["cpu_s"] - cpu0
    import psycopg

    with psycopg.connect(args.dsn, autocommit=True) as conn:
        first, last, last_commit, done = conn.execute(
            "SELECT min(created_at), max(updated_at), "
            "extract(epoch FROM max(pg_xact_commit_timestamp(xmin))), "
            "count(*) FILTER (WHERE status = 'SUCCESS') FROM dbos.workflow_status"
        ).fetchone()
    DBOS.destroy()
    # The last status write's commit, by PostgreSQL's clock (async_io.py turns
    # track_commit_timestamp on); else DBOS's own updated_at stamp.
    wall = (float(last_commit) if last_commit is not None else last / 1000) - first / 1000
    emit(
        bench="async-io",
        system="DBOS async",
        io="sleep",
        workflows=args.workflows,
        finished=done,
        wall_s=round(wall, 2),
        wall_by="commit timestamps" if last_commit is not None else "updated_at stamps",
        wall_stamps_s=round((last - first) / 1000, 2),
        seconds_by_clock=round(seconds, 2),
        steps_per_s=round(args.workflows / wall, 1),
        cpu_s=round(cpu, 2),
        peak_rss_mb=round(self_gauges()["peak_rss_mb"], 1),
        config="start_workflow_async from one coroutine, DBOS defaults",
    )


if __name__ == "__main__":
    main()

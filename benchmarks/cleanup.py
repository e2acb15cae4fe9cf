"""Housekeeping cleanup: deleting N old executions (rows/s) with ``housekeeping.run()``.

    .venv/bin/python benchmarks/cleanup.py --executions 1000000

Fills a fresh database with N/3 workflows finished 60 days ago (three executions each, past
the default 30-day retention) and times one ``geneva_drive.runtime.housekeeping.run()`` pass, which
deletes them in batches of ``housekeeping_batch_size`` (default 1,000; ``--batch`` to change).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _gd
from _common import emit, log, machine, start_postgres
from flatcost import fill
from sqlalchemy import text

from geneva_drive.runtime.configure import configure


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executions", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=None, help="housekeeping_batch_size")
    parser.add_argument("--backend", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--durability", choices=["durable", "async"], default="async")
    args = parser.parse_args(argv)
    server = start_postgres(args.durability) if args.backend == "postgresql" else None
    try:
        emit(bench="machine", **machine())
        if server is not None:
            _, url = server.create_database("clean")
        else:
            url = _gd.sqlite_url(Path(tempfile.mkdtemp(prefix="gd-bench-sqlite-")))
        engine, config = _gd.prepare(url)
        if args.batch:
            config = configure(housekeeping_batch_size=args.batch)
        log(f"cleanup: filling {args.executions} old executions")
        fill(engine, args.executions, args.backend, age_days=60, ongoing=0)
        result: dict = {"bench": "cleanup", "backend": args.backend, "rows": args.executions}
        try:
            from geneva_drive.runtime import housekeeping
        except ImportError as error:
            result["pending"] = f"geneva_drive.runtime.housekeeping: {error}"
            emit(**result)
            return result
        t0 = time.perf_counter()
        counters = housekeeping.run(config)
        seconds = time.perf_counter() - t0
        with engine.connect() as conn:
            left = conn.execute(text("SELECT count(*) FROM geneva_drive_step_executions")).scalar()
        deleted = counters.get("step_executions_cleaned_up", 0)
        result.update(
            seconds=round(seconds, 2),
            executions_deleted=deleted,
            executions_per_s=round(deleted / seconds, 1),
            all_rows_per_s=round((deleted + counters.get("workflows_cleaned_up", 0)) / seconds, 1),
            batch_size=config.housekeeping_batch_size,
            executions_left=left,
            counters=counters,
        )
        emit(**result)
        engine.dispose()
        return result
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()

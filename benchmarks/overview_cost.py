"""The overview's statistics at two history sizes: is their cost flat in the history?

    .venv/bin/python benchmarks/overview_cost.py --server stock --pg-data /var/tmp/gd-pg15 \\
        --sizes 100000,1000000

``admin.stats`` — the overview's one call — counts the work in flight and the last hour, so
its cost should follow the live work (admin.py's fill keeps 10,000 live workflows and the
same last hour at every size from 100k up) and not the history. For each size, on databases
filled and kept as benchmarks/dashboard.py does: ``--repeat`` calls in-process after a
warm-up (p50/p95, each call its own transaction, the clock at the fill's "now"), then each of
its statements under ``EXPLAIN (ANALYZE, BUFFERS)``: execution time, rows and the pages it
touched (shared hit + read). Flat: the same pages at 100k and 1M. JSON lines on stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_server_arguments, emit, log, machine, percentile, start_server
from admin import NOW
from dashboard import filled_database
from sqlalchemy import event, text
from sqlalchemy.orm import Session

import geneva_drive
from geneva_drive import admin
from geneva_drive.runtime.configure import configure


def statements(engine: Any) -> list[tuple[str, Any]]:
    """The statements one ``admin.stats`` call runs, with their parameters."""
    seen: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        with Session(engine) as session, session.begin():
            admin.stats(session, now=NOW)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return seen


def explain(engine: Any, statement: str, parameters: Any) -> dict[str, Any]:
    with engine.connect() as conn:
        conn.exec_driver_sql("SET jit = off")  # as stats runs them (short_statements)
        conn.exec_driver_sql("SET max_parallel_workers_per_gather = 0")
        plan = conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, parameters
        ).scalar_one()[0]
    top = plan["Plan"]
    return {
        "ms": round(plan["Execution Time"], 2),
        "rows": top["Actual Rows"],
        "pages": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
    }


def measure(url: str, n: int, repeat: int) -> None:
    engine = geneva_drive.create_engine(url)
    configure(engine=engine)
    samples = []
    for i in range(repeat + 1):
        with Session(engine) as session, session.begin():
            t0 = time.perf_counter()
            admin.stats(session, now=NOW)
            if i:  # the first call is the warm-up
                samples.append((time.perf_counter() - t0) * 1000)
    with engine.connect() as conn:
        finished = conn.execute(
            text("SELECT count(*) FROM geneva_drive_workflows WHERE state = 'finished'")
        ).scalar_one()
    row = {
        "size": n,
        "finished": finished,
        "p50_ms": round(percentile(samples, 50) or 0, 1),
        "p95_ms": round(percentile(samples, 95) or 0, 1),
        "loadavg": os.getloadavg(),
    }
    emit(kind="stats", **row)
    log(f"size {n:,} ({finished:,} finished): stats p50 {row['p50_ms']} p95 {row['p95_ms']} ms")
    for number, (statement, parameters) in enumerate(statements(engine), 1):
        facts = explain(engine, statement, parameters)
        emit(kind="statement", size=n, number=number, sql=statement[:120], **facts)
        log(f"  statement {number}: {facts}")
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--executions-per", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=30)
    add_server_arguments(parser)
    args = parser.parse_args()
    emit(kind="setup", machine=machine(), server=args.server, sizes=args.sizes)
    server = start_server(args)
    try:
        for n in (int(size) for size in args.sizes.split(",")):
            measure(filled_database(server, n, args.executions_per), n, args.repeat)
    finally:
        server.stop()


if __name__ == "__main__":
    main()

"""Resumable steps: items/s over a table of N rows, per-item and batched checkpoints.

    .venv/bin/python benchmarks/resumable.py --rows 1000000

One resumable step walks ``bench_items`` (N rows, bulk-inserted) with keyset pages of 1,000
rows, run by the in-process worker. Three ways to checkpoint:
- ``per_item``: ``iterate_over_records`` with the default — a commit of the cursor per item;
- ``checkpoint_every``: the same loop with ``checkpoint_every=1000`` — a commit per 1,000;
- ``batches``: ``iterate_over_batches`` — one checkpoint (and commit) per page of 1,000.
The step body does no work of its own, so this is the framework's cost per item (plus the
ORM's cost of loading each row as an instance, which the step asked for). Besides items/s it
reports this process's CPU per item (the worker runs in-process; the script's own progress
polls are negligible) and the statements and commits per item that the worker issued.
``--per-item-rows`` caps the per-item run (it commits once per row; say so in the results).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _gd
import gd_app
from _common import emit, log, machine, start_postgres
from sqlalchemy import event, text
from sqlalchemy.orm import Session

VARIANTS = {
    "per_item": gd_app.BenchResumablePerItem,
    "checkpoint_every": gd_app.BenchResumableEvery,
    "batches": gd_app.BenchResumableBatches,
}


def fill_items(engine, rows: int) -> None:  # type: ignore[no-untyped-def]
    gd_app.BenchItem.__table__.create(engine)
    with engine.begin() as conn:
        conn.execute(
            text(
                "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :n) "
                "INSERT INTO bench_items (id, payload) SELECT i, 'item' FROM s"
            ),
            {"n": rows},
        )
        conn.execute(text("ANALYZE"))


def one(url: str, variant: str, rows: int, backend: str) -> dict:
    engine, config = _gd.prepare(url)
    fill_items(engine, rows)
    with Session(engine) as session:
        VARIANTS[variant].create(session)
        session.commit()
    log(f"resumable: {variant} over {rows} rows")
    counts = {"statements": 0, "commits": 0}

    def on_statement(*_: object) -> None:
        counts["statements"] += 1

    def on_commit(*_: object) -> None:
        counts["commits"] += 1

    event.listen(engine, "before_cursor_execute", on_statement)
    event.listen(engine, "commit", on_commit)
    cpu0 = time.process_time()
    run = _gd.run_in_process(config, 1, 1, timeout=3600)
    cpu = time.process_time() - cpu0
    event.remove(engine, "before_cursor_execute", on_statement)
    event.remove(engine, "commit", on_commit)
    statements = counts["statements"]  # the progress polls run on an engine of their own
    with engine.connect() as conn:
        cursor, executions = conn.execute(
            text(
                "SELECT max(cursor::text), count(*) FROM geneva_drive_step_executions"
                if backend == "postgresql"
                else "SELECT max(cursor), count(*) FROM geneva_drive_step_executions"
            )
        ).one()
    engine.dispose()
    return {
        "bench": "resumable",
        "backend": backend,
        "variant": variant,
        "rows": rows,
        "seconds": round(run.seconds, 2),
        "items_per_s": round(rows / run.seconds, 1),
        "cpu_ms_per_item": round(cpu * 1000 / rows, 4),
        "statements_per_item": round(statements / rows, 4),
        "commits_per_item": round(counts["commits"] / rows, 4),
        "executions": executions,
        "final_cursor": cursor,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument(
        "--per-item-rows", type=int, default=100_000, help="row cap for the per-item variant"
    )
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--backend", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--durability", choices=["durable", "async"], default="async")
    args = parser.parse_args(argv)
    server = start_postgres(args.durability) if args.backend == "postgresql" else None
    results = []
    try:
        emit(bench="machine", **machine())
        for variant in args.variants.split(","):
            rows = min(args.rows, args.per_item_rows) if variant == "per_item" else args.rows
            if server is not None:
                name, url = server.create_database("res")
            else:
                url = _gd.sqlite_url(Path(tempfile.mkdtemp(prefix="gd-bench-sqlite-")))
            t0 = time.perf_counter()
            result = one(url, variant, rows, args.backend)
            result["total_s"] = round(time.perf_counter() - t0, 1)
            emit(**result)
            results.append(result)
            if server is not None:
                server.drop_database(name)
    finally:
        if server is not None:
            server.stop()
    return results


if __name__ == "__main__":
    main()

"""Admin API cost at scale: list, count, show, stats and a bulk action, from 10k to 1M workflows.

    .venv/bin/python benchmarks/admin.py --sizes 10000,100000,1000000 --executions-per 10
    .venv/bin/python benchmarks/admin.py --server stock   # Debian's PostgreSQL 15, its defaults

For each size a fresh PostgreSQL database (``--server``: the embedded PostgreSQL 18 by
default) is filled server-side (``INSERT … SELECT`` over ``generate_series``; the secondary
indexes are dropped for the load and rebuilt after, then ``VACUUM ANALYZE``): ``size``
workflows of five classes, each with ``--executions-per``
executions. 10,000 are live at every size (5,000 at 10k) — a fifth paused after a failure
(half RuntimeError, half TimeoutError), two fifths ready with a step scheduled (a third of
them overdue), a fifth waiting for signal "approved" (half past their deadline), a fifth
performing (a fifth of them with an expired lease) — and the rest finished or canceled,
one workflow created every 2.6 s (so the last hour's throughput is the same at every size).
Then, through ``geneva_drive.admin``:

- ``find`` first page and a deep page (a cursor in the middle of the history), per filter;
- ``count`` (capped at 10,000), ``show`` of random workflows, ``stats``;
- ``bulk("pause")`` over every ongoing workflow (10,000; the paused ones are refused), each
  batch of 500 its own transaction.

Each timed call repeated (``--repeat``), p50/p95 in ms, and the plan of every statement (the
plan the server settles on once the statement is prepared, as tests/admin does). JSON lines on
stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_server_arguments, emit, log, machine, percentile, start_server
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

import geneva_drive
from geneva_drive import admin
from geneva_drive.admin import WorkflowFilter
from geneva_drive.admin.find import encode_cursor
from geneva_drive.runtime.configure import configure

NOW = datetime(2026, 12, 1, tzinfo=UTC)  # "now" for stats: an hour after the newest workflow
# One workflow created every 2.592 s at every size (1M span 30 days): the last hour's
# throughput, what stats' outcomes read, is the same at every size.
EVERY = timedelta(seconds=2.592)
LIVE = 10_000  # live workflows from 100k up (half of 10k): the work in flight stays put
CLASSES = ("BenchSignup", "BenchOrder", "BenchInvoice", "BenchErasure", "BenchWebhook")

# m: 0 paused, 1-2 ready (scheduled), 3 ready (waiting), 4 performing — every k-th workflow
# (k = n / LIVE), so LIVE of them at every size —, 5 canceled (one in ten of the rest), 10
# finished. Times: workflow i is created at base + i * EVERY.
FILL_WORKFLOWS = """
INSERT INTO geneva_drive_workflows
  (id, type, state, hero_type, hero_id, allow_multiple, current_step_name, next_step_name,
   started_at, transitioned_at, created_at, updated_at)
SELECT i,
       -- i / (5k) turns the class over every fifth live workflow: with i %% 5 alone every
       -- live one (i a multiple of k, itself a multiple of 5 from 100k up) was BenchSignup.
       (ARRAY['BenchSignup','BenchOrder','BenchInvoice','BenchErasure','BenchWebhook'])
         [(i + i / (5 * %(k)s)) %% 5 + 1],
       CASE WHEN m = 0 THEN 'paused' WHEN m IN (1, 2, 3) THEN 'ready'
            WHEN m = 4 THEN 'performing' WHEN m = 5 THEN 'canceled' ELSE 'finished' END,
       'Customer', i::text, true,
       CASE WHEN m = 4 THEN 'step_4' END,
       CASE WHEN m < 5 THEN 'step_4' END,
       t, CASE WHEN m IN (1, 2, 3, 4) THEN NULL ELSE t + interval '1 hour' END, t, t
FROM (SELECT i, %(base)s::timestamp + i * %(step)s::interval AS t,
             CASE WHEN i %% %(k)s = 0 THEN (i / %(k)s) %% 5
         WHEN i %% 10 = 1 THEN 5 ELSE 10 END AS m
      FROM generate_series(1, %(n)s) AS i) AS s
"""
# Execution k of workflow w: k < per - 1 completed; the last one tells the workflow's state.
FILL_EXECUTIONS = """
INSERT INTO geneva_drive_step_executions
  (id, workflow_id, step_name, state, outcome, scheduled_for, started_at, finished_at,
   completed_at, failed_at, error_class_name, error_message, awaiting_signal, wait_deadline,
   waiting_since, lease_owner, lease_expires_at, queue, priority, metadata, created_at,
   updated_at)
SELECT (w - 1) * %(per)s + k + 1, w, 'step_' || (k %% 5),
       CASE WHEN last AND m = 0 THEN 'failed' WHEN last AND m IN (1, 2) THEN 'scheduled'
            WHEN last AND m = 3 THEN 'waiting' WHEN last AND m = 4 THEN 'in_progress'
            WHEN last AND m BETWEEN 5 AND 9 THEN 'canceled' ELSE 'completed' END,
       CASE WHEN last AND m = 0 THEN 'failed' WHEN last AND m BETWEEN 1 AND 4 THEN NULL
            WHEN last AND m BETWEEN 5 AND 9 THEN 'canceled' ELSE 'success' END,
       CASE WHEN last AND m IN (1, 2) AND w %% 3 = 0 THEN t - interval '1 hour'
            WHEN last AND m IN (1, 2) THEN t + interval '1 day' ELSE t END,
       CASE WHEN last AND m BETWEEN 1 AND 3 THEN NULL ELSE t END,
       CASE WHEN last AND m BETWEEN 1 AND 4 THEN NULL ELSE t + interval '1 second' END,
       CASE WHEN last AND m < 10 THEN NULL ELSE t + interval '1 second' END,
       CASE WHEN last AND m = 0 THEN t + interval '1 second' END,
       CASE WHEN last AND m = 0 AND w %% 2 = 0 THEN 'RuntimeError'
            WHEN last AND m = 0 THEN 'TimeoutError' END,
       CASE WHEN last AND m = 0 THEN 'card declined' END,
       CASE WHEN last AND m = 3 THEN 'approved' END,
       CASE WHEN last AND m = 3 AND w %% 2 = 0 THEN t + interval '1 hour'
            WHEN last AND m = 3 THEN t + interval '100 days' END,
       CASE WHEN last AND m = 3 THEN t END,
       CASE WHEN last AND m = 4 THEN 'bench-worker' END,
       CASE WHEN last AND m = 4 AND w %% 5 = 0 THEN t
            WHEN last AND m = 4 THEN %(far)s::timestamp END,
       'q' || (w %% 3), 0, NULL, t, t
FROM (SELECT w, k, k = %(per)s - 1 AS last, CASE WHEN w %% %(k)s = 0 THEN (w / %(k)s) %% 5
         WHEN w %% 10 = 1 THEN 5 ELSE 10 END AS m,
             %(base)s::timestamp + w * %(step)s::interval + k * interval '1 minute' AS t
      FROM generate_series(1, %(n)s) AS w, generate_series(0, %(per)s - 1) AS k) AS s
"""
# One signal per waiting workflow (buffered: "other"), one operator action per paused one.
FILL_SIDES = """
INSERT INTO geneva_drive_signals (id, workflow_id, name, state, claimed, consumed, created_at,
  updated_at)
SELECT w, w, 'other', 'pending', 0, 0, %(base)s::timestamp + w * %(step)s::interval,
       %(base)s::timestamp + w * %(step)s::interval
FROM generate_series(1, %(n)s) AS w WHERE CASE WHEN w %% %(k)s = 0 THEN (w / %(k)s) %% 5
         WHEN w %% 10 = 1 THEN 5 ELSE 10 END = 3;
INSERT INTO geneva_drive_operator_actions (id, workflow_id, action, actor, reason, at)
SELECT w, w, 'pause', 'ops', 'seeded', %(base)s::timestamp + w * %(step)s::interval
FROM generate_series(1, %(n)s) AS w WHERE CASE WHEN w %% %(k)s = 0 THEN (w / %(k)s) %% 5
         WHEN w %% 10 = 1 THEN 5 ELSE 10 END = 0;
"""
TABLES = (
    "geneva_drive_workflows",
    "geneva_drive_step_executions",
    "geneva_drive_signals",
    "geneva_drive_operator_actions",
)


def fill(server: Any, database: str, n: int, per: int) -> dict[str, float]:
    """Load ``n`` workflows and ``n * per`` executions; seconds per phase."""
    import psycopg

    timings: dict[str, float] = {}
    params = {
        "n": n,
        "per": per,
        # An hour before NOW - n * EVERY: every stamp the fill derives from a workflow's
        # creation (its finish an hour later, its executions minutes later) is then at or
        # before NOW — none in the future of the stats' "now".
        "base": (NOW - n * EVERY - timedelta(hours=1)).replace(tzinfo=None),
        "step": EVERY,
        "k": max(2, n // LIVE),
        "far": (NOW + timedelta(days=365)).replace(tzinfo=None),
    }
    dsn = server.url(database, driver="postgresql")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '512MB'")
        conn.execute("SET session_replication_role = replica")  # no FK checks while loading
        indexes = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = ANY(%s) "
            "AND indexname NOT LIKE 'pk_%%'",
            (list(TABLES),),
        ).fetchall()
        for name, _ in indexes:
            conn.execute(f'DROP INDEX "{name}"')
        for label, sql in (
            ("workflows", FILL_WORKFLOWS),
            ("executions", FILL_EXECUTIONS),
            ("signals+actions", FILL_SIDES),
        ):
            t0 = time.perf_counter()
            with conn.transaction():
                for statement in sql.split(";\n"):
                    if statement.strip():
                        conn.execute(statement, params)
            timings[label] = time.perf_counter() - t0
            log(f"  {label}: {timings[label]:.1f} s")
        t0 = time.perf_counter()
        for _, definition in indexes:
            conn.execute(definition)
        timings["indexes"] = time.perf_counter() - t0
        for table in TABLES:
            conn.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                f"(SELECT coalesce(max(id), 1) FROM {table}))"
            )
        t0 = time.perf_counter()
        conn.execute("VACUUM ANALYZE")
        timings["vacuum_analyze"] = time.perf_counter() - t0
    return timings


# -- timing and plans ------------------------------------------------------------------------


def timed(call: Callable[[], Any], repeat: int) -> dict[str, float | None]:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1000)
    return {
        "p50_ms": round(percentile(samples, 50) or 0, 2),
        "p95_ms": round(percentile(samples, 95) or 0, 2),
    }


def plans(engine: Any, call: Callable[[], Any]) -> list[str]:
    """The plan of each SELECT ``call`` sends, as the server runs it once prepared."""
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            sent.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        call()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return [_plan(engine, sql, params) for sql, params in sent]


def _plan(engine: Any, statement: str, parameters: dict[str, Any]) -> str:
    import psycopg

    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    prepared = re.sub(r"%\((\w+)\)s", number, statement)
    raw = engine.raw_connection()
    try:
        cursor = psycopg.ClientCursor(raw.driver_connection)
        cursor.execute(f"PREPARE gd_bench AS {prepared}")
        arguments = f"({', '.join(['%s'] * len(names))})" if names else ""
        values = [parameters[n] for n in names]
        for _ in range(6):
            cursor.execute(f"EXECUTE gd_bench{arguments}", values)
        cursor.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) EXECUTE gd_bench{arguments}", values
        )
        plan = "\n".join(str(row[0]) for row in cursor.fetchall())
        cursor.execute("DEALLOCATE gd_bench")
        return plan
    finally:
        raw.rollback()
        raw.close()


def _summary(plan_texts: list[str]) -> list[str]:
    """The plan lines that name a scan or a sort, per statement (the full plans are long)."""
    out = []
    for plan in plan_texts:
        lines = [
            line.strip()
            for line in plan.splitlines()
            if re.search(r"Scan|Sort|Limit|Execution Time", line)
        ]
        out.append(" | ".join(lines))
    return out


# -- one size --------------------------------------------------------------------------------


def filters(n: int) -> dict[str, WorkflowFilter]:
    middle = NOW - n * EVERY / 2
    return {
        "none": WorkflowFilter(),
        "state=paused": WorkflowFilter(state="paused"),
        "state=finished": WorkflowFilter(state="finished"),
        "type": WorkflowFilter(workflow_type="BenchOrder"),
        "type+state": WorkflowFilter(workflow_type="BenchOrder", state="ready"),
        "hero": WorkflowFilter(hero_type="Customer", hero_id="500"),
        "step": WorkflowFilter(current_step="step_4"),
        # Every paused workflow's id is even at 100k and 1M (k * 5 * j): all RuntimeError.
        "error_class": WorkflowFilter(error_class="RuntimeError"),
        "awaiting_signal": WorkflowFilter(awaiting_signal="approved"),
        "awaiting_any": WorkflowFilter(awaiting_signal="*"),  # the dashboard's waiting page
        "has_failed": WorkflowFilter(has_failed_execution=True),
        "created_range": WorkflowFilter(
            created_after=middle - timedelta(hours=1), created_before=middle
        ),
        "transitioned_range": WorkflowFilter(transitioned_after=middle),
    }


def measure(engine: Any, n: int, repeat: int) -> None:
    deep = encode_cursor(NOW - n * EVERY / 2, n // 2, True)  # the middle of the history
    named = filters(n)
    rows: list[dict[str, Any]] = []
    with Session(engine) as session:
        for name, where in named.items():
            for depth, after in (("first", None), ("deep", deep)):
                call = _finder(session, where, after)
                page = call()
                result = {"what": f"find {depth}", "filter": name, "items": len(page.items)}
                result |= timed(call, repeat)
                result["plan"] = _summary(plans(engine, call))[0]
                rows.append(result)
                session.rollback()
        for name in ("none", "state=paused"):
            call = _counter(session, named[name])
            rows.append(
                {"what": "count", "filter": name, "value": str(call())}
                | timed(call, repeat)
                | {"plan": _summary(plans(engine, call))[0]}
            )
            session.rollback()
        ids = [random.Random(i).randint(1, n) for i in range(repeat)]
        picks = iter(ids * 3)
        rows.append(
            {"what": "show", "executions": len(admin.show(session, ids[0]).executions)}
            | timed(lambda: admin.show(session, next(picks)), repeat)
            | {"plan": _summary(plans(engine, lambda: admin.show(session, ids[0])))}
        )
        session.rollback()
        rows.append(
            {"what": "stats"}
            | timed(lambda: admin.stats(session, now=NOW), repeat)
            | {"plan": _summary(plans(engine, lambda: admin.stats(session, now=NOW)))}
        )
        session.rollback()
    for row in rows:
        emit(size=n, **row)
        log(
            f"  {row['what']:<11} {row.get('filter', ''):<18} p50 {row['p50_ms']:>8} ms  "
            f"p95 {row['p95_ms']:>8} ms"
        )
    t0 = time.perf_counter()
    ongoing = WorkflowFilter(state=("ready", "performing", "paused"))  # the paused: refused
    result = admin.bulk(sessionmaker(engine), "pause", ongoing, actor="bench")
    seconds = time.perf_counter() - t0
    emit(
        size=n,
        what="bulk pause",
        matched=result.matched,
        changed=len(result.changed),
        refused=len(result.refused),
        seconds=round(seconds, 2),
        ms_per_workflow=round(seconds * 1000 / max(1, result.matched), 3),
    )
    log(f"  bulk pause  {result.matched} matched in {seconds:.1f} s")


def _finder(session: Session, where: WorkflowFilter, after: str | None) -> Callable[[], Any]:
    return lambda: admin.find(session, where, limit=50, after=after)


def _counter(session: Session, where: WorkflowFilter) -> Callable[[], Any]:
    return lambda: admin.count(session, where)


def filled_databases(
    sizes: str, executions_per: int, server_args: Any
) -> Iterator[tuple[Any, int]]:
    """For each of the comma-separated ``sizes``: a fresh database filled with that many
    workflows on a private PostgreSQL (``--server``), configured; dropped when the caller
    moves on."""
    server = start_server(server_args, "async")
    try:
        for n in (int(size) for size in sizes.split(",")):
            name, url = server.create_database()
            engine = geneva_drive.create_engine(url)
            geneva_drive.install(engine)
            configure(engine=engine)
            log(f"size {n:,} workflows, {n * executions_per:,} executions")
            emit(size=n, what="fill", seconds=fill(server, name, n, executions_per))
            yield engine, n
            engine.dispose()
            server.drop_database(name)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--executions-per", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=30)
    add_server_arguments(parser)
    args = parser.parse_args()
    emit(machine=machine(), server=args.server)
    for engine, n in filled_databases(args.sizes, args.executions_per, args):
        measure(engine, n, args.repeat)


if __name__ == "__main__":
    main()

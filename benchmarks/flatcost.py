"""Flat cost: claim query and housekeeping sweep time with 10k, 100k and 1M execution rows.

    .venv/bin/python benchmarks/flatcost.py --sizes 10000,100000,1000000

For each size, a fresh database is filled in bulk (INSERT … SELECT over a recursive series):
size/3 workflows, three executions each. Almost all are history (finished a day ago, inside
the 30-day retention); ``--old`` of them (100) finished 40 days ago, so the first housekeeping
pass has a little to delete — the steady state of a regularly run housekeeping. A fixed
backlog stays the same at every size: ``--backlog`` (1,000) workflows with a step due now and
as many with a step due tomorrow, the first ``--paused`` (0) of those due now paused (their
rows stay due for ``resume()``, at the head of the queue). The statistics are ANALYZE's, as
autovacuum keeps them. Then, with the scope a worker claims in (its loaded classes):
- the worker's claim (``queries.claim_due_execution``, in a transaction rolled back after),
  on every queue and on one;
- ``queries.next_claimable_due_time`` (the idle worker's sleep query);
- ``geneva_drive.runtime.housekeeping.run()`` passes (cleanup, lease/stuck recovery, gauges): the
  first (untimed) deletes the old rows and its statements are EXPLAINed — with the statistics
  taken while the old rows were there — then the timed passes, with nothing left to delete;
each repeated, median and p99 in ms, plus EXPLAIN of every statement they issue. The pass also
reports the statements it issues and the client's CPU ms (``time.process_time``), which the
other processes on the machine do not disturb. ``--parts housekeeping`` skips the claim.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from geneva_drive.storage.db import session_factory

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _gd
import gd_app  # noqa: F401  the workflow classes a worker of this benchmark loads
from _common import emit, log, machine, percentile, start_postgres
from sqlalchemy import DateTime, bindparam, event, text
from sqlalchemy.orm import Session

from geneva_drive.runtime.loaded import claim_scope
from geneva_drive.storage import queries

BACKLOG = 1000  # due now; as many again due tomorrow

FILL = """
INSERT INTO geneva_drive_workflows
  (id, type, state, allow_multiple, current_step_name, next_step_name, started_at,
   transitioned_at, created_at, updated_at)
WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :workflows)
SELECT i, 'BenchThreeSteps',
       CASE WHEN i > :workflows - :ongoing THEN 'ready' ELSE 'finished' END,
       true, 'three', NULL, :past, CASE WHEN i <= :old THEN :long_ago ELSE :past END,
       :past, :past
FROM s
"""

FILL_EXECUTIONS = """
INSERT INTO geneva_drive_step_executions
  (id, workflow_id, step_name, state, outcome, scheduled_for, started_at, completed_at,
   finished_at, queue, priority, created_at, updated_at)
WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :executions)
SELECT i, FLOOR((i - 1) / 3) + 1,
       CASE (i - 1) % 3 WHEN 0 THEN 'one' WHEN 1 THEN 'two' ELSE 'three' END,
       CASE WHEN (i - 1) % 3 = 2 AND FLOOR((i - 1) / 3) + 1 > :workflows - :ongoing
            THEN 'scheduled' ELSE 'completed' END,
       CASE WHEN (i - 1) % 3 = 2 AND FLOOR((i - 1) / 3) + 1 > :workflows - :ongoing
            THEN NULL ELSE 'success' END,
       CASE WHEN (i - 1) % 3 = 2 AND FLOOR((i - 1) / 3) + 1 > :workflows - :half_ongoing
            THEN :future ELSE :past END,
       CASE WHEN (i - 1) % 3 = 2 AND FLOOR((i - 1) / 3) + 1 > :workflows - :ongoing
            THEN NULL ELSE :past END,
       CASE WHEN (i - 1) % 3 = 2 AND FLOOR((i - 1) / 3) + 1 > :workflows - :ongoing
            THEN NULL ELSE :past END,
       CASE WHEN (i - 1) % 3 = 2 AND FLOOR((i - 1) / 3) + 1 > :workflows - :ongoing
            THEN NULL ELSE :past END,
       'default', 0, :past, :past
FROM s
"""


def fill(  # type: ignore[no-untyped-def]
    engine,
    size: int,
    dialect: str,
    *,
    age_days: float = 1,
    ongoing: int = 2 * BACKLOG,
    old: int = 0,
    paused: int = 0,
) -> float:
    """Insert size/3 workflows with three executions each; ``ongoing`` of them not finished
    (the first half of those due now, the rest tomorrow), the first ``paused`` of them paused,
    the first ``old`` finished 40 days ago (past the 30-day retention)."""
    workflows = size // 3
    now = datetime.now(UTC).replace(tzinfo=None)
    params = {
        "workflows": workflows,
        "executions": workflows * 3,
        "ongoing": ongoing,
        "half_ongoing": ongoing // 2,
        "old": old,
        "past": now - timedelta(days=age_days),
        "long_ago": now - timedelta(days=40),
        "future": now + timedelta(days=1),
    }
    typed = [bindparam(name, type_=DateTime) for name in ("past", "future", "long_ago")]
    t0 = time.perf_counter()
    with engine.begin() as conn:
        if dialect == "mariadb":  # the recursive series is one row per iteration
            conn.execute(text("SET SESSION max_recursive_iterations = 100000000"))
        conn.execute(text(FILL).bindparams(typed[0], typed[2]), params)
        conn.execute(text(FILL_EXECUTIONS).bindparams(typed[0], typed[1]), params)
        if dialect == "postgresql":
            for table, column in (
                ("geneva_drive_workflows", "id"),
                ("geneva_drive_step_executions", "id"),
            ):
                conn.execute(
                    text(
                        f"SELECT setval(pg_get_serial_sequence('{table}', '{column}'), "
                        f"(SELECT max({column}) FROM {table}))"
                    )
                )
    if paused:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE geneva_drive_workflows SET state = 'paused' "
                    "WHERE id > :first AND id <= :first + :paused"
                ),
                {"first": workflows - ongoing, "paused": min(paused, ongoing // 2)},
            )
    with engine.begin() as conn:
        if dialect == "mariadb":
            for table in ("geneva_drive_workflows", "geneva_drive_step_executions"):
                conn.execute(text(f"ANALYZE TABLE {table}"))
        else:
            conn.execute(text("ANALYZE"))
    return time.perf_counter() - t0


class Recorder:
    """Collects the statements a block issues, to EXPLAIN them afterwards, and counts them."""

    def __init__(self, engine) -> None:  # type: ignore[no-untyped-def]
        self.engine = engine
        self.statements: list[tuple[str, object]] = []
        self.count = 0
        self.ms: dict[str, float] = {}  # the first 60 characters of a statement → total ms
        self._started = 0.0

    def __enter__(self) -> Recorder:
        event.listen(self.engine, "before_cursor_execute", self._record)
        event.listen(self.engine, "after_cursor_execute", self._done)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._record)
        event.remove(self.engine, "after_cursor_execute", self._done)

    def _done(self, conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        key = " ".join(statement.split())[:60]
        self.ms[key] = self.ms.get(key, 0.0) + (time.perf_counter() - self._started) * 1000

    def _record(self, conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        self.count += 1
        self._started = time.perf_counter()
        head = statement.lstrip().split(None, 1)[0].upper()
        if head not in {"SELECT", "UPDATE", "DELETE", "WITH"} or "pg_try_advisory" in statement:
            return
        if (statement, repr(parameters)) not in {(s, repr(p)) for s, p in self.statements}:
            self.statements.append((statement, parameters))


def explain(engine, statements: list[tuple[str, object]], dialect: str) -> list[dict]:  # type: ignore[no-untyped-def]
    plans = []
    prefix = "EXPLAIN QUERY PLAN " if dialect == "sqlite" else "EXPLAIN "
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        for statement, parameters in statements:
            try:
                cur.execute(prefix + statement, parameters)
                rows = cur.fetchall()
            except Exception as error:  # a statement EXPLAIN cannot take: say so, go on
                raw.rollback()
                plans.append({"sql": " ".join(statement.split())[:300], "error": str(error)})
                continue
            plan = [_plan_line(r, dialect) for r in rows]
            plans.append(
                {
                    "sql": " ".join(statement.split())[:300],
                    "plan": plan,
                    "seq_scans": sorted(
                        {
                            line.split(" on ", 1)[1].split()[0] if " on " in line else line
                            for line in plan
                            if "Seq Scan on geneva_drive_" in line
                            or line.strip().startswith("SCAN geneva_drive_")
                            or (" type=ALL " in line and "<derived" not in line)
                        }
                    ),
                }
            )
        raw.rollback()
    finally:
        raw.close()
    return plans


def _plan_line(row, dialect: str) -> str:  # type: ignore[no-untyped-def]
    if dialect == "postgresql":
        return str(row[0])
    if dialect == "sqlite":
        return str(row[-1])
    # MariaDB: id, select_type, table, type, possible_keys, key, key_len, ref, rows, Extra
    return f"{row[1]} {row[2]} type={row[3]} key={row[5]} rows={row[8]} {row[9] or ''}"


def timed(fn, repeat: int) -> dict:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return {
        "n": repeat,
        "p50_ms": round(percentile(times, 50) or 0, 3),
        "p99_ms": round(percentile(times, 99) or 0, 3),
    }


def measure(
    url: str,
    size: int,
    dialect: str,
    repeat: int,
    hk_repeat: int,
    parts: set[str],
    old: int,
    backlog: int = BACKLOG,
    paused: int = 0,
) -> dict:
    engine, config = _gd.prepare(url)
    log(f"flatcost: filling {size} executions")
    fill_s = fill(engine, size, dialect, old=old, ongoing=2 * backlog, paused=paused)
    factory = session_factory(config)
    now = datetime.now(UTC)
    every_queue, one_queue = claim_scope(None), claim_scope(["default"])

    def claim() -> None:
        with factory() as session, session.begin():
            found = queries.claim_due_execution(session, now, every_queue)
            assert found is not None, "the backlog should have a due row"
            session.rollback()

    def claim_queue() -> None:
        with factory() as session, session.begin():
            assert queries.claim_due_execution(session, now, one_queue) is not None
            session.rollback()

    def next_due() -> None:
        with factory() as session:
            queries.next_claimable_due_time(session, every_queue)

    result: dict = {
        "bench": "flatcost",
        "backend": dialect,
        "executions": size,
        "backlog": backlog,
        "paused": paused,
    }
    result["fill_s"] = round(fill_s, 1)
    if "claim" in parts:
        for name, fn in (
            ("claim", claim),
            ("claim_one_queue", claim_queue),
            ("next_due", next_due),
        ):
            fn()  # warm the statement cache and the buffers
            result[name] = timed(fn, repeat)
        with Recorder(engine) as rec:
            claim()
            claim_queue()
            next_due()
        result["explain_worker"] = explain(engine, rec.statements, dialect)

    if "housekeeping" in parts:
        from geneva_drive.runtime import housekeeping

        # The first pass deletes the `old` rows; EXPLAIN its statements (the statistics still
        # describe a table with a few old rows), then time passes with nothing to delete.
        with Recorder(engine) as rec:
            first = housekeeping.run(config)
        result["explain_housekeeping"] = explain(engine, rec.statements, dialect)
        result["housekeeping"] = timed(lambda: housekeeping.run(config), hk_repeat)
        result["housekeeping"]["first_pass"] = first
        with Recorder(engine) as rec:
            cpu0 = time.process_time()
            housekeeping.run(config)
            cpu = time.process_time() - cpu0
        result["housekeeping"]["statements_per_pass"] = rec.count
        result["housekeeping"]["client_cpu_ms_per_pass"] = round(cpu * 1000, 2)
        result["housekeeping"]["statement_ms"] = {k: round(v, 2) for k, v in rec.ms.items()}
    with Session(engine) as session:
        result["rows"] = session.execute(
            text("SELECT count(*) FROM geneva_drive_step_executions")
        ).scalar_one()
    engine.dispose()
    return result


def _mariadb_server():  # type: ignore[no-untyped-def]
    """The test suite's private MariaDB server (Debian's mariadb-server binaries)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.support.mariadb import MariaDBServer, unique_database_name

    return MariaDBServer.start(), unique_database_name


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument(
        "--backend", choices=["postgresql", "sqlite", "mariadb"], default="postgresql"
    )
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--housekeeping-repeat", type=int, default=5)
    parser.add_argument(
        "--parts", default="claim,housekeeping", help="comma-separated: claim, housekeeping"
    )
    parser.add_argument(
        "--old", type=int, default=100, help="workflows past the retention at the start"
    )
    parser.add_argument(
        "--backlog", type=int, default=BACKLOG, help="workflows due now (and as many tomorrow)"
    )
    parser.add_argument(
        "--paused", type=int, default=0, help="of those due now, paused at the head of the queue"
    )
    parser.add_argument("--durability", choices=["durable", "async"], default="async")
    parser.add_argument("--explain", action="store_true", help="print the full plans")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    sizes = [int(s) for s in args.sizes.split(",")]
    if 3 * 2 * args.backlog > min(sizes):
        parser.error(
            f"--backlog {args.backlog} needs {2 * args.backlog} ongoing workflows, three "
            f"executions each: every --sizes must be at least {6 * args.backlog}"
        )
    server = start_postgres(args.durability) if args.backend == "postgresql" else None
    mariadb = _mariadb_server() if args.backend == "mariadb" else None
    results = []
    try:
        emit(bench="machine", **machine())
        for size in sizes:
            name = None
            if server is not None:
                name, url = server.create_database("flat")
            elif mariadb is not None:
                url = mariadb[0].create_database(mariadb[1]("flat"))
            else:
                url = _gd.sqlite_url(Path(tempfile.mkdtemp(prefix="gd-bench-sqlite-")))
            result = measure(
                url,
                size,
                args.backend,
                args.repeat,
                args.housekeeping_repeat,
                parts,
                args.old,
                args.backlog,
                args.paused,
            )
            if not args.explain:
                for key in ("explain_worker", "explain_housekeeping"):
                    for plan in result.get(key, []):
                        plan["plan"] = [
                            line.strip()
                            for line in plan.get("plan", [])
                            if "Scan" in line
                            or "SCAN" in line
                            or "SEARCH" in line
                            or " type=" in line
                        ]
            emit(**result)
            results.append(result)
            if server is not None and name is not None:
                server.drop_database(name)
    finally:
        if server is not None:
            server.stop()
        if mariadb is not None:
            mariadb[0].stop()
    return results


if __name__ == "__main__":
    main()

"""Housekeeping's cost stays flat: every statement of a pass reads our tables through an index.

A pass runs every few minutes for the life of the application while the finished history
grows to millions of rows, so a statement that scans a whole table is a pass that gets slower
every day. These tests seed a history that dwarfs the work in flight (a few thousand finished
workflows, a handful ongoing, a few past the retention), refresh the planner's statistics,
record the statements of one pass and EXPLAIN each of them on the backend under test.

(``benchmarks/flatcost.py`` measures the same at 10k, 100k and 1M rows; tests never time.)
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from sqlalchemy import event, insert, text

from geneva_drive import Signal, StepExecution, Workflow
from geneva_drive.runtime import housekeeping
from geneva_drive.storage.models import WHERE_INFO_KEY, FairKey
from tests.worker._support import table_of
from tests.worker.test_housekeeping import HousekeepingTwoSteps

HISTORY = 3000  # finished workflows inside the retention, each with two executions and a signal
OLD = 20  # past the retention: the first pass deletes them
FIRST_ID = 1_000_000
OUR_TABLES = ("geneva_drive_workflows", "geneva_drive_step_executions", "geneva_drive_signals")


def _seed_history(session: Any, now: Any) -> None:
    recent, old = now - timedelta(days=1), now - timedelta(days=40)
    rows = [
        {
            "id": FIRST_ID + n,
            "type": "HousekeepingPlansHistory",
            "state": "finished" if n % 4 else "canceled",
            "allow_multiple": True,
            "transitioned_at": old if n < OLD else recent,
            "created_at": old,
            "updated_at": old,
        }
        for n in range(HISTORY + OLD)
    ]
    session.execute(insert(table_of(Workflow)), rows)
    session.execute(
        insert(table_of(StepExecution)),
        [
            {
                "workflow_id": row["id"],
                "step_name": name,
                "state": "completed",
                "outcome": "success",
                "scheduled_for": old,
                "queue": "default",
                "priority": 0,
                "created_at": old,
                "updated_at": old,
            }
            for row in rows
            for name in ("first", "second")
        ],
    )
    session.execute(
        insert(table_of(Signal)),
        [
            {
                "workflow_id": row["id"],
                "name": "ping",
                "state": "consumed",
                "claimed": 0,
                "consumed": 0,
                "created_at": old,
                "updated_at": old,
            }
            for row in rows
        ],
    )
    for _ in range(3):  # work in flight: ready, and one paused
        HousekeepingTwoSteps.create(session, allow_multiple=True)
    # A fairness key no workflow has any more: the pass prunes it (queries.fairness).
    session.execute(insert(FairKey), [{"key": "gone.example", "served_at": old}])
    session.commit()


def _analyze(engine: Any) -> None:
    with engine.begin() as conn:
        if engine.dialect.name in ("mysql", "mariadb"):
            for table in OUR_TABLES:
                conn.execute(text(f"ANALYZE TABLE {table}"))
        else:
            conn.execute(text("ANALYZE"))


def _record_pass(gd: Any) -> tuple[dict[str, int], list[tuple[str, Any]]]:
    statements: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_args: Any) -> None:
        head = statement.lstrip().split(None, 1)[0].upper()
        if head in ("SELECT", "DELETE", "WITH") and any(t in statement for t in OUR_TABLES):
            statements.append((statement, parameters))

    event.listen(gd.engine, "before_cursor_execute", record)
    try:
        result = housekeeping.run(gd)
    finally:
        event.remove(gd.engine, "before_cursor_execute", record)
    return result, statements


def _full_scans(engine: Any, statement: str, parameters: Any) -> list[str]:
    """The plan lines that read one of our tables in full (empty: index access only)."""
    dialect = engine.dialect.name
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        if dialect == "postgresql":
            # On a few thousand rows a sequential scan is honestly the cheaper plan; what
            # matters at a million is that an index path *exists*. With sequential scans
            # priced out, PostgreSQL still picks one when nothing else can answer.
            cursor.execute("SET LOCAL enable_seqscan = off")
        if dialect == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + statement, parameters)
            lines = [str(row[-1]) for row in cursor.fetchall()]
            return [
                line
                for line in lines
                if line.startswith(tuple(f"SCAN {t}" for t in OUR_TABLES))
                and not any(line.endswith(f"INDEX {name}") for name in PARTIAL_INDEXES)
            ]
        cursor.execute("EXPLAIN " + statement, parameters)
        rows = cursor.fetchall()
        if dialect == "postgresql":
            return _postgres_full_scans([str(row[0]) for row in rows])
        # MariaDB/MySQL: (id, select_type, table, type, possible_keys, key, …). A derived
        # table is the materialised batch itself; ALL (or a full `index` scan) of a base
        # table is a full read.
        return [
            f"{row[2]} type={row[3]} key={row[5]}"
            for row in rows
            if row[2] in OUR_TABLES and row[3] in ("ALL", "index")
        ]
    finally:
        raw.rollback()
        raw.close()


# Partial indexes hold the rows of one state only (the waiting ones, the scheduled ones…), not
# the history: reading one whole is what they are for (the waiting gauges count them all).
PARTIAL_INDEXES = {
    index.name
    for table in (Workflow.__table__, StepExecution.__table__)
    for index in table.indexes  # type: ignore[attr-defined]
    if WHERE_INFO_KEY in index.info
}


def _postgres_full_scans(lines: list[str]) -> list[str]:
    """Sequential scans, and index scans that read a whole non-partial index (no ``Index Cond``)."""
    found = []
    for n, line in enumerate(lines):
        if not any(f" on {table}" in line for table in OUR_TABLES):
            continue
        if "Seq Scan" in line:
            found.append(line.strip())
        elif ("Index Scan" in line or "Index Only Scan" in line) and not any(
            f"using {name} on" in line for name in PARTIAL_INDEXES
        ):
            details = []
            for following in lines[n + 1 :]:
                if "->" in following:
                    break
                details.append(following)
            if not any("Index Cond" in detail for detail in details):
                found.append(line.strip())
    return found


def test_every_statement_of_a_pass_reads_the_history_through_an_index(gd, session, clock):
    _seed_history(session, clock.now())
    paused = HousekeepingTwoSteps.create(session, allow_multiple=True)
    session.commit()
    paused.pause()
    session.commit()
    _analyze(gd.engine)

    result, statements = _record_pass(gd)

    assert result["workflows_cleaned_up"] == OLD  # the cleanup statements had work to do
    kinds = {" ".join(s.split())[:40] for s, _ in statements}
    assert len(kinds) >= 6, kinds  # 3 deletes, leases, stuck, gauges (+ waiting counts)
    scans = {
        " ".join(statement.split())[:120]: found
        for statement, parameters in statements
        if (found := _full_scans(gd.engine, statement, parameters))
    }
    import json

    print(json.dumps(scans, indent=1))
    assert scans == {}


def test_the_gauges_count_ongoing_workflows_through_the_state_index(gd, session, clock):
    # The gem's GROUP BY over every row could not use an index; the ongoing states and the
    # recent terminal ones are ranges of (state, transitioned_at).
    _seed_history(session, clock.now())
    _analyze(gd.engine)
    statements: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_args: Any) -> None:
        statements.append((statement, parameters))

    event.listen(gd.engine, "before_cursor_execute", record)
    try:
        values = housekeeping.gauges(gd)
    finally:
        event.remove(gd.engine, "before_cursor_execute", record)

    counted = [(s, p) for s, p in statements if "count(" in s and "GROUP BY" in s.upper()]
    by_state = [(s, p) for s, p in counted if "transitioned_at" in s]
    assert len(by_state) == 1
    assert _full_scans(gd.engine, *by_state[0]) == []
    gauges = {(name, tuple(tags.items())): value for name, value, tags in values}
    assert gauges[("geneva_drive.ready", ())] == 3
    assert ("geneva_drive.finished_last_hour", ()) not in gauges  # the history is a day old


def test_a_cleanup_in_small_batches_deletes_exactly_the_old_rows(gd, session, clock):
    # The MySQL/MariaDB form of the batched delete (a join on the materialised batch) deletes
    # the same rows as the IN form elsewhere: all of the old, none of the rest.
    _seed_history(session, clock.now())

    result = housekeeping.run(replace(gd, housekeeping_batch_size=7))

    assert result["workflows_cleaned_up"] == OLD
    assert result["step_executions_cleaned_up"] == 2 * OLD
    assert result["signals_cleaned_up"] == OLD
    with gd.engine.connect() as conn:
        left = conn.execute(
            text("SELECT count(*) FROM geneva_drive_workflows WHERE type = :t"),
            {"t": "HousekeepingPlansHistory"},
        ).scalar_one()
        history = conn.execute(
            text(
                "SELECT count(*) FROM geneva_drive_step_executions"
                " WHERE workflow_id >= :id AND workflow_id < :end"
            ),
            {"id": FIRST_ID, "end": FIRST_ID + HISTORY + OLD},
        ).scalar_one()
        signals = conn.execute(text("SELECT count(*) FROM geneva_drive_signals")).scalar_one()
    assert left == HISTORY
    assert history == 2 * HISTORY
    assert signals == HISTORY

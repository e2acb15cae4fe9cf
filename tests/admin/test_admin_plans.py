"""Every admin query reads an index range, never a whole table (EXPLAIN, as the claim tests do).

The tables are filled in bulk with a history that dwarfs the live work — 20,000 workflows, 19
in 20 finished — and analysed, so the planner knows the finished rows outnumber the rest. On
PostgreSQL each statement is planned as it runs once psycopg has prepared it (see
``_postgres_plan``). SQLite has no statistics here (no ANALYZE), as on a fresh application
database.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from sqlalchemy import event, text

from geneva_drive import admin
from geneva_drive.admin import WorkflowFilter

WORKFLOWS = 20_000
WORKFLOW_TABLES = ("geneva_drive_workflows", "geneva_drive_step_executions")

# i % 20: 0 paused after a failure, 1 ready with a step scheduled, 2 ready and waiting, else
# finished. Three executions per workflow; the second one is the interesting one.
_SEED_WORKFLOWS = """
INSERT INTO geneva_drive_workflows
  (id, type, state, hero_type, hero_id, allow_multiple, next_step_name, transitioned_at,
   created_at, updated_at)
WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :n)
SELECT i,
       CASE i % 3 WHEN 0 THEN 'AdminThreeSteps' WHEN 1 THEN 'AdminFlaky' ELSE 'AdminWaits' END,
       CASE i % 20 WHEN 0 THEN 'paused' WHEN 1 THEN 'ready' WHEN 2 THEN 'ready'
            ELSE 'finished' END,
       'Order', CAST(i AS VARCHAR(20)), true,
       CASE i % 20 WHEN 0 THEN 'charge' WHEN 1 THEN 'second' WHEN 2 THEN 'approve' END,
       CASE WHEN i % 20 IN (1, 2) THEN NULL ELSE {at} END, {at}, {at}
FROM s
"""
_SEED_EXECUTIONS = """
INSERT INTO geneva_drive_step_executions
  (id, workflow_id, step_name, state, outcome, scheduled_for, finished_at, error_class_name,
   awaiting_signal, wait_deadline, waiting_since, queue, priority, created_at, updated_at)
WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :n * 3)
SELECT i, w, CASE k WHEN 0 THEN 'first' WHEN 1 THEN 'second' ELSE 'third' END,
       CASE WHEN k <> 1 OR w % 20 > 2 THEN 'completed'
            WHEN w % 20 = 0 THEN 'failed' WHEN w % 20 = 1 THEN 'scheduled' ELSE 'waiting' END,
       CASE WHEN k <> 1 OR w % 20 > 2 THEN 'success' WHEN w % 20 = 0 THEN 'failed' END,
       {at}, CASE WHEN k <> 1 OR w % 20 IN (0, 3) THEN {at} END,
       CASE WHEN k = 1 AND w % 20 = 0 THEN 'RuntimeError' END,
       CASE WHEN k = 1 AND w % 20 = 2 THEN 'approved' END,
       CASE WHEN k = 1 AND w % 20 = 2 THEN {at} END,
       CASE WHEN k = 1 AND w % 20 = 2 THEN {at} END,
       'default', 0, {at}, {at}
FROM (SELECT i, (i - 1) / 3 + 1 AS w, (i - 1) % 3 AS k FROM s) AS rows
"""
# A workflow's rows are all stamped its own second: "the last hour" is a thin slice.
_SEED_SIGNALS = """
INSERT INTO geneva_drive_signals (id, workflow_id, name, state, created_at, updated_at)
WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :n)
SELECT i, i, 'approved', 'consumed', {at}, {at} FROM s
"""
_SEED_ACTIONS = """
INSERT INTO geneva_drive_operator_actions (id, workflow_id, action, actor, at)
WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :n)
SELECT i, i, 'pause', 'ops', {at} FROM s
"""
_AT = {
    "postgresql": "TIMESTAMP '2026-11-01 00:00:00' + {n} * INTERVAL '1 second'",
    "sqlite": "datetime('2026-11-01 00:00:00', '+' || {n} || ' seconds')",
}


def _seed(gd: Any, dialect: str) -> None:
    with gd.engine.begin() as conn:
        seeds = (_SEED_WORKFLOWS, "i"), (_SEED_EXECUTIONS, "w"), (_SEED_SIGNALS, "i")
        for sql, n in (*seeds, (_SEED_ACTIONS, "i")):
            conn.execute(text(sql.format(at=_AT[dialect].format(n=n))), {"n": WORKFLOWS})
        if dialect == "postgresql":
            conn.execute(text("ANALYZE"))


def _statements(gd: Any, call: Callable[[], Any]) -> list[tuple[str, Any]]:
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            sent.append((statement, parameters))

    event.listen(gd.engine, "before_cursor_execute", record)
    try:
        call()
    finally:
        event.remove(gd.engine, "before_cursor_execute", record)
    assert sent, "no statement was sent"
    return sent


def _postgres_plan(gd: Any, statement: str, parameters: dict[str, Any]) -> str:
    """The plan PostgreSQL's plan cache settles on for ``statement`` once it is prepared.

    psycopg prepares a statement on its sixth run; the server then plans the next five with
    the values (custom plans) and from then on uses a generic plan only if that one is not
    dearer. So: PREPARE, EXECUTE six times, then EXPLAIN EXECUTE — what production runs.
    """
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    prepared = re.sub(r"%\((\w+)\)s", number, statement)
    raw = gd.engine.raw_connection()
    try:
        # A client-side cursor writes EXECUTE's arguments in as literals (EXECUTE takes no
        # bound parameters of its own).
        cursor = psycopg.ClientCursor(raw.driver_connection)
        cursor.execute(f"PREPARE gd_admin AS {prepared}")
        arguments = f"({', '.join(['%s'] * len(names))})" if names else ""
        values = [parameters[n] for n in names]
        for _ in range(6):
            cursor.execute(f"EXECUTE gd_admin{arguments}", values)
        cursor.execute(f"EXPLAIN EXECUTE gd_admin{arguments}", values)
        plan = "\n".join(str(row[0]) for row in cursor.fetchall())
        cursor.execute("DEALLOCATE gd_admin")  # the pooled connection lives on
        return plan
    finally:
        raw.rollback()
        raw.close()


def _sqlite_plan(gd: Any, statement: str, parameters: Any) -> str:
    raw = gd.engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("EXPLAIN QUERY PLAN " + statement, parameters)
        return "\n".join(str(row[-1]) for row in cursor.fetchall())
    finally:
        raw.rollback()
        raw.close()


def _plans(gd: Any, db_backend: str, call: Callable[[], Any]) -> list[str]:
    explain = _postgres_plan if db_backend == "postgresql" else _sqlite_plan
    return [explain(gd, sql, params) for sql, params in _statements(gd, call)]


def _no_full_scans(plans: list[str], db_backend: str) -> None:
    for plan in plans:
        for table in WORKFLOW_TABLES:
            if db_backend == "postgresql":
                assert f"Seq Scan on {table}" not in plan, plan
            else:
                assert not re.search(rf"SCAN {table}\b(?! USING)", plan), plan


def _deep_cursor(session: Any, where: WorkflowFilter) -> str | None:
    page = admin.find(session, where, limit=200)
    for _ in range(3):
        if page.next_cursor is None:
            break
        page = admin.find(session, where, limit=200, after=page.next_cursor)
    return page.next_cursor


# (filter, the index the page must be read from: PostgreSQL, SQLite)
PAGES = {
    "no filter": (WorkflowFilter(), "ix_geneva_drive_workflows_created"),
    "state": (WorkflowFilter(state="paused"), "ix_geneva_drive_workflows_state_created"),
    # A third of the rows: read off the creation order, skipping the others, is as good.
    "class": (
        WorkflowFilter(workflow_type="AdminFlaky"),
        "ix_geneva_drive_workflows_(type|created)",
    ),
    "signal": (
        WorkflowFilter(awaiting_signal="approved"),
        "ix_geneva_drive_step_executions_awaiting",
    ),
    # The dashboard's waiting page: every waiting row, a twentieth of the workflows here.
    "any signal": (
        WorkflowFilter(awaiting_signal="*"),
        "ix_geneva_drive_step_executions_(waiting|awaiting)",
    ),
    "error": (WorkflowFilter(error_class="RuntimeError"), "ix_geneva_drive_step_executions_failed"),
    "failed": (WorkflowFilter(has_failed_execution=True), "ix_geneva_drive_step_executions_failed"),
    "hero": (WorkflowFilter(hero_type="Order", hero_id="40"), "ix_geneva_drive_workflows_hero"),
}


# Filters on waiting or failed rows: the page starts from those rows and probes each one's
# workflow by primary key, never walking the workflows by creation time.
DRIVEN = ("signal", "any signal", "error", "failed")


def _driven_from_the_executions(page: str, db_backend: str) -> None:
    if db_backend == "postgresql":
        assert re.search(r"SubPlan.*\n.*Index Scan using pk_geneva_drive_workflows", page), page
        assert not re.search(r"Scan( Backward)? using ix_geneva_drive_workflows_created", page)
    else:
        assert re.search(r"CORRELATED SCALAR SUBQUERY.*\n.*PRIMARY KEY", page), page
        assert "USING INDEX ix_geneva_drive_workflows_created" not in page, page


@pytest.fixture
def seeded(gd: Any, db_backend: str) -> Any:
    if db_backend == "mariadb":
        pytest.skip("the plan assertions are for PostgreSQL and SQLite")
    _seed(gd, db_backend)
    return gd


@pytest.mark.parametrize("name", list(PAGES))
def test_a_page_of_workflows_reads_its_index_in_order_first_and_deep(
    seeded, session, db_backend, name
):
    where, index = PAGES[name]
    cursor = _deep_cursor(session, where)

    first = _plans(seeded, db_backend, lambda: admin.find(session, where))
    deep = _plans(seeded, db_backend, lambda: admin.find(session, where, after=cursor))

    for plans in (first, deep):
        page, waits, errors = plans  # the page, then its waits and last errors by workflow id
        assert re.search(index, page), page
        if name in ("no filter", "state", "class"):  # read in order: no sort of the matches
            assert "Sort" not in page and "TEMP B-TREE" not in page, page
        # By workflow id, or the partial index over the few waiting (failed) rows.
        assert re.search(r"ix_geneva_drive_step_executions_(workflow_\w+|waiting)", waits)
        assert re.search(r"ix_geneva_drive_step_executions_(workflow_\w+|failed)", errors)
        if name in DRIVEN:
            _driven_from_the_executions(page, db_backend)
        _no_full_scans(plans, db_backend)
    if db_backend == "postgresql" and name in ("no filter", "state"):
        # The deep page's scan starts at the cursor, not at the newest row filtering its way
        # down to it (what "(created_at, id) < cursor" written as a bare OR did).
        assert re.search(r"Index Cond: .*created_at <=", deep[0]), deep[0]


@pytest.mark.parametrize("name", DRIVEN)
def test_a_capped_count_of_waiting_or_failed_workflows_starts_from_those_rows(
    seeded, session, db_backend, name
):
    where, index = PAGES[name]
    narrower = replace(where, hero_type="Order")  # a test on the workflow row too

    (alone,) = _plans(seeded, db_backend, lambda: admin.count(session, where, cap=1000))
    (plan,) = _plans(seeded, db_backend, lambda: admin.count(session, narrower, cap=1000))

    # Alone, the candidates are the count (each is a workflow): no workflow is read.
    assert re.search(index, alone), alone
    assert "geneva_drive_workflows" not in alone, alone
    assert re.search(index, plan), plan
    _driven_from_the_executions(plan, db_backend)
    _no_full_scans([alone, plan], db_backend)


def test_a_capped_count_stops_at_its_cap(seeded, session, db_backend):
    plans = _plans(seeded, db_backend, lambda: admin.count(session, cap=1000))

    # Reading any index or the table is fine here: the LIMIT stops it after cap + 1 rows.
    (plan,) = plans
    if db_backend == "postgresql":
        assert re.search(r"Aggregate.*\n.*->  Limit", plan), plan
    else:  # SQLite's plan does not show the LIMIT; the sub-query is its own step
        assert "CO-ROUTINE" in plan or "MATERIALIZE" in plan, plan


def test_show_reads_one_workflows_rows_by_their_workflow_indexes(seeded, session, db_backend):
    plans = _plans(seeded, db_backend, lambda: admin.show(session, 40))

    joined = "\n".join(plans)
    assert "ix_geneva_drive_step_executions_workflow_created" in joined, joined
    assert "ix_geneva_drive_signals_workflow_state" in joined or "signals_dedup" in joined, joined
    assert "ix_geneva_drive_operator_actions_workflow_at" in joined, joined
    _no_full_scans(plans, db_backend)


def test_stats_read_only_the_live_rows_and_the_last_hour(seeded, session, db_backend):
    now = datetime(2026, 11, 1, 6, tzinfo=UTC)  # mid-history: the last hour is a thin slice
    plans = _plans(seeded, db_backend, lambda: admin.stats(session, now=now))

    joined = "\n".join(plans)
    for index in (
        "ix_geneva_drive_workflows_state_transitioned",  # ongoing counts, ended in the last hour
        "ix_geneva_drive_step_executions_finished_at",  # outcomes
        "ix_geneva_drive_step_executions_lease",  # expired leases
    ):
        assert index in joined, joined
    # Overdue by queue: one of the partial indexes over scheduled rows.
    assert re.search(r"ix_geneva_drive_step_executions_(due|scheduled)", joined), joined
    assert re.search(r"ix_geneva_drive_step_executions_(waiting|awaiting)", joined), joined
    _no_full_scans(plans, db_backend)


def test_a_continuation_and_a_signals_executions_are_found_by_their_partial_indexes(
    seeded, session, db_backend
):
    # The two indexes hold only the rows that have a value (migration 0006): a lookup by
    # value must still read them, not every execution.
    from geneva_drive.storage import queries
    from geneva_drive.storage.queries import signals as signal_queries

    successor = _plans(seeded, db_backend, lambda: queries.successor_of(session, 41))
    attached = _plans(
        seeded, db_backend, lambda: signal_queries.executions_attached_to(session, 41)
    )

    assert "ix_geneva_drive_step_executions_continues_from_id" in "\n".join(successor), successor
    assert "ix_geneva_drive_step_executions_signal_id" in "\n".join(attached), attached
    _no_full_scans(successor + attached, db_backend)

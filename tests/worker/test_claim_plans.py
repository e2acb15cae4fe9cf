"""The claim reads the due rows' partial index, on PostgreSQL's generic plans and on SQLite,
and on PostgreSQL costs the same however many rows are due, before ANALYZE or after.

psycopg prepares a statement on its sixth run, and PostgreSQL then keeps one generic plan for
it, made without the parameters' values. A partial index (``WHERE state = 'scheduled'``) is
matched against the query's text, so the claim writes its state into the SQL: with the state
as a parameter, the generic plan sorted every due row for every claim, a cost that grew with
the backlog (measured: 14 ms a claim at 8,000 due workflows, 0.13 ms with the index).
SQLite, which has no statistics before ANALYZE, took ``(state, scheduled_for)`` and sorted
likewise until that index became partial (migration 0004).
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest
from sqlalchemy import event

from geneva_drive.runtime.loaded import claim_scope
from geneva_drive.storage import queries
from geneva_drive.storage.queries import bypass, claims
from geneva_drive.storage.queries.claims import ClaimScope
from tests.worker.apps import WorkerScaleThreeSteps

BACKLOG = 300


def _claim_statement(
    gd: Any, session: Any, clock: Any, scope: Any = ClaimScope()
) -> tuple[str, dict[str, Any]]:
    """The claim's SQL and parameters, as the worker sends them."""
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if "SKIP LOCKED" in statement or "ORDER BY" in statement:
            sent.append((statement, parameters))

    event.listen(gd.engine, "before_cursor_execute", record)
    try:
        with session.begin():
            assert queries.claim_due_execution(session, clock.now(), scope) is not None
            session.rollback()
    finally:
        event.remove(gd.engine, "before_cursor_execute", record)
    assert sent, "no claim was sent"
    return sent[0]  # MariaDB: its candidates; it then locks their workflow rows one by one


def _generic_plan(
    gd: Any, statement: str, parameters: dict[str, Any], *, options: str = ""
) -> list[Any]:
    """EXPLAIN of the statement prepared on the server, planned as a prepared one is later
    (``options``: EXPLAIN's, e.g. ``ANALYZE, BUFFERS, FORMAT JSON``; ANALYZE runs it, in a
    transaction rolled back after)."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    prepared = re.sub(r"%\((\w+)\)s", number, statement)
    raw = gd.engine.raw_connection()
    try:
        # A client-side cursor writes EXECUTE's arguments in as literals (EXPLAIN EXECUTE
        # takes no bound parameters of its own).
        cursor = psycopg.ClientCursor(raw.driver_connection)
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE gd_claim AS {prepared}")
        arguments = ", ".join(["%s"] * len(names))
        explain = f"EXPLAIN ({options})" if options else "EXPLAIN"
        cursor.execute(f"{explain} EXECUTE gd_claim({arguments})", [parameters[n] for n in names])
        return [row[0] if options else str(row[0]) for row in cursor.fetchall()]
    finally:
        raw.rollback()
        # Back in the pool, the connection would keep the prepared statement and the setting.
        raw.invalidate()
        raw.close()


@pytest.mark.parametrize("scoped", [False, True], ids=["every class", "loaded classes"])
def test_the_claims_generic_plan_reads_the_first_due_row_of_the_partial_index(
    gd, session, clock, db_backend, scoped
):
    # A sudden backlog on tables not analysed since (as the benchmarks start). After ANALYZE
    # the same plan is chosen from 2,000 due rows; below that a sort is honestly cheaper.
    # "loaded classes": the worker's claim, filtered to the workflow and hero classes it has.
    for _ in range(BACKLOG):
        WorkerScaleThreeSteps.create(session)
    session.commit()

    scope = claim_scope(None) if scoped else ClaimScope()
    statement, parameters = _claim_statement(gd, session, clock, scope)

    # Every backend gets the state as a literal (MariaDB has no partial index, and uses its
    # (state, …) form either way).
    assert re.search(r"\.state = 'scheduled'", statement), statement
    if db_backend == "postgresql":
        plan = _generic_plan(gd, statement, parameters)
        assert any("ix_geneva_drive_step_executions_due_any" in line for line in plan), plan
        assert not any("Sort" in line for line in plan), plan  # no sort of every due row
    elif db_backend == "sqlite":
        plan = _sqlite_plan(gd, statement, parameters)
        assert any("USING INDEX ix_geneva_drive_step_executions_due_any" in p for p in plan), plan
        assert not any("TEMP B-TREE" in line for line in plan), plan


def _next_due_statement(gd: Any, session: Any) -> tuple[str, dict[str, Any]]:
    """The idle worker's look for the next due time, as the worker sends it."""
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        sent.append((statement, parameters))

    event.listen(gd.engine, "before_cursor_execute", record)
    try:
        with session.begin():
            queries.next_claimable_due_time(session, claim_scope(None))
            session.rollback()
    finally:
        event.remove(gd.engine, "before_cursor_execute", record)
    (found,) = [(s, p) for s, p in sent if "scheduled_for" in s]
    return found


def _buffers(gd: Any, statement: str, parameters: dict[str, Any]) -> int:
    """Shared buffers ``statement`` touches, run once on its generic plan."""
    (plan,) = _generic_plan(gd, statement, parameters, options="ANALYZE, BUFFERS, FORMAT JSON")[0]
    top = plan["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


def _analysed_backlog(gd: Any, session: Any, count: int) -> None:
    WorkerScaleThreeSteps.create_many(session, count=count)
    session.commit()
    with gd.engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")  # what autovacuum does within a minute


@pytest.mark.parametrize("query", ["claim", "next due time"])
def test_on_analysed_tables_the_workers_queries_cost_the_same_at_300_and_3000_due_rows(
    gd, session, clock, db_backend, query
):
    # Once ANALYZE had run, the planner guessed that almost no workflow passes the conditions
    # on the workflow row, and read every ready workflow for each claim: 606 buffers at 300
    # due rows, 6,027 at 2,000, and as many for the idle worker's next due time. Both now try
    # the first scheduled rows first (claims.first_in_order).
    if db_backend != "postgresql":
        pytest.skip(
            "the window is PostgreSQL's (MariaDB reads candidates first; SQLite never "
            "analyses by itself)"
        )

    def buffers() -> int:
        if query == "claim":
            return _buffers(gd, *_claim_statement(gd, session, clock, claim_scope(None)))
        return _buffers(gd, *_next_due_statement(gd, session))

    _analysed_backlog(gd, session, 300)
    small = buffers()
    _analysed_backlog(gd, session, 2700)
    large = buffers()

    assert large <= 2 * small, (small, large)
    assert small < 100, small  # a window of rows found by key, not a pass over the tables


def test_the_claim_filtered_to_the_loaded_classes_keeps_the_dbapi_short_path(gd, db_backend):
    # One parameter per class name, not an expanding IN (which is rendered per execution and
    # so would send every worker claim through SQLAlchemy's slower path).
    scope = claim_scope(None)
    stmt = claims._claim_stmt(by_id=False, queued=False, candidates_first=False, shape=scope.shape)
    core = claims._core_claim(stmt)
    plan = bypass._plan(core, gd.engine.dialect)
    assert plan is not None
    assert "WorkerScaleThreeSteps" not in plan.sql  # bound, not written in
    assert set(scope.params) <= set(plan.positions or scope.params)


def _sqlite_plan(gd: Any, statement: str, parameters: Any) -> list[str]:
    """SQLite has no statistics before ANALYZE: migration 0004 keeps it off a sorting plan."""
    raw = gd.engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("EXPLAIN QUERY PLAN " + statement, parameters)
        return [str(row[-1]) for row in cursor.fetchall()]
    finally:
        raw.rollback()
        raw.close()


def test_on_a_large_analysed_backlog_the_claim_keeps_its_generic_plan(
    gd, session, clock, db_backend
):
    # PostgreSQL plans a prepared statement five times with its parameters' values, then
    # keeps one generic plan unless that one costs more than the custom ones did (plus an
    # allowance for planning). Knowing `now`, the custom plans expected every scheduled row to
    # be due; the generic plan a third of them, which it sorted in the claim's last window.
    # Past about 5,000 scheduled rows the generic plan lost, and every claim was planned anew:
    # 1.2 ms of the server's CPU each (claims._unseen_by_the_planner). Found in the handover,
    # which held every window until it kept only the first (queries.handover).
    if db_backend != "postgresql":
        pytest.skip("the windows and the plan cache are PostgreSQL's")
    from sqlalchemy.orm import Session

    _analysed_backlog(gd, session, 8000)
    with gd.engine.connect() as connection:
        # One connection, and every claim committed: psycopg forgets what it prepared on a
        # connection at each rollback.
        for _ in range(20):
            with Session(bind=connection) as claiming, claiming.begin():
                assert queries.claim_due_execution(claiming, clock.now(), ClaimScope())
        plans = [
            (int(generic), int(custom))
            for generic, custom in connection.exec_driver_sql(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE strpos(statement, 'first_of_1024') > 0"
            )
        ]
    assert plans, "the claim was not prepared"
    for generic, custom in plans:
        # psycopg prepares it on its sixth run; PostgreSQL then plans it five times with the
        # values, and once for all.
        assert custom <= 5 and generic >= 1, plans

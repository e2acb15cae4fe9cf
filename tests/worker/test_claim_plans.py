"""The claim reads the due rows' partial index, on PostgreSQL's generic plans and on SQLite.

psycopg prepares a statement on its fifth run, and PostgreSQL then keeps one generic plan for
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

from geneva_drive import queries
from geneva_drive.loaded import claim_scope
from geneva_drive.queries import bypass, claims
from geneva_drive.queries.claims import ClaimScope
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


def _generic_plan(gd: Any, statement: str, parameters: dict[str, Any]) -> list[str]:
    """EXPLAIN of the statement prepared on the server, planned as a prepared one is later."""
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
        cursor.execute(f"EXPLAIN EXECUTE gd_claim({arguments})", [parameters[n] for n in names])
        return [str(row[0]) for row in cursor.fetchall()]
    finally:
        raw.rollback()
        raw.close()  # a pooled connection would keep the prepared statement and the setting


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


def test_the_claim_filtered_to_the_loaded_classes_keeps_the_dbapi_short_path(gd, db_backend):
    # One parameter per class name, not an expanding IN (which is rendered per execution and
    # so would send every worker claim through SQLAlchemy's slower path).
    scope = claim_scope(None)
    stmt = claims._claim_stmt(by_id=False, queued=False, mysql=False, shape=scope.shape)
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

"""Classes without a key cost nothing more where a class with a ``fairness_key`` is loaded.

Such a process's claims rotate among the keys only for keyed rows; a class without a key is
claimed and handed over with the very statements of a process that loads no keyed class, and
its claim never walks past keyed rows to find its own.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session

from geneva_drive.engine.executor import RunOptions, claim_and_run
from geneva_drive.runtime.loaded import claim_scope
from geneva_drive.storage import queries
from geneva_drive.storage.queries.claims import ClaimScope
from tests.fairness.apps import FairCharge
from tests.support.app import Account
from tests.worker.apps import WorkerScaleThreeSteps
from tests.worker.test_claim_plans import _buffers, _generic_plan, _sqlite_plan

WORKFLOWS = 6
EXECUTIONS = "geneva_drive_step_executions"
WORKFLOW_TABLE = "geneva_drive_workflows"


def _statements_of_a_backlog(
    gd: Any, session: Session, scope: ClaimScope
) -> tuple[list[str], list[str]]:
    """The statements a chaining worker thread sends to run ``WORKFLOWS`` hero-less
    three-step workflows (the handover's class on PostgreSQL), due a second apart; and
    those of its next claim, which finds nothing due."""
    for _ in range(WORKFLOWS):
        WorkerScaleThreeSteps.create(session)
        gd.clock.advance(seconds=1)
    session.commit()
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        sent.append(statement)

    options = RunOptions(worker_id="w", chain=lambda queue: True)
    event.listen(gd.engine, "before_cursor_execute", record)
    try:
        while True:
            before = len(sent)
            if not claim_and_run(scope, options, gd):
                return sent[:before], sent[before:]
    finally:
        event.remove(gd.engine, "before_cursor_execute", record)


def test_an_unkeyed_class_sends_the_statements_of_a_process_without_a_keyed_class(gd, session):
    scope = claim_scope(None)
    assert scope.fair  # tests.fairness.apps is loaded: this process has keyed classes

    unkeyed_process, unkeyed_idle = _statements_of_a_backlog(
        gd, session, replace(scope, fair=False)
    )
    keyed_process, keyed_idle = _statements_of_a_backlog(gd, session, scope)

    unkeyed = unkeyed_process + unkeyed_idle
    looks = [i for i, s in enumerate(keyed_process + keyed_idle) if "fair_keys" in s]
    assert [s for s in keyed_process + keyed_idle if "fair_keys" not in s] == unkeyed
    # The keys are looked at only by a claim that found no unkeyed row: where the chain
    # ends (SQLite and MariaDB claim in the transaction that finished the last workflow;
    # PostgreSQL's handover found nothing, and claims no more) and in the idle claim after
    # it — at most the key look-up and its unlocked second read, each.
    assert len(looks) <= 4, looks
    # None while the backlog lasts (the last workflow sends fewer than 12 statements).
    assert not any("fair_keys" in s for s in keyed_process[: len(unkeyed_process) - 12]), looks


def _keyed_burst_then_one_unkeyed(gd: Any, session: Session, count: int) -> int:
    """``count`` keyed workflows due first (two tenants), then one without a key; analysed."""
    for tenant in ("a.example", "b.example"):
        heroes = [Account(id=f"{tenant}-{i}", email=f"u@{tenant}") for i in range(count // 2)]
        session.add_all(heroes)
        session.flush()
        FairCharge.create_many(session, heroes=heroes)
    session.commit()
    gd.clock.advance(seconds=1)
    unkeyed = WorkerScaleThreeSteps.create(session).id
    session.commit()
    with gd.engine.begin() as conn:  # what autovacuum does within a minute
        if conn.dialect.name in ("mysql", "mariadb"):
            conn.exec_driver_sql(f"ANALYZE TABLE {EXECUTIONS}, {WORKFLOW_TABLE}")
        else:
            conn.exec_driver_sql("ANALYZE")
    return unkeyed


def _ordinary_claim(gd: Any, session: Session, scope: ClaimScope) -> tuple[int, str, Any]:
    """The ordinary order's claim (the workflow it claims) and its statement as sent."""
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if "ORDER BY" in statement or "SKIP LOCKED" in statement:
            sent.append((statement, parameters))

    event.listen(gd.engine, "before_cursor_execute", record)
    try:
        with session.begin():
            claimed = queries.claim_due_execution(session, gd.clock.now(), scope)
            session.rollback()
    finally:
        event.remove(gd.engine, "before_cursor_execute", record)
    assert claimed is not None
    statement, parameters = sent[0]  # MariaDB: its candidates (then each workflow's lock)
    return claimed[1], statement, parameters


@pytest.mark.parametrize("scoped", [False, True], ids=["every class", "loaded classes"])
def test_the_ordinary_claim_takes_the_unkeyed_row_behind_a_keyed_burst_without_walking_it(
    gd, session, db_backend, scoped
):
    unkeyed = _keyed_burst_then_one_unkeyed(gd, session, 3000)
    scope = claim_scope(None) if scoped else ClaimScope()

    claimed, statement, parameters = _ordinary_claim(gd, session, scope)

    assert claimed == unkeyed  # keyed rows are taken by their keys' turns only
    if db_backend == "postgresql":
        assert _buffers(gd, statement, parameters) < 100
        plan = _generic_plan(gd, statement, parameters)
        assert any("ix_geneva_drive_step_executions_due_any" in line for line in plan), plan
    elif db_backend == "sqlite":
        plan = _sqlite_plan(gd, statement, parameters)
        assert any("USING INDEX ix_geneva_drive_step_executions_due_any" in p for p in plan), plan
        assert not any("TEMP B-TREE" in line for line in plan), plan
    else:  # MariaDB: its (fair_key, state, …) index, NULL keys first, read for one row
        (row,) = [r for r in _mariadb_analyze(gd, statement, parameters) if r[2] == EXECUTIONS]
        assert row[5] == "ix_geneva_drive_step_executions_fair", row
        assert float(row[9]) <= 16, row  # rows read, not the 3,000 keyed ones


def _mariadb_analyze(gd: Any, statement: str, parameters: Any) -> list[Any]:
    """ANALYZE (run, and explained with the rows each step read: ``r_rows``, column 9)."""
    raw = gd.engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("ANALYZE " + statement, parameters)
        return list(cursor.fetchall())
    finally:
        raw.rollback()
        raw.close()

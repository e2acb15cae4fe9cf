"""The fair claim costs the same however many keyed rows are due (PostgreSQL, generic plans
of analysed tables): its key is found by the keys' index and a probe of the key's due rows,
its row by the key's partial index, in claim order."""

from __future__ import annotations

import re
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session

from geneva_drive.runtime.loaded import claim_scope
from geneva_drive.storage.queries.fairness import claim_fairly
from tests.fairness.apps import FairCharge
from tests.support.app import Account
from tests.worker.test_claim_plans import _buffers, _generic_plan, _sqlite_plan


def _fair_statements(gd: Any, session: Session, clock: Any) -> dict[str, tuple[str, Any]]:
    """The fair claim's key look-up and its claim of the key's row, as the worker sends them
    (on PostgreSQL one statement, both: ``queries.fairness._turn_stmt``)."""
    sent: dict[str, tuple[str, Any]] = {}

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if "geneva_drive_fair_keys" in statement and "EXISTS" in statement:
            sent.setdefault("key", (statement, parameters))
            if statement.startswith("WITH k AS"):
                sent.setdefault("row", (statement, parameters))
        elif "fair_keys" not in statement and re.search(r"\.fair_key (>=|=) [%?]", statement):
            sent.setdefault("row", (statement, parameters))

    event.listen(gd.engine, "before_cursor_execute", record)
    try:
        with session.begin():
            for _ in range(2):  # two keys' turns
                assert claim_fairly(session, clock.now(), claim_scope(None)).claimed is not None
            session.rollback()
    finally:
        event.remove(gd.engine, "before_cursor_execute", record)
    return sent


def _analysed_backlog(gd: Any, session: Session, count: int, start: int) -> None:
    for tenant in ("a.example", "b.example"):
        heroes = [Account(id=f"{tenant}-{start + i}", email=f"u@{tenant}") for i in range(count)]
        session.add_all(heroes)
        session.flush()
        FairCharge.create_many(session, heroes=heroes)
    session.commit()
    with gd.engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")  # what autovacuum does within a minute


@pytest.mark.parametrize("statement", ["key", "row"])
def test_the_fair_claims_statements_cost_the_same_at_300_and_3000_due_rows(
    gd, session, clock, db_backend, statement
):
    if db_backend != "postgresql":
        pytest.skip("generic plans and buffer counts are PostgreSQL's")
    _analysed_backlog(gd, session, 150, 0)
    sent = _fair_statements(gd, session, clock)
    small = _buffers(gd, *sent[statement])
    _analysed_backlog(gd, session, 1350, 150)
    sent = _fair_statements(gd, session, clock)
    large = _buffers(gd, *sent[statement])

    assert large <= 2 * small, (small, large)
    assert small < 100, small
    if statement == "row":
        plan = _generic_plan(gd, *sent[statement])
        assert any("ix_geneva_drive_step_executions_fair" in line for line in plan), plan
        # No sort of the key's rows; on PostgreSQL the keys' look-up is in the same
        # statement, and may sort the few keys it found (the "key" statement's cost, above).
        sort_keys = [line for line in plan if "Sort Key:" in line]
        assert all("geneva_drive_fair_keys." in line for line in sort_keys), plan


def test_on_sqlite_the_claim_of_a_keys_row_reads_the_keys_index_in_claim_order(
    gd, session, clock, db_backend
):
    if db_backend != "sqlite":
        pytest.skip("SQLite's own plan (PostgreSQL's: above; MariaDB reads candidates)")
    _analysed_backlog(gd, session, 150, 0)
    statement, parameters = _fair_statements(gd, session, clock)["row"]

    plan = _sqlite_plan(gd, statement, parameters)

    assert any("USING INDEX ix_geneva_drive_step_executions_fair" in p for p in plan), plan
    assert not any("TEMP B-TREE" in line for line in plan), plan

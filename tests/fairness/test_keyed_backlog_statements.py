"""What a keyed backlog costs per step: the statements a step thread sends.

A key's turn on PostgreSQL locks the key served least recently, claims its oldest due row and
stamps the key in one statement (``queries.fairness``), not three — and after a workflow
finishes, in the handover's statement that completes it (``queries.handover``).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import pytest
from sqlalchemy import event, select
from sqlalchemy.orm import Session

from geneva_drive import Workflow, step
from geneva_drive.engine.executor import RunOptions, claim_and_run
from geneva_drive.runtime.loaded import claim_scope
from geneva_drive.storage.models import FairKey
from geneva_drive.storage.queries.fairness import NEVER

TENANT: ContextVar[str] = ContextVar("TENANT", default="a")
WORKFLOWS = 12
KEYS: Any = FairKey.__table__
RAN: list[str] = []  # the key of each step run, in order
CLOCKS: list[Any] = []  # the test's clock: each step moves it on (the stamps then differ)


class HerolessKeyedOne(Workflow):
    may_proceed_without_hero = True
    fairness_key = lambda wf: TENANT.get()  # noqa: E731

    @step
    def one(self) -> None:
        RAN.append(str(self.fair_key))
        for clock in CLOCKS:
            clock.advance(seconds=0.001)


def _statements_per_workflow(
    gd: Any, session: Session, already: int = 0
) -> tuple[float, list[str]]:
    """Two tenants' keyed one-step workflows (``already`` created before), drained by one
    chaining step thread: the statements sent per workflow (the idle claim at the end left
    out), and all of them."""
    for tenant in ("a", "b"):
        token = TENANT.set(tenant)
        try:
            for _ in range(WORKFLOWS // 2):
                HerolessKeyedOne.create(session)
                gd.clock.advance(seconds=1)
        finally:
            TENANT.reset(token)
    session.commit()
    RAN.clear()
    CLOCKS[:] = [gd.clock]
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        sent.append(statement)

    options = RunOptions(worker_id="w", chain=lambda queue: True)
    event.listen(gd.engine, "before_cursor_execute", record)
    try:
        while True:
            before = len(sent)
            if not claim_and_run(claim_scope(None), options, gd):
                return before / (WORKFLOWS + already), sent[:before]
    finally:
        event.remove(gd.engine, "before_cursor_execute", record)
        CLOCKS.clear()


def test_a_keyed_backlog_sends_fewer_statements_per_step_on_postgresql(gd, session, db_backend):
    per_workflow, _ = _statements_per_workflow(gd, session)

    session.commit()  # a new read transaction
    states = session.scalars(select(HerolessKeyedOne.state)).all()
    assert states == ["finished"] * WORKFLOWS
    assert RAN == ["a", "b"] * (WORKFLOWS // 2)  # the keys take turns, as in any claim
    if db_backend == "postgresql":
        # A key's turn is taken in the handover's statement, which completes the workflow
        # before: 1.25 per workflow (the first claim's few included). Before: 5.33 (the
        # completion, the key, its row, its stamp, the start); with a key's turn in one
        # statement but not in the handover, 3.33.
        assert per_workflow < 1.5, per_workflow


def test_with_every_key_locked_elsewhere_the_handover_still_serves_one_unstamped(
    gd, session, db_backend
):
    if db_backend != "postgresql":
        pytest.skip("PostgreSQL's handover; SQLite's claim holds the one write lock")
    with gd.engine.connect() as other:
        # Another claim holds both keys' rows (as one serving them does): every key's turn
        # here is shared, in the handover's statement too.
        HerolessKeyedOne.create(session)  # the keys' rows exist before they are locked
        token = TENANT.set("b")
        try:
            HerolessKeyedOne.create(session)
        finally:
            TENANT.reset(token)
        session.commit()
        other.execute(select(KEYS.c.key).with_for_update()).all()

        per_workflow, _ = _statements_per_workflow(gd, session, already=2)
        other.rollback()

    assert per_workflow < 1.5, per_workflow  # handed over as when the keys were free
    session.commit()
    assert set(session.execute(select(KEYS.c.served_at))) == {(NEVER,)}  # nothing stamped

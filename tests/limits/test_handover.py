"""A limited first step started in the statement that finishes the workflow before it
(PostgreSQL's handover, ``queries.handover``), on the slot passed on from the finished step
when the key is the same and nobody waits for it. Any other case frees the finished step's
slot after the statement and leaves the claimed row to phase 1, as before; and after a step
that holds no slot, the statement is the one it was, with no limit table in it."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, select

from geneva_drive import ConcurrencyLimit, StepExecution, Workflow, step
from geneva_drive.engine import limits
from geneva_drive.engine.executor import _continue, claim_and_run
from geneva_drive.engine.limits import PARKED_UNTIL
from geneva_drive.engine.prepare import Ended, Prepared
from geneva_drive.engine.run_options import RunOptions
from geneva_drive.runtime.loaded import claim_scope
from geneva_drive.storage.models import LimitSlot, LimitWaiter
from tests.limits._support import claim_and_start

pytestmark = pytest.mark.postgres

OPTIONS = RunOptions(worker_id="w", lease=timedelta(seconds=30), chain=lambda queue: True)
# What each body saw: (class, its slot holders' execution ids by key, its own execution id,
# the key stored with its execution, how many executions of the key were parked).
SEEN: list[tuple[str, dict[str, list[int]], int, str | None, int]] = []


@pytest.fixture(autouse=True)
def _postgresql_only(db_backend: str) -> None:
    if db_backend != "postgresql":
        pytest.skip("the handover is one PostgreSQL statement (data-modifying CTEs)")
    SEEN.clear()


def _scope() -> Any:
    return replace(claim_scope(None), fair=False)  # tests/fairness's keyed classes: see there


LOOK_STATEMENTS = 3  # what one _look sends


def _look(workflow: Workflow) -> None:
    session = workflow.session
    mine = session.scalars(
        select(StepExecution).where(
            StepExecution.workflow_id == workflow.id, StepExecution.state == "in_progress"
        )
    ).one()
    holders: dict[str, list[int]] = {}
    for key, held_by in session.execute(
        select(LimitSlot.key, LimitSlot.execution_id)
        .where(LimitSlot.key.like("Handover%"), LimitSlot.execution_id.is_not(None))
        .order_by(LimitSlot.key, LimitSlot.slot)
    ):
        holders.setdefault(key, []).append(int(held_by))
    parked = session.scalar(
        select(StepExecution.id)
        .where(StepExecution.scheduled_for == PARKED_UNTIL, StepExecution.state == "scheduled")
        .limit(1)
    )
    SEEN.append(
        (type(workflow).__name__, holders, mine.id, limits.held_key(mine), int(parked is not None))
    )


class HandoverFree(Workflow):
    may_proceed_without_hero = True

    @step
    def work(self) -> None:
        _look(self)


class HandoverSolo(Workflow):
    """One slot of a constant key (the class's global one)."""

    may_proceed_without_hero = True
    concurrency = ConcurrencyLimit(1)

    @step
    def work(self) -> None:
        _look(self)


class HandoverOther(Workflow):
    may_proceed_without_hero = True
    concurrency = ConcurrencyLimit(1)

    @step
    def work(self) -> None:
        _look(self)


def _after(clock: Any, cls: type[Workflow], session: Any) -> Workflow:
    clock.advance(seconds=1)  # due after the ones before: the claim's order is the test's
    return cls.create(session)


def _run(gd: Any) -> int:
    """Run everything due the way a worker's thread does; the statements it sent, not
    counting the bodies' own (:func:`_look`'s, ``SEEN`` cleared before)."""
    sent: list[str] = []

    def count(*_args: Any) -> None:
        sent.append("")

    event.listen(gd.engine, "before_cursor_execute", count)
    try:
        while claim_and_run(_scope(), OPTIONS, gd):
            pass
    finally:
        event.remove(gd.engine, "before_cursor_execute", count)
    return len(sent) - LOOK_STATEMENTS * len(SEEN)


def _slots(session: Any, key: str) -> list[int | None]:
    session.commit()
    return list(session.scalars(select(LimitSlot.execution_id).where(LimitSlot.key == key)))


def test_the_slot_passes_to_the_next_workflow_of_the_same_key_in_the_finishing_statement(
    gd, session, clock
):
    HandoverSolo.create(session)
    session.commit()
    _run(gd)  # the key's slot row exists from now on
    first = _after(clock, HandoverSolo, session)
    second = _after(clock, HandoverSolo, session)
    session.commit()
    SEEN.clear()

    statements = _run(gd)

    key = "HandoverSolo"
    ids = [e.id for wf in (first, second) for e in wf.step_executions]
    assert [(cls, holders, held) for cls, holders, _, held, _ in SEEN] == [
        ("HandoverSolo", {key: [ids[0]]}, key),
        ("HandoverSolo", {key: [ids[1]]}, key),
    ]
    assert _slots(session, key) == [None]
    # The first claim and phase 1 (claim, slot, execution, workflow), the first workflow's
    # completion that hands its slot over and starts the second, the second's completion,
    # its release (and the look for a waiter), and the last claim that finds nothing. Without
    # the slot passed in the handover: the release, the waiter look, a claim, a slot, two
    # starts more.
    assert statements <= 9, statements


def test_a_waiter_gets_the_slot_rather_than_the_next_workflow_of_the_key(gd, session, clock):
    holder = HandoverSolo.create(session)
    waiter = _after(clock, HandoverSolo, session)
    session.commit()
    holding_session, holding = claim_and_start(gd)
    parked_session, parked = claim_and_start(gd)
    parked_session.close()
    assert isinstance(holding, Prepared) and holding.workflow_id == holder.id
    assert isinstance(parked, Ended)  # the waiter parked: the one slot is held
    assert session.scalar(select(LimitWaiter.execution_id)) is not None
    _after(clock, HandoverSolo, session)  # due now, behind the parked one
    session.commit()
    SEEN.clear()

    # The holder finishes and its transaction claims the next due row (the third workflow):
    # with someone waiting, the slot is not passed on to it but freed, and the waiter woken.
    try:
        _continue(holding_session, holding, OPTIONS, gd, reraise=True, then_claim=_scope())
    finally:
        holding_session.close()
    while claim_and_run(_scope(), OPTIONS, gd):
        pass

    session.commit()
    woken = session.scalars(
        select(StepExecution).where(StepExecution.workflow_id == waiter.id)
    ).one()
    assert woken.outcome == "success"
    # Every body that ran after the holder's saw the waiter woken (none parked).
    assert [parked_count for *_, parked_count in SEEN[1:]] == [0] * (len(SEEN) - 1)
    assert session.scalars(select(LimitWaiter)).all() == []
    assert _slots(session, "HandoverSolo") == [None]


def test_workflows_without_limits_hand_over_with_no_limit_table_in_their_statements(
    gd, session, clock
):
    # Classes with limits are loaded (this module's), and one waits behind the free ones.
    for _ in range(3):
        _after(clock, HandoverFree, session)
    limited = _after(clock, HandoverSolo, session)
    session.commit()
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(statement)

    event.listen(gd.engine, "before_cursor_execute", record)
    try:
        while claim_and_run(_scope(), OPTIONS, gd):
            pass
    finally:
        event.remove(gd.engine, "before_cursor_execute", record)

    assert [cls for cls, *_ in SEEN] == ["HandoverFree"] * 3 + ["HandoverSolo"]
    handovers = [s for s in sent if "due_16" in s and "geneva_drive_workflows SET" in s]
    # Each workflow's end claimed the next one. The free ones' statements name no limit
    # table (a workflow without limits pays nothing for them); the limited one's passes its
    # slot on if it can.
    assert ["limit_" in s for s in handovers] == [False, False, False, True]
    session.expire_all()
    assert limited.step_executions[0].outcome == "success"


def test_a_slot_of_another_key_is_freed_and_the_next_step_takes_its_own(gd, session, clock):
    HandoverOther.create(session)
    session.commit()
    _run(gd)
    first = _after(clock, HandoverSolo, session)
    other = _after(clock, HandoverOther, session)
    session.commit()
    SEEN.clear()

    _run(gd)

    assert [(cls, holders) for cls, holders, *_ in SEEN] == [
        ("HandoverSolo", {"HandoverSolo": [first.step_executions[0].id]}),
        ("HandoverOther", {"HandoverOther": [other.step_executions[0].id]}),
    ]
    assert _slots(session, "HandoverSolo") == [None]
    assert _slots(session, "HandoverOther") == [None]

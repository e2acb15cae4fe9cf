"""A step execution carries its attempt — the nth run of its step in its workflow, as
``admin.show``'s timeline counts it — from the moment it is scheduled, on every path that
schedules one (timers: 0, not a run). Not on MySQL/MariaDB, whose executions are inserted
without reading the table (``Dialect.counts_attempt_on_insert``): there a span counts it
(tests/observability/test_tracing_statements.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive import ConcurrencyLimit, ExceptionPolicy, StepExecution, Workflow, admin, step
from geneva_drive.engine.executor import claim_and_run
from geneva_drive.engine.run_options import RunOptions
from geneva_drive.storage.dialects import dialect_of
from geneva_drive.testing import perform_next_step, run_due, speedrun
from tests.children._support import children_of
from tests.engine._support import reload
from tests.support.app import Order

FLAKY_RUNS: dict[int, int] = {}


@pytest.fixture(autouse=True)
def _counted_on_insert(gd):
    if not dialect_of(gd.engine).counts_attempt_on_insert:
        pytest.skip("MySQL/MariaDB insert executions without reading the table: no attempt stored")


def _stored(session: Session, workflow_id: int) -> list[tuple[str, int | None]]:
    if session.in_transaction():
        session.commit()
    rows = session.execute(
        select(StepExecution.step_name, StepExecution.attempt)
        .where(StepExecution.workflow_id == workflow_id)
        .order_by(StepExecution.created_at, StepExecution.id)
    )
    return [(name, attempt) for name, attempt in rows]


def _agree(session: Session, workflow_id: int) -> list[tuple[str, int | None]]:
    """The stored attempts, oldest first, after checking each against the timeline's."""
    stored = _stored(session, workflow_id)
    timeline = admin.show(session, workflow_id).executions
    expected = [(e.step_name, 0 if e.is_timer else e.attempt) for e in timeline]
    assert stored == expected
    return stored


class AttFlaky(Workflow):
    """``charge`` raises on its first two runs (reattempted), then ``ship`` runs."""

    may_proceed_without_hero = True

    @step(on_exception=ExceptionPolicy("reattempt", wait=0, max_reattempts=5))
    def charge(self) -> None:
        FLAKY_RUNS[self.id] = FLAKY_RUNS.get(self.id, 0) + 1
        if FLAKY_RUNS[self.id] <= 2:
            raise ConnectionError("gateway busy")

    @step
    def ship(self) -> None:
        pass


class AttFails(Workflow):
    """``charge`` fails (the workflow pauses) until the hero's status is ``ok``."""

    @step
    def prepare(self) -> None:
        pass

    @step
    def charge(self) -> None:
        if self.hero.status != "ok":
            raise RuntimeError("card declined")

    @step
    def receipt(self) -> None:
        pass


class AttWaits(Workflow):
    may_proceed_without_hero = True

    @step(wait_for="approved", timeout=timedelta(hours=1), on_timeout="pause")
    def approve(self) -> None:
        pass

    @step
    def done(self) -> None:
        pass


class AttChild(Workflow):
    may_proceed_without_hero = True

    @step
    def first(self) -> None:
        pass

    @step
    def second(self) -> None:
        pass


class AttParent(Workflow):
    may_proceed_without_hero = True

    @step
    def split(self) -> None:
        for key in ("a", "b"):
            self.start_child(AttChild, key=key, allow_multiple=True)

    @step(wait_for_children="all")
    def close(self) -> None:
        pass


class AttSaga(Workflow):
    def cancel_if(self) -> bool:
        return self.hero.status == "cancel"

    @step(compensate="undo_reserve")
    def reserve(self) -> None:
        pass

    @step(compensate="undo_charge")
    def charge(self) -> None:
        pass

    @step
    def ship(self) -> None:
        pass

    def undo_reserve(self) -> None:
        pass

    def undo_charge(self) -> None:
        pass


class AttChain(Workflow):
    may_proceed_without_hero = True

    @step
    def a(self) -> None:
        pass

    @step
    def b(self) -> None:
        pass

    @step
    def c(self) -> None:
        pass


class AttLimited(AttChain):
    """Its steps pass a concurrency slot on as each completes (engine.limits)."""

    concurrency = ConcurrencyLimit(1000)


def test_a_first_run_is_attempt_1_and_each_reattempt_one_more(session):
    FLAKY_RUNS.clear()  # ids start again on each database
    wf = AttFlaky.create(session)
    session.commit()
    speedrun(wf, raise_errors=False)

    assert _agree(session, wf.id) == [("charge", 1), ("charge", 2), ("charge", 3), ("ship", 1)]


def test_an_operator_retry_and_a_resume_after_a_pause_count_on(session):
    order = Order(status="declined")
    session.add(order)
    wf = AttFails.create(session, hero=order)
    session.commit()
    perform_next_step(wf)
    perform_next_step(wf, raise_errors=False)  # charge fails: paused
    admin.retry(session, wf.id, actor="ops")
    session.commit()
    perform_next_step(reload(session, wf), raise_errors=False)  # fails again: paused
    order.status = "ok"
    admin.resume(session, wf.id, actor="ops")
    session.commit()
    speedrun(reload(session, wf))

    assert [a for name, a in _agree(session, wf.id) if name == "charge"][-1] == 3


def test_resume_at_an_earlier_step_counts_that_steps_earlier_runs(session):
    order = Order(status="declined")
    session.add(order)
    wf = AttFails.create(session, hero=order)
    session.commit()
    perform_next_step(wf)
    perform_next_step(wf, raise_errors=False)  # paused at charge
    admin.resume_at(session, wf.id, "prepare", actor="ops")
    session.commit()
    perform_next_step(reload(session, wf))  # prepare again

    stored = _agree(session, wf.id)
    assert ("prepare", 2) in stored
    assert stored[-1] == ("charge", 2)  # scheduled by the completion of prepare's 2nd run


def test_a_signal_waits_timer_is_0_and_the_woken_step_keeps_its_count(session, clock):
    wf = AttWaits.create(session)
    session.commit()
    perform_next_step(wf)  # parks, with its timer
    clock.advance(timedelta(hours=2))
    run_due(reload(session, wf), raise_errors=False)  # the timer fires: paused
    admin.resume(session, wf.id, actor="ops")
    session.commit()
    perform_next_step(reload(session, wf))  # parks again, with a new timer
    reload(session, wf).signal("approved")
    session.commit()
    run_due(reload(session, wf))

    stored = _agree(session, wf.id)
    assert stored.count(("approve", 0)) == 2  # the two timers
    assert ("approve", 2) in stored
    assert stored[-1] == ("done", 1)


def test_children_and_their_parent_each_count_their_own_steps(session):
    parent = AttParent.create(session)
    session.commit()
    perform_next_step(parent)
    for child in children_of(session, parent):
        speedrun(child)
    speedrun(reload(session, parent))

    assert [a for _, a in _agree(session, parent.id)] == [1, 1]
    for child in children_of(session, parent):
        assert _agree(session, child.id) == [("first", 1), ("second", 1)]


def test_compensations_are_attempts_of_their_own(session):
    order = Order(status="ok")
    session.add(order)
    wf = AttSaga.create(session, hero=order)
    session.commit()
    perform_next_step(wf)
    perform_next_step(wf)
    order.status = "cancel"
    session.commit()
    speedrun(reload(session, wf))

    stored = _agree(session, wf.id)
    assert stored[:2] == [("reserve", 1), ("charge", 1)]
    assert len(stored) >= 4
    assert all(attempt == 1 for _, attempt in stored)


def _run_chaining(gd, session, cls, count):
    """Create ``count`` workflows of ``cls`` and run them as a worker's thread does."""
    ids = [cls.create(session).id for _ in range(count)]
    session.commit()
    options = RunOptions(worker_id="w", lease=timedelta(seconds=30), chain=lambda queue: True)
    while claim_and_run(None, options, gd):
        pass
    return ids


def test_a_worker_chaining_steps_stores_each_attempt(gd, session):
    """On PostgreSQL: the one-statement completion and handover."""
    ids = _run_chaining(gd, session, AttChain, 4)

    for workflow_id in ids:
        assert _agree(session, workflow_id) == [("a", 1), ("b", 1), ("c", 1)]


def test_a_step_that_passes_its_limits_slot_on_stores_each_attempt(gd, session):
    ids = _run_chaining(gd, session, AttLimited, 2)

    for workflow_id in ids:
        assert _agree(session, workflow_id) == [("a", 1), ("b", 1), ("c", 1)]


def test_an_operator_skip_schedules_the_next_step_with_its_count(session):
    order = Order(status="declined")
    session.add(order)
    wf = AttFails.create(session, hero=order)
    session.commit()
    perform_next_step(wf)
    perform_next_step(wf, raise_errors=False)  # paused at charge
    admin.resume_at(session, wf.id, "prepare", actor="ops")
    session.commit()
    admin.skip(session, wf.id, actor="ops")  # prepare's second run skipped: charge again
    session.commit()

    assert _agree(session, wf.id)[-2:] == [("prepare", 2), ("charge", 2)]

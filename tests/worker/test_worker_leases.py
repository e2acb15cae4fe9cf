"""Leases: a worker heartbeats the steps it runs; another recovers them once it stops."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import ClassVar

import pytest
from sqlalchemy import select, update

from geneva_drive import StepExecution, Workflow, step
from geneva_drive.engine import recovery
from geneva_drive.engine.executor import claim_and_run
from geneva_drive.runtime.worker import Worker
from tests.worker._support import crash_current_step, fresh_execution, state_of, trail
from tests.worker.apps import SimulatedCrash, WorkerCrashable


class WorkerLeaseLostSlowStep(Workflow):
    may_proceed_without_hero = True
    gate: ClassVar[threading.Event] = threading.Event()
    entered: ClassVar[threading.Event] = threading.Event()

    @step
    def slow(self) -> None:
        type(self).entered.set()
        assert type(self).gate.wait(60), "the test never released the step"


@pytest.fixture(autouse=True)
def _reset_crashes():
    WorkerCrashable.crashes = 0
    yield
    WorkerCrashable.crashes = 0


def test_a_claimed_step_carries_the_workers_lease(gd, session, clock):
    WorkerCrashable.crashes = 1
    wf = WorkerCrashable.create(session)
    session.commit()
    worker = Worker(config=gd, lease=20)

    with pytest.raises(SimulatedCrash):
        claim_and_run(None, worker.options, gd)

    (execution,) = wf.execution_history
    execution = fresh_execution(session, execution.id)
    assert execution.state == "in_progress"
    assert execution.lease_owner == worker.worker_id
    assert execution.lease_expires_at == clock.now() + timedelta(seconds=20)


@contextlib.contextmanager
def running_slow_step(gd, session, worker: Worker) -> Iterator[Workflow]:
    """``worker``'s options run a slow step on a thread; it blocks until the block is left."""
    gate = WorkerLeaseLostSlowStep.gate = threading.Event()
    entered = WorkerLeaseLostSlowStep.entered = threading.Event()
    wf = WorkerLeaseLostSlowStep.create(session)
    session.commit()
    thread = threading.Thread(target=claim_and_run, args=(None, worker.options, gd))
    thread.start()
    try:
        assert entered.wait(60)
        yield wf
    finally:
        gate.set()
        thread.join(60)


def test_a_heartbeat_extends_only_the_leases_of_the_steps_the_worker_is_running(gd, session, clock):
    WorkerCrashable.crashes = 2
    worker = Worker(config=gd, lease=30)
    lost = WorkerCrashable.create(session, allow_multiple=True)
    theirs = WorkerCrashable.create(session, allow_multiple=True)
    lost_execution = crash_current_step(session, lost, worker_id=worker.worker_id)
    theirs_execution = crash_current_step(session, theirs, worker_id="someone-else")

    with running_slow_step(gd, session, worker) as slow:
        clock.advance(timedelta(seconds=10))
        assert worker.heartbeat() == 1
        [running] = slow.execution_history
        renewed = clock.now() + timedelta(seconds=30)
        assert fresh_execution(session, running.id).lease_expires_at == renewed
        # Leased to this worker id, but none of its threads runs it: not renewed.
        assert fresh_execution(session, lost_execution.id).lease_expires_at == clock.now() + (
            timedelta(seconds=20)
        )
        assert fresh_execution(session, theirs_execution.id).lease_expires_at == clock.now() + (
            timedelta(seconds=20)
        )


def test_a_row_leased_to_a_live_worker_that_it_no_longer_runs_expires_and_is_recovered(
    gd, session, clock
):
    WorkerCrashable.crashes = 1
    worker = Worker(config=gd, lease=30)
    wf = WorkerCrashable.create(session)
    # Left in progress under this worker's id (say its phase 3 failed); the worker lives on.
    crash_current_step(session, wf, worker_id=worker.worker_id, lease=30)
    survivor = Worker(config=gd, lease=30)

    for _ in range(3):  # the worker keeps heartbeating every 10 s
        clock.advance(timedelta(seconds=10))
        assert worker.heartbeat() == 0
    clock.advance(timedelta(microseconds=1))

    assert survivor.recover_expired_leases() == 1
    assert trail(session, wf) == [
        ("fragile", "completed", "recovered"),
        ("fragile", "scheduled", None),
    ]


def test_a_worker_recovers_a_dead_workers_step_once_its_lease_has_expired(gd, session, clock):
    WorkerCrashable.crashes = 1
    wf = WorkerCrashable.create(session)
    crash_current_step(session, wf, worker_id="dead-worker", lease=30)
    survivor = Worker(config=gd, lease=30)

    clock.advance(timedelta(seconds=29))
    assert survivor.recover_expired_leases() == 0
    assert trail(session, wf) == [("fragile", "in_progress", None)]

    clock.advance(timedelta(seconds=2))
    assert survivor.recover_expired_leases() == 1
    assert state_of(session, wf) == "ready"
    assert trail(session, wf) == [
        ("fragile", "completed", "recovered"),
        ("fragile", "scheduled", None),
    ]


def test_a_heartbeat_keeps_a_slow_step_from_being_recovered(gd, session, clock):
    slow = Worker(config=gd, lease=30)
    other = Worker(config=gd, lease=30)

    with running_slow_step(gd, session, slow) as wf:
        for _ in range(6):  # a minute of heartbeats every 10 s
            clock.advance(timedelta(seconds=10))
            assert slow.heartbeat() == 1
            assert other.recover_expired_leases() == 0
        assert trail(session, wf) == [("slow", "in_progress", None)]

    assert trail(session, wf) == [("slow", "completed", "success")]


def test_a_worker_whose_lease_was_recovered_is_told_and_discards_its_late_result(
    gd, session, clock, caplog
):
    """The slow worker's next heartbeat says its lease was lost; its phase 3 finds the
    execution recovered, writes nothing, and says the step ran twice."""
    gate = WorkerLeaseLostSlowStep.gate = threading.Event()
    entered = WorkerLeaseLostSlowStep.entered = threading.Event()
    wf = WorkerLeaseLostSlowStep.create(session)
    session.commit()
    slow_worker = Worker(config=gd, lease=30)
    thread = threading.Thread(target=claim_and_run, args=(None, slow_worker.options, gd))
    caplog.set_level(logging.WARNING, logger="geneva_drive")
    thread.start()
    try:
        assert entered.wait(60)
        session.commit()
        running = session.scalars(select(StepExecution).filter_by(workflow_id=wf.id)).one()
        clock.advance(timedelta(seconds=31))  # it stalled: no heartbeat for longer than a lease
        assert recovery.recover_expired_leases(gd) == 1
        assert slow_worker.heartbeat() == 0
    finally:
        gate.set()
        thread.join(60)

    assert trail(session, wf) == [
        ("slow", "completed", "recovered"),
        ("slow", "scheduled", None),  # the late success did not schedule anything else
    ]
    [told] = [r.getMessage() for r in caplog.records if "ran out before this renewal" in r.message]
    assert f"step execution(s) {running.id} ran out" in told
    assert "its body runs twice" in told
    [discarded] = [r for r in caplog.records if "ran twice" in r.getMessage()]
    assert f"execution_id={running.id}" in discarded.getMessage()
    assert "completed (recovered)" in discarded.getMessage()


def test_recover_execution_is_idempotent(gd, session, clock):
    WorkerCrashable.crashes = 1
    wf = WorkerCrashable.create(session)
    execution = crash_current_step(session, wf, worker_id="dead")

    assert recovery.recover_execution(session, execution.id) is True
    session.commit()
    assert recovery.recover_execution(session, execution.id) is False
    session.commit()

    assert trail(session, wf) == [
        ("fragile", "completed", "recovered"),
        ("fragile", "scheduled", None),
    ]


def test_releasing_leases_lets_other_workers_recover_at_once(gd, session, clock):
    WorkerCrashable.crashes = 1
    wf = WorkerCrashable.create(session)
    leaving = Worker(config=gd, lease=30)
    crash_current_step(session, wf, worker_id=leaving.worker_id)

    assert leaving.release_leases() == 1
    clock.advance(timedelta(microseconds=1))

    assert Worker(config=gd).recover_expired_leases() == 1
    assert trail(session, wf)[0] == ("fragile", "completed", "recovered")


def test_the_lease_must_be_positive(gd):
    with pytest.raises(ValueError, match=r"lease=0.*must be positive"):
        Worker(config=gd, lease=0)


def test_a_worker_leaves_other_in_progress_rows_without_leases_to_housekeeping(gd, session, clock):
    WorkerCrashable.crashes = 1
    wf = WorkerCrashable.create(session)
    execution = crash_current_step(session, wf)  # external backend: no lease
    session.execute(
        update(StepExecution).where(StepExecution.id == execution.id).values(lease_owner=None)
    )
    session.commit()
    clock.advance(timedelta(minutes=30))

    assert Worker(config=gd).recover_expired_leases() == 0
    assert trail(session, wf) == [("fragile", "in_progress", None)]

"""The worker's loop: eager continuation, queues and priority, idling, LISTEN, grace period."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import ClassVar

from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

import geneva_drive
from geneva_drive import DatabaseBackend, StepExecution, Workflow, resumable_step, step
from geneva_drive.engine.executor import claim_and_run
from geneva_drive.runtime.configure import configured
from geneva_drive.runtime.worker import Worker
from geneva_drive.storage.queries.claims import ClaimScope
from tests.worker._support import (
    DEADLINE,
    finished,
    fresh_execution,
    state_of,
    trail,
    wait_until_true,
)
from tests.worker.apps import WorkerScaleThreeSteps


class WorkerSecondStepElsewhere(Workflow):
    may_proceed_without_hero = True

    @step
    def here(self) -> None:
        pass

    @step(job_options={"queue": "elsewhere"})
    def there(self) -> None:
        pass


class WorkerSecondStepLater(Workflow):
    may_proceed_without_hero = True

    @step
    def now(self) -> None:
        pass

    @step(wait=timedelta(minutes=5))
    def later(self) -> None:
        pass


class WorkerGatedStep(Workflow):
    may_proceed_without_hero = True
    gate: ClassVar[threading.Event] = threading.Event()
    entered: ClassVar[threading.Event] = threading.Event()

    @step
    def gated(self) -> None:
        type(self).entered.set()
        assert type(self).gate.wait(DEADLINE), "the test never opened the gate"

    @step
    def after(self) -> None:
        pass


class WorkerResumableGated(Workflow):
    """Blocks in its second item until the test opens the gate; six items in all."""

    may_proceed_without_hero = True
    gate: ClassVar[threading.Event] = threading.Event()
    entered: ClassVar[threading.Event] = threading.Event()

    @resumable_step
    def walk(self, it: object) -> None:
        for item in it.iterate_over(range(6)):  # type: ignore[attr-defined]
            if item == 1:
                type(self).entered.set()
                assert type(self).gate.wait(DEADLINE), "the test never opened the gate"


def _run_in_thread(worker: Worker, until: Callable[[], bool] | None = None) -> threading.Thread:
    thread = threading.Thread(
        target=worker.run, kwargs={"until": until, "install_signals": False}, daemon=True
    )
    thread.start()
    return thread


# -- eager continuation ----------------------------------------------------------------------


def test_a_step_due_now_runs_straight_away_on_the_same_worker_thread(gd, session):
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()
    worker = Worker(config=gd, concurrency=1, poll_interval=0.05)

    worker.run(until=finished(gd, wf.id), install_signals=False)

    assert worker.steps_run == 3
    assert worker.steps_run_eagerly == 2  # `two` and `three` followed without a new claim
    assert [s for _, s, _ in trail(session, wf)] == ["completed"] * 3


def test_without_eager_continuation_every_step_is_claimed_afresh(gd, session):
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()
    worker = Worker(config=gd, concurrency=1, poll_interval=0.05, eager=False)

    worker.run(until=finished(gd, wf.id), install_signals=False)

    assert (worker.steps_run, worker.steps_run_eagerly) == (3, 0)


def test_eager_continuation_leaves_a_step_on_another_queue_to_its_workers(gd, session):
    wf = WorkerSecondStepElsewhere.create(session)
    session.commit()
    worker = Worker(config=gd, queues=["default"], concurrency=1, poll_interval=0.05)

    def second_step_waiting() -> bool:
        return len(trail(session, wf)) == 2

    worker.run(until=second_step_waiting, install_signals=False)

    assert worker.steps_run_eagerly == 0
    assert trail(session, wf) == [("here", "completed", "success"), ("there", "scheduled", None)]
    assert wf.current_execution.queue == "elsewhere"


def test_eager_continuation_leaves_a_step_that_is_not_due_yet(gd, session):
    wf = WorkerSecondStepLater.create(session)
    session.commit()
    worker = Worker(config=gd, concurrency=1, poll_interval=0.05)

    worker.run(until=lambda: len(trail(session, wf)) == 2, install_signals=False)

    assert worker.steps_run == 1
    assert trail(session, wf) == [("now", "completed", "success"), ("later", "scheduled", None)]


def test_a_claim_by_id_skips_an_execution_that_is_not_claimable(gd, session, clock):
    wf = WorkerSecondStepLater.create(session)
    session.commit()
    worker = Worker(config=gd)
    assert claim_and_run(None, worker.options, gd)
    later = wf.current_execution.id

    assert claim_and_run(None, worker.options, gd, execution_id=later) is False  # not due
    clock.advance(timedelta(minutes=5))
    assert (
        claim_and_run(ClaimScope.on_queues(["other"]), worker.options, gd, execution_id=later)
        is False
    )  # queue
    assert claim_and_run(None, worker.options, gd, execution_id=later) is True
    assert claim_and_run(None, worker.options, gd, execution_id=later) is False  # done


# -- queues and priority ---------------------------------------------------------------------


def test_the_worker_claims_lower_priority_numbers_first_and_only_its_queues(gd, session):
    low = WorkerScaleThreeSteps.create(
        session, allow_multiple=True, step_job_options={"priority": 5}
    )
    high = WorkerScaleThreeSteps.create(
        session, allow_multiple=True, step_job_options={"priority": 1}
    )
    mail = WorkerScaleThreeSteps.create(
        session, allow_multiple=True, step_job_options={"queue": "mail", "priority": 0}
    )
    session.commit()
    worker = Worker(config=gd, queues=["default"], eager=False)

    assert claim_and_run(ClaimScope.on_queues(worker.queues), worker.options, gd)
    assert trail(session, high)[0] == ("one", "completed", "success")
    assert [s for _, s, _ in trail(session, low)] == ["scheduled"]
    assert [s for _, s, _ in trail(session, mail)] == ["scheduled"]


# -- idling ----------------------------------------------------------------------------------


def test_an_idle_worker_does_not_time_its_sleep_on_a_paused_workflows_row(gd, session, clock):
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()
    wf.pause()
    session.commit()
    clock.advance(timedelta(minutes=10))  # the kept row is long overdue
    worker = Worker(config=gd, poll_interval=7.0)

    assert worker._idle_timeout() == 7.0


def test_an_idle_worker_sleeps_until_the_next_due_step(gd, session, clock):
    wf = WorkerSecondStepLater.create(session)
    session.commit()
    worker = Worker(config=gd, poll_interval=600.0)
    assert claim_and_run(None, worker.options, gd)
    assert wf.current_execution.step_name == "later"

    assert worker._idle_timeout() == 300.0


def test_a_notify_wakes_an_idle_postgresql_worker_at_once(gd, session, db_backend):
    worker = Worker(config=gd, concurrency=1, poll_interval=600.0)
    if db_backend != "postgresql":
        assert worker.listen is False  # no NOTIFY on this engine: idle workers poll
        return
    other_process_backend = DatabaseBackend()  # not the worker's: no in-process wake-up
    state: dict[str, int] = {}
    thread = _run_in_thread(worker, until=lambda: "id" in state and finished(gd, state["id"])())
    try:
        wait_until_true(lambda: worker.listening, "the worker to LISTEN")
        wait_until_true(lambda: worker.idle_waits > 0, "the worker to go idle for ten minutes")
        with configured(backend=other_process_backend):
            wf = WorkerScaleThreeSteps.create(session)
            session.commit()
        state["id"] = wf.id
        wait_until_true(finished(gd, wf.id), "the workflow to finish")
    finally:
        worker.stop()
        thread.join(DEADLINE)
    assert worker.steps_run == 3


# -- stopping --------------------------------------------------------------------------------


def test_stopping_lets_the_running_step_finish_and_claims_nothing_more(gd, session):
    WorkerGatedStep.gate = threading.Event()
    WorkerGatedStep.entered = threading.Event()
    wf = WorkerGatedStep.create(session)
    session.commit()
    worker = Worker(config=gd, concurrency=1, poll_interval=0.05, grace_period=DEADLINE)
    thread = _run_in_thread(worker)
    assert WorkerGatedStep.entered.wait(DEADLINE)

    worker.stop()
    WorkerGatedStep.gate.set()
    thread.join(DEADLINE)

    assert not thread.is_alive()
    assert worker.abandoned == 0
    assert trail(session, wf) == [
        ("gated", "completed", "success"),
        ("after", "scheduled", None),  # not claimed, not even eagerly, once stopping
    ]


def test_a_step_still_running_after_the_grace_period_has_its_lease_released(gd, session, clock):
    WorkerGatedStep.gate = threading.Event()
    WorkerGatedStep.entered = threading.Event()
    wf = WorkerGatedStep.create(session)
    session.commit()
    worker = Worker(config=gd, concurrency=1, poll_interval=0.05, grace_period=0.1)
    thread = _run_in_thread(worker)
    try:
        assert WorkerGatedStep.entered.wait(DEADLINE)
        worker.stop()
        thread.join(DEADLINE)
        assert not thread.is_alive()
        assert worker.abandoned == 1
        execution = fresh_execution(session, wf.current_execution.id)
        assert execution.state == "in_progress"
        assert execution.lease_expires_at == clock.now()  # recoverable at once
    finally:
        WorkerGatedStep.gate.set()


def test_a_stopped_worker_leaves_no_execution_in_progress_and_no_lease(gd, session):
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()
    worker = Worker(config=gd, concurrency=2 if gd.engine.dialect.name != "sqlite" else 1)

    worker.run(until=finished(gd, wf.id), install_signals=False)

    leased = session.execute(
        select(func.count())
        .select_from(StepExecution)
        .where(StepExecution.lease_owner.is_not(None))
    ).scalar_one()
    assert leased == 0
    assert state_of(session, wf) == "finished"


def test_a_process_wide_shutdown_request_stops_the_worker_and_its_resumable_step(gd, session):
    WorkerResumableGated.gate = threading.Event()
    WorkerResumableGated.entered = threading.Event()
    wf = WorkerResumableGated.create(session)
    session.commit()
    worker = Worker(config=gd, concurrency=1, poll_interval=0.05, grace_period=DEADLINE)
    thread = _run_in_thread(worker)
    try:
        assert WorkerResumableGated.entered.wait(DEADLINE)
        geneva_drive.request_shutdown()  # not worker.stop(): e.g. a Celery or framework hook
        WorkerResumableGated.gate.set()
        thread.join(DEADLINE)
    finally:
        WorkerResumableGated.gate.set()
        geneva_drive.clear_shutdown_request()

    assert not thread.is_alive()
    assert trail(session, wf) == [
        ("walk", "completed", "continued"),  # stopped at the checkpoint after item 1
        ("walk", "scheduled", None),  # the successor, left for the next worker
    ]


def test_a_failing_claim_loop_logs_the_error_with_its_traceback(gd, session, monkeypatch, caplog):
    # A bug in the claim loop (not a lost database): the worker pauses and tries again, and
    # the operator must see why. log.exception after the except block had ended logged
    # "NoneType: None" instead.
    failures: list[RuntimeError] = []

    def broken_once(*args, **kwargs):
        if not failures:
            failures.append(RuntimeError("claim query broke"))
            raise failures[0]
        return claim_and_run(*args, **kwargs)  # then idle: nothing is due

    monkeypatch.setattr("geneva_drive.runtime.worker.claim_and_run", broken_once)
    worker = Worker(config=gd, concurrency=1, poll_interval=0.05, listen=False)
    with caplog.at_level(logging.ERROR, logger="geneva_drive.worker"):
        worker.run(until=lambda: bool(failures), install_signals=False)

    [record] = [r for r in caplog.records if r.getMessage().startswith("worker loop error")]
    assert record.exc_info is not None and record.exc_info[1] is failures[0]


def test_a_claim_a_deadlock_abandoned_is_a_warning_and_is_retried_at_once(
    gd, session, monkeypatch, caplog
):
    # A deadlock in phase 1 (two workers creating a concurrency key's slots at once) rolls
    # the claim back; nothing is wrong with the worker: no error, no pause.
    deadlock = OperationalError("INSERT …", {}, Exception(1213, "Deadlock found"))
    calls: list[float] = []

    def deadlocked_once(*args, **kwargs):
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise deadlock
        return claim_and_run(*args, **kwargs)

    monkeypatch.setattr("geneva_drive.runtime.worker.claim_and_run", deadlocked_once)
    worker = Worker(config=gd, concurrency=1, poll_interval=60, listen=False)
    with caplog.at_level(logging.INFO, logger="geneva_drive.worker"):
        worker.run(until=lambda: len(calls) >= 2, install_signals=False)

    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "transient" in warning.getMessage() and "Deadlock" in warning.getMessage()
    assert calls[1] - calls[0] < 30  # not after the 60 s poll interval's pause

"""Wake-ups reach the backend only after commit; the inline backend runs due steps."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from sqlalchemy import text

from geneva_drive import InlineBackend, Workflow, step, with_inline_enqueue
from geneva_drive.engine.committed import after_commit
from geneva_drive.runtime.configure import configured
from geneva_drive.testing import perform_next_step
from tests.engine._support import RecordingBackend, current, history, reload
from tests.support.app import Order


class BackendTwoSteps(Workflow):
    job_options = {"queue": "orders", "priority": 5}

    @step
    def first(self) -> None:
        pass

    @step(wait=60)
    def second(self) -> None:
        pass


class BackendAllDue(Workflow):
    @step
    def first(self) -> None:
        self.hero.counter += 1

    @step
    def second(self) -> None:
        self.hero.counter += 10


class BackendDelayedFirst(Workflow):
    @step(wait=300)
    def first(self) -> None:
        self.hero.counter += 1


@pytest.fixture
def recorder(gd):
    backend = RecordingBackend()
    with configured(backend=backend):
        yield backend


def _create(session, cls):
    order = Order()
    session.add(order)
    return cls.create(session, hero=order), order


def test_nothing_is_enqueued_before_the_transaction_commits(session, recorder):
    _create(session, BackendTwoSteps)
    session.flush()

    assert recorder.enqueued == []


def test_the_first_step_is_enqueued_after_commit(session, recorder, clock):
    wf, _ = _create(session, BackendTwoSteps)
    session.commit()

    [enqueued] = recorder.enqueued
    assert enqueued.execution_id == current(session, wf).id
    assert enqueued.workflow_id == wf.id
    assert enqueued.step_name == "first"
    assert enqueued.scheduled_for == clock.now()
    assert enqueued.job_options == {"queue": "orders", "priority": 5}


def test_nothing_is_enqueued_when_the_transaction_rolls_back(session, recorder):
    _create(session, BackendTwoSteps)
    session.rollback()
    session.commit()  # a later, empty commit must not deliver the rolled-back wake-up

    assert recorder.enqueued == []


def test_a_step_enqueues_its_successor_with_the_successors_due_time(session, recorder, clock):
    wf, _ = _create(session, BackendTwoSteps)
    session.commit()

    perform_next_step(wf)

    assert [s.step_name for s in recorder.enqueued] == ["first", "second"]
    assert recorder.enqueued[1].scheduled_for == clock.now() + timedelta(seconds=60)
    assert recorder.enqueued[1].execution_id == current(session, wf).id


def test_with_inline_enqueue_delivers_before_commit(session, recorder):
    with with_inline_enqueue():
        _create(session, BackendTwoSteps)

    assert [s.step_name for s in recorder.enqueued] == ["first"]
    session.rollback()


def test_with_inline_enqueue_is_nestable_and_restores_deferral(session, recorder):
    with with_inline_enqueue():
        with with_inline_enqueue():
            pass
        _create(session, BackendTwoSteps)
        assert len(recorder.enqueued) == 1
    session.rollback()

    _create(session, BackendTwoSteps)
    assert len(recorder.enqueued) == 1  # deferred again outside the block
    session.rollback()


def test_with_inline_enqueue_restores_deferral_after_an_exception(session, recorder):
    with pytest.raises(RuntimeError), with_inline_enqueue():
        raise RuntimeError("inside")

    _create(session, BackendTwoSteps)

    assert recorder.enqueued == []
    session.rollback()


def test_enqueue_after_commit_off_delivers_at_once(session, recorder):
    with configured(enqueue_after_commit=False):
        _create(session, BackendTwoSteps)

        assert [s.step_name for s in recorder.enqueued] == ["first"]
    session.rollback()


def test_a_backend_that_raises_does_not_undo_the_committed_row(session, gd):
    class Broken:
        def enqueue(self, step):
            raise ConnectionError("broker down")

    with configured(backend=Broken()):
        wf, _ = _create(session, BackendTwoSteps)
        session.commit()

    assert current(session, wf).state == "scheduled"


# -- the inline backend --------------------------------------------------------------------


def test_the_inline_backend_runs_due_steps_after_commit(session, gd):
    with configured(backend=InlineBackend()):
        wf, order = _create(session, BackendAllDue)
        session.commit()

    assert reload(session, wf).state == "finished"
    session.refresh(order)
    assert order.counter == 11


def test_the_inline_backend_runs_nothing_before_commit(session, gd):
    with configured(backend=InlineBackend()):
        wf, _ = _create(session, BackendAllDue)
        session.flush()

        assert wf.state == "ready"
        session.rollback()


def test_the_inline_backend_leaves_delayed_steps_scheduled(session, gd):
    with configured(backend=InlineBackend()):
        wf, _ = _create(session, BackendTwoSteps)
        session.commit()

    assert history(session, wf) == [
        ("first", "completed", "success"),
        ("second", "scheduled", None),
    ]
    assert reload(session, wf).state == "ready"


def test_the_inline_backend_with_run_delayed_runs_delayed_steps_too(session, gd):
    with configured(backend=InlineBackend(run_delayed=True)):
        wf, order = _create(session, BackendDelayedFirst)
        session.commit()

    assert reload(session, wf).state == "finished"
    session.refresh(order)
    assert order.counter == 1


def test_nothing_is_enqueued_for_a_workflow_created_in_a_rolled_back_savepoint(session, recorder):
    kept, _ = _create(session, BackendTwoSteps)
    with pytest.raises(RuntimeError), session.begin_nested():
        _create(session, BackendAllDue)
        raise RuntimeError("undo the inner work")
    session.commit()

    assert [s.workflow_id for s in recorder.enqueued] == [kept.id]


def test_nothing_is_enqueued_when_a_savepoint_is_released_before_the_outer_commit(
    session, recorder
):
    _create(session, BackendTwoSteps)  # create() itself uses a savepoint
    _create(session, BackendTwoSteps)  # ... and so does this one

    assert recorder.enqueued == []
    session.rollback()
    assert recorder.enqueued == []


def test_wake_ups_and_other_after_commit_actions_run_at_the_commit_in_the_order_written(
    session, recorder
):
    # One after-commit mechanism (engine.committed): a wake-up is one of its actions, not a
    # second list run by a second listener before or after the others.
    told: list[str] = []
    session.execute(text("SELECT 1"))  # in a transaction
    after_commit(session, lambda: told.append(f"first, {len(recorder.enqueued)} woken"))
    _create(session, BackendTwoSteps)
    after_commit(session, lambda: told.append(f"then, {len(recorder.enqueued)} woken"))
    assert (told, recorder.enqueued) == ([], [])

    session.commit()

    assert told == ["first, 0 woken", "then, 1 woken"]


def test_the_inline_backend_runs_workflows_created_together_once_all_are_committed(session, gd):
    with configured(backend=InlineBackend()):
        first, _ = _create(session, BackendAllDue)
        second, _ = _create(session, BackendAllDue)
        session.commit()

    assert reload(session, first).state == "finished"
    assert reload(session, second).state == "finished"


def test_a_runner_given_its_own_settings_hands_the_next_step_to_its_own_backend(session, gd):
    # The process-wide settings have one backend; run_execution(config=…) another. The wait
    # after `first` is handed to the backend of the settings the step ran under, not the global.
    from geneva_drive.engine.executor import run_execution

    global_backend, own_backend = RecordingBackend(), RecordingBackend()
    with configured(backend=global_backend):
        wf, _ = _create(session, BackendTwoSteps)
        session.commit()
        first = current(session, wf)
        global_backend.enqueued.clear()
        own = dataclasses.replace(gd, backend=own_backend)
        run_execution(first.id, config=own)
    assert [s.step_name for s in own_backend.enqueued] == ["second"]
    assert global_backend.enqueued == []

"""Signal timeouts: ``timeout=`` / ``on_timeout=`` on a ``wait_for=`` step (beyond the gem)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from geneva_drive import StepConfigurationError, Workflow, WorkflowNotOngoing, step
from geneva_drive.engine.executor import run_execution
from geneva_drive.storage.db import session_factory
from geneva_drive.testing import assert_waiting_for_signal, perform_next_step
from tests.engine._support import RecordingBackend, current, history
from tests.signals._support import (
    drive,
    notes,
    reload,
    run_due,
    signal_row,
    signals_of,
    start,
    timer_of,
)
from tests.support.app import AuditEntry


def _note(workflow: Workflow, text: str) -> None:
    workflow.session.add(AuditEntry(order_id=workflow.hero.id, note=text))


class SigTimeoutSkip(Workflow):
    @step(wait_for="approved", timeout=timedelta(hours=1))
    def approve(self) -> None:
        _note(self, f"approved {self.received_signal.payload}")

    @step
    def after(self) -> None:
        _note(self, "after")


class SigTimeoutCancel(Workflow):
    @step(wait_for="approved", timeout=60, on_timeout="cancel")
    def approve(self) -> None:
        _note(self, "approved")


class SigTimeoutPause(Workflow):
    @step(wait_for="approved", timeout=60, on_timeout="pause")
    def approve(self) -> None:
        _note(self, f"approved {self.received_signal.payload}")


class SigTimeoutJump(Workflow):
    @step(wait_for="approved", timeout=60, on_timeout="escalate")
    def approve(self) -> None:
        _note(self, "approved")

    @step
    def ship(self) -> None:
        _note(self, "ship")

    @step
    def escalate(self) -> None:  # defined after the step that names it
        _note(self, "escalated")


HOUR = timedelta(hours=1)


def _parked(session, cls=SigTimeoutSkip):
    wf = start(session, cls)
    perform_next_step(wf)
    assert_waiting_for_signal(wf, "approved")
    return wf


# -- definition -----------------------------------------------------------------------------


def test_timeout_needs_wait_for():
    with pytest.raises(StepConfigurationError, match="only applies to a step that waits"):

        class SigTimeoutNoWaitFor(Workflow):
            @step(timeout=60)
            def a(self) -> None:
                pass


@pytest.mark.parametrize("bad", [0, -5, "1h", True, timedelta(0)])
def test_timeout_must_be_a_positive_duration(bad):
    with pytest.raises(StepConfigurationError, match="timeout= must be a positive"):

        class SigTimeoutBadDuration(Workflow):
            @step(wait_for="x", timeout=bad)
            def a(self) -> None:
                pass


def test_on_timeout_needs_timeout():
    with pytest.raises(StepConfigurationError, match="on_timeout='cancel' needs timeout="):

        class SigTimeoutNoTimeout(Workflow):
            @step(wait_for="x", on_timeout="cancel")
            def a(self) -> None:
                pass


def test_on_timeout_must_name_an_action_or_a_step_of_the_class():
    with pytest.raises(StepConfigurationError, match="'nowhere' is neither") as info:

        class SigTimeoutUnknownTarget(Workflow):
            @step(wait_for="x", timeout=60, on_timeout="nowhere")
            def a(self) -> None:
                pass

            @step
            def b(self) -> None:
                pass

    assert "SigTimeoutUnknownTarget.step 'a'" in str(info.value)
    assert "steps: a, b" in str(info.value)


def test_on_timeout_may_not_name_the_waiting_step_itself():
    with pytest.raises(StepConfigurationError, match="names the waiting step itself"):

        class SigTimeoutSelf(Workflow):
            @step(wait_for="x", timeout=60, on_timeout="a")
            def a(self) -> None:
                pass


def test_timeout_accepts_seconds_and_defaults_to_skip():
    step_def = SigTimeoutCancel.steps.named("approve")
    assert step_def.timeout == timedelta(seconds=60)
    assert SigTimeoutSkip.steps.named("approve").on_timeout == "skip"
    assert SigTimeoutJump.steps.named("approve").on_timeout == "escalate"


# -- the timer row --------------------------------------------------------------------------


def test_parking_creates_a_timer_due_at_the_deadline_beside_the_waiting_row(session, clock):
    wf = _parked(session)

    parked = current(session, wf)
    timer = timer_of(session, wf)
    assert parked.state == "waiting"
    assert timer.step_name == "approve"
    assert timer.scheduled_for == clock.now() + HOUR
    assert timer.metadata_json["timeout_for"] == parked.id
    assert parked.metadata_json["timeout_execution_id"] == timer.id


def test_the_timer_is_handed_to_the_backend_after_commit_with_its_due_time(session, gd, clock):
    from geneva_drive import configure

    backend = RecordingBackend()
    wf = start(session, SigTimeoutSkip)
    configure(backend=backend)

    perform_next_step(wf)

    assert [(s.step_name, s.scheduled_for) for s in backend.enqueued] == [
        ("approve", clock.now() + HOUR)
    ]
    assert backend.execution_ids == [timer_of(session, wf).id]


def test_nothing_times_out_before_the_deadline(session, clock):
    wf = _parked(session)
    clock.advance(HOUR - timedelta(seconds=1))

    assert run_due(session) == 0

    assert_waiting_for_signal(wf, "approved")


def test_a_signal_before_the_deadline_cancels_the_timer_and_runs_the_step(session, clock):
    wf = _parked(session)
    timer_id = timer_of(session, wf).id

    wf.signal("approved", payload="yes")
    session.commit()
    clock.advance(HOUR * 2)
    run_due(session)

    assert notes(session, wf) == ["approved yes", "after"]
    rows = {e.id: (e.state, e.outcome) for e in history_rows(session, wf)}
    assert rows[timer_id] == ("canceled", "canceled")
    assert reload(session, wf).state == "finished"


def history_rows(session, wf):
    from tests.engine._support import executions

    return executions(session, wf)


# -- on_timeout actions ---------------------------------------------------------------------


def test_on_timeout_skip_skips_the_waiting_step_and_schedules_the_next(session, clock):
    wf = _parked(session)
    clock.advance(HOUR)

    run_due(session)

    assert notes(session, wf) == ["after"]
    assert history(session, wf) == [
        ("approve", "skipped", "timed_out"),  # the wait: its body never ran
        ("approve", "completed", "timed_out"),  # the timer itself
        ("after", "completed", "success"),
    ]
    timed_out = history_rows(session, wf)[0].metadata_json["timed_out"]
    assert timed_out == {
        "after_seconds": HOUR.total_seconds(),
        "on_timeout": "skip",
        "timer_execution_id": history_rows(session, wf)[1].id,
    }
    assert reload(session, wf).state == "finished"


def test_on_timeout_cancel_cancels_the_workflow(session, clock):
    wf = _parked(session, SigTimeoutCancel)
    clock.advance(60)

    run_due(session)

    assert reload(session, wf).state == "canceled"
    assert history(session, wf)[0] == ("approve", "canceled", "timed_out")
    with pytest.raises(WorkflowNotOngoing):
        wf.signal("approved")


def test_on_timeout_pause_pauses_and_resume_waits_again_with_a_fresh_timeout(session, clock):
    wf = _parked(session, SigTimeoutPause)
    clock.advance(60)
    run_due(session)
    assert reload(session, wf).state == "paused"
    assert reload(session, wf).next_step_name == "approve"

    wf.resume()
    session.commit()
    drive(wf)

    assert_waiting_for_signal(wf, "approved")
    assert timer_of(session, wf).scheduled_for == clock.now() + timedelta(seconds=60)


def test_a_signal_arriving_while_timed_out_and_paused_is_taken_on_resume(session, clock):
    wf = _parked(session, SigTimeoutPause)
    clock.advance(60)
    run_due(session)

    wf.signal("approved", payload="late")
    session.commit()
    assert signal_row(session, wf, "approved") == ("pending", 0, 0)
    wf.resume()
    session.commit()
    drive(wf)

    assert notes(session, wf) == ["approved late"]
    assert reload(session, wf).state == "finished"


def test_on_timeout_naming_a_step_jumps_to_it(session, clock):
    wf = _parked(session, SigTimeoutJump)
    clock.advance(60)

    run_due(session)

    assert notes(session, wf) == ["escalated"]
    assert [h[0] for h in history(session, wf)] == ["approve", "approve", "escalate"]


def test_a_late_signal_after_a_skip_timeout_stays_buffered(session, clock):
    wf = start(session, SigTimeoutJump)  # escalate runs last, so the workflow ends
    perform_next_step(wf)
    clock.advance(60)
    run_due(session)
    assert reload(session, wf).state == "finished"

    with pytest.raises(WorkflowNotOngoing):
        wf.signal("approved")


class SigTimeoutThenWait(Workflow):
    @step(wait_for="approved", timeout=60)
    def approve(self) -> None:
        _note(self, "approve")

    @step(wait_for="other")
    def hold(self) -> None:
        _note(self, "hold")


def test_a_late_signal_to_an_ongoing_workflow_is_buffered_not_delivered(session, clock):
    wf = _parked(session, SigTimeoutThenWait)
    clock.advance(60)
    run_due(session)
    assert_waiting_for_signal(wf, "other")

    wf.signal("approved", payload="late")
    session.commit()

    assert signal_row(session, wf, "approved") == ("pending", 0, 0)
    assert notes(session, wf) == []


# -- racing the timer -----------------------------------------------------------------------


def test_signal_first_then_the_due_timer_the_signal_wins_and_the_timer_does_nothing(session, clock):
    wf = _parked(session)
    timer_id = timer_of(session, wf).id
    clock.advance(HOUR)  # both are due "now"

    wf.signal("approved", payload="first")
    session.commit()
    run_execution(timer_id)  # a stale wake-up for the timer
    drive(wf)

    assert notes(session, wf) == ["approved first", "after"]
    assert signal_row(session, wf, "approved") == ("consumed", 1, 1)


def test_timer_first_then_the_signal_the_timeout_wins_and_the_signal_is_buffered(session, clock):
    wf = _parked(session, SigTimeoutThenWait)
    timer_id = timer_of(session, wf).id
    clock.advance(60)

    run_execution(timer_id)
    wf.signal("approved", payload="second")
    session.commit()

    assert history(session, wf)[0] == ("approve", "skipped", "timed_out")
    assert signal_row(session, wf, "approved") == ("pending", 0, 0)
    assert notes(session, wf) == []


def test_a_signal_and_the_timer_racing_in_two_threads_resolve_the_step_exactly_once(
    session, clock, gd
):
    for _ in range(5):
        wf = _parked(session, SigTimeoutThenWait)
        timer_id = timer_of(session, wf).id
        clock.advance(60)
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def deliver(workflow_id=wf.id, barrier=barrier, errors=errors) -> None:
            with session_factory(gd)() as s:
                barrier.wait(timeout=30)
                try:
                    s.get(Workflow, workflow_id).signal("approved")
                    s.commit()
                except BaseException as error:
                    errors.append(error)

        def fire(execution_id=timer_id, barrier=barrier, errors=errors) -> None:
            barrier.wait(timeout=30)
            try:
                run_execution(execution_id)
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=deliver), threading.Thread(target=fire)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
        drive(wf)

        first_two = history(session, wf)[:2]
        (signal,) = signals_of(session, wf)
        if signal.state == "pending":  # the timer won
            assert first_two == [
                ("approve", "skipped", "timed_out"),
                ("approve", "completed", "timed_out"),
            ]
            assert notes(session, wf) == []
        else:  # the signal won
            assert (signal.state, signal.claimed, signal.consumed) == ("consumed", 1, 1)
            assert notes(session, wf) == ["approve"]
            timer = next(e for e in history_rows(session, wf) if e.id == timer_id)
            assert (timer.state, timer.outcome) == ("canceled", "canceled")
        assert_waiting_for_signal(wf, "other")


# -- operators and the timer ----------------------------------------------------------------


def test_canceling_a_parked_workflow_cancels_its_timer(session):
    wf = _parked(session)

    wf.cancel()
    session.commit()

    assert [e[1:] for e in history(session, wf)] == [
        ("canceled", "canceled"),
        ("canceled", "canceled"),
    ]


def test_skipping_a_parked_step_sweeps_its_timer(session, clock):
    wf = _parked(session)

    wf.skip()
    session.commit()
    clock.advance(HOUR * 2)
    run_due(session)

    assert notes(session, wf) == ["after"]
    assert [e[1:] for e in history(session, wf)[:2]] == [
        ("skipped", "skipped"),
        ("canceled", "canceled"),
    ]


def test_a_timer_due_while_paused_waits_for_resume_and_then_fires(session, clock):
    wf = _parked(session)
    wf.pause()
    session.commit()
    clock.advance(HOUR * 2)

    assert run_due(session) == 0  # paused workflows are not claimed
    wf.resume()
    session.commit()
    run_due(session)

    assert notes(session, wf) == ["after"]
    assert history(session, wf)[0] == ("approve", "skipped", "timed_out")


def test_resume_into_a_buffered_signal_cancels_the_timer(session, clock):
    wf = _parked(session)
    timer_id = timer_of(session, wf).id
    wf.pause()
    session.commit()
    wf.signal("approved", payload="buffered")
    session.commit()

    wf.resume()
    session.commit()
    clock.advance(HOUR * 2)
    run_due(session)

    assert notes(session, wf) == ["approved buffered", "after"]
    timer = next(e for e in history_rows(session, wf) if e.id == timer_id)
    assert (timer.state, timer.outcome) == ("canceled", "canceled")

"""Flow control inside a step: cancel, pause, skip, reattempt and finish."""

from __future__ import annotations

import contextlib
from datetime import timedelta

import pytest

from geneva_drive import InvalidStateError, Workflow, step
from geneva_drive.testing import perform_next_step
from tests.engine._support import current, executions, history, reload
from tests.support.app import Order


class FlowCancelInStep(Workflow):
    @step
    def first(self) -> None:
        self.cancel()

    @step
    def second(self) -> None:
        pass


class FlowPauseInStep(Workflow):
    @step
    def first(self) -> None:
        self.pause()

    @step
    def second(self) -> None:
        pass


class FlowSkipInStep(Workflow):
    @step
    def first(self) -> None:
        self.skip()

    @step(wait=300)
    def second(self) -> None:
        pass


class FlowSkipLastStep(Workflow):
    @step
    def only(self) -> None:
        self.skip()


class FlowReattemptInStep(Workflow):
    @step
    def first(self) -> None:
        self.reattempt(wait=timedelta(minutes=5))

    @step
    def second(self) -> None:
        pass


class FlowReattemptSeconds(Workflow):
    @step
    def first(self) -> None:
        self.reattempt(wait=90)


class FlowReattemptNoWait(Workflow):
    @step(wait=600)
    def first(self) -> None:
        self.reattempt()


class FlowFinishInStep(Workflow):
    @step
    def first(self) -> None:
        self.finish()

    @step
    def second(self) -> None:
        pass


class FlowSwallowAttempt(Workflow):
    @step
    def first(self) -> None:
        # An application's broad "except Exception" must not swallow flow control.
        with contextlib.suppress(Exception):
            self.cancel()

    @step
    def second(self) -> None:
        pass


def _start(session, cls):
    order = Order()
    session.add(order)
    wf = cls.create(session, hero=order)
    session.commit()
    return wf


def test_cancel_in_a_step_cancels_the_execution_and_the_workflow(session, clock):
    wf = _start(session, FlowCancelInStep)
    clock.advance(seconds=5)

    perform_next_step(wf)

    assert history(session, wf) == [("first", "canceled", "canceled")]
    reload(session, wf)
    assert wf.state == "canceled"
    assert wf.transitioned_at == clock.now()
    assert wf.current_execution is None


def test_cancel_in_a_step_stamps_canceled_at_and_finished_at(session, clock):
    wf = _start(session, FlowCancelInStep)
    clock.advance(seconds=5)

    perform_next_step(wf)

    [execution] = executions(session, wf)
    assert execution.canceled_at == clock.now()
    assert execution.finished_at == clock.now()


def test_pause_in_a_plain_step_cancels_the_execution_and_pauses_the_workflow(session, clock):
    wf = _start(session, FlowPauseInStep)
    clock.advance(seconds=7)

    perform_next_step(wf)

    assert history(session, wf) == [("first", "canceled", "canceled")]
    reload(session, wf)
    assert wf.state == "paused"
    assert wf.transitioned_at == clock.now()
    assert wf.next_step_name == "first"


def test_resume_after_a_pause_in_a_step_runs_the_same_step_again(session):
    wf = _start(session, FlowPauseInStep)
    perform_next_step(wf)
    reload(session, wf)

    execution = wf.resume()
    session.commit()

    assert execution is not None
    assert execution.step_name == "first"
    assert execution.state == "scheduled"
    assert reload(session, wf).state == "ready"


def test_skip_in_a_step_skips_it_and_schedules_the_next_step_with_its_wait(session, clock):
    wf = _start(session, FlowSkipInStep)

    perform_next_step(wf)

    assert history(session, wf) == [
        ("first", "skipped", "skipped"),
        ("second", "scheduled", None),
    ]
    nxt = current(session, wf)
    assert nxt.scheduled_for == clock.now() + timedelta(seconds=300)
    assert wf.state == "ready"
    assert wf.transitioned_at is None


def test_skip_in_the_last_step_finishes_the_workflow(session, clock):
    wf = _start(session, FlowSkipLastStep)

    perform_next_step(wf)

    assert history(session, wf) == [("only", "skipped", "skipped")]
    reload(session, wf)
    assert wf.state == "finished"
    assert wf.transitioned_at == clock.now()


def test_reattempt_in_a_step_completes_it_as_reattempted_and_reschedules_it_after_the_wait(
    session, clock
):
    wf = _start(session, FlowReattemptInStep)

    perform_next_step(wf)

    assert history(session, wf) == [
        ("first", "completed", "reattempted"),
        ("first", "scheduled", None),
    ]
    assert current(session, wf).scheduled_for == clock.now() + timedelta(minutes=5)
    assert wf.state == "ready"
    assert wf.transitioned_at is None


def test_reattempt_in_a_step_records_flow_control_as_the_reason(session):
    wf = _start(session, FlowReattemptInStep)

    perform_next_step(wf)

    first = executions(session, wf)[0]
    assert first.reattempt_reason == "flow_control"
    assert first.error_message is None


def test_reattempt_takes_its_wait_in_seconds(session, clock):
    wf = _start(session, FlowReattemptSeconds)

    perform_next_step(wf)

    assert current(session, wf).scheduled_for == clock.now() + timedelta(seconds=90)


def test_reattempt_without_a_wait_runs_again_now_not_after_the_steps_own_wait(session, clock):
    wf = _start(session, FlowReattemptNoWait)

    perform_next_step(wf)  # runs even though it is not due yet

    assert current(session, wf).scheduled_for == clock.now()


def test_finish_in_a_step_completes_it_and_finishes_the_workflow_without_further_steps(
    session, clock
):
    wf = _start(session, FlowFinishInStep)
    clock.advance(seconds=3)

    perform_next_step(wf)

    assert history(session, wf) == [("first", "completed", "success")]
    reload(session, wf)
    assert wf.state == "finished"
    assert wf.transitioned_at == clock.now()
    assert wf.current_step_name is None


def test_flow_control_is_not_swallowed_by_a_broad_except_in_the_step(session):
    wf = _start(session, FlowSwallowAttempt)

    perform_next_step(wf)

    assert history(session, wf) == [("first", "canceled", "canceled")]
    assert reload(session, wf).state == "canceled"


def test_the_current_step_name_is_cleared_after_a_step_is_recorded(session):
    wf = _start(session, FlowSkipInStep)

    perform_next_step(wf)

    reload(session, wf)
    assert wf.current_step_name is None
    assert wf.next_step_name == "second"


@pytest.mark.parametrize("verb", ["reattempt", "finish"])
def test_step_only_verbs_refuse_outside_a_step(session, verb):
    wf = _start(session, FlowFinishInStep)

    with pytest.raises(InvalidStateError, match=f"{verb}\\(\\) can only be called inside"):
        getattr(wf, verb)()

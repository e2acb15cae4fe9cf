"""Errors in phase 1 and in the body end the same way; a timed-out wait says so.

Regression tests for the drift between the executor's former copies of the outcome decision
(issue "One outcome writer", defects 1 to 3).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from geneva_drive import ExceptionPolicy, SignalMatcher, Workflow, step
from geneva_drive.testing import assert_step_executed, perform_next_step
from tests.engine._support import history, reload
from tests.signals._support import run_due


class GateBoom(Exception):
    pass


def _raising_matcher(workflow: Workflow, payload: object) -> bool:
    raise GateBoom("the matcher blew up")


class OnePathGateReattempts(Workflow):
    may_proceed_without_hero = True
    exception_policies = [ExceptionPolicy("reattempt", max_reattempts=2)]

    @step(wait_for=SignalMatcher("go", _raising_matcher))
    def gated(self) -> None:
        pass


class OnePathCancelIfReattempts(Workflow):
    may_proceed_without_hero = True
    exception_policies = [ExceptionPolicy("reattempt", max_reattempts=2)]

    def cancel_if(self) -> bool:
        raise GateBoom("cancel_if blew up")

    @step
    def first(self) -> None:
        pass


class OnePathBodyReattempts(Workflow):
    may_proceed_without_hero = True
    exception_policies = [ExceptionPolicy("reattempt", max_reattempts=2)]

    @step
    def first(self) -> None:
        raise GateBoom("the body blew up")


def _finish_handler(workflow: Workflow, error: BaseException) -> None:
    workflow.finish()


class OnePathGateFinish(Workflow):
    may_proceed_without_hero = True

    @step(wait_for=SignalMatcher("go", _raising_matcher), on_exception=_finish_handler)
    def gated(self) -> None:
        pass

    @step
    def after(self) -> None:
        pass


class OnePathBodyFinish(Workflow):
    may_proceed_without_hero = True

    @step(on_exception=_finish_handler)
    def first(self) -> None:
        raise GateBoom("the body blew up")

    @step
    def after(self) -> None:
        pass


class OnePathTimeout(Workflow):
    may_proceed_without_hero = True

    @step(wait_for="decided", timeout=timedelta(days=3), on_timeout="escalate")
    def await_approval(self) -> None:
        pass

    @step
    def approved(self) -> None:
        pass

    @step
    def escalate(self) -> None:
        pass


def _drive(session, wf, runs: int) -> None:
    for _ in range(runs):
        if perform_next_step(wf, raise_errors=False) is None:
            break


def _started(session, cls: type[Workflow], *, signal: bool = False) -> Workflow:
    wf = cls.create(session)
    if signal:
        wf.signal("go")  # buffered: the gate's matcher meets it when the step is reached
    session.commit()
    return wf


@pytest.mark.parametrize(
    "cls",
    [OnePathGateReattempts, OnePathCancelIfReattempts, OnePathBodyReattempts],
    ids=["signal-matcher", "cancel_if", "body"],
)
def test_an_error_reaches_the_reattempt_cap_wherever_it_is_raised(session, cls):
    wf = _started(session, cls, signal=cls is OnePathGateReattempts)

    _drive(session, wf, runs=6)

    assert reload(session, wf).state == "paused"
    assert [(state, outcome) for _, state, outcome in history(session, wf)] == [
        ("completed", "reattempted"),
        ("completed", "reattempted"),
        ("failed", "failed"),
    ]


def test_a_phase1_reattempt_records_the_exception_and_its_reason(session):
    wf = _started(session, OnePathGateReattempts, signal=True)

    _drive(session, wf, runs=1)

    (first, _) = [e for e in wf.execution_history]
    assert first.read_metadata("reattempt_reason") == "precondition"
    assert first.read_metadata("exception")["message"] == "the matcher blew up"


@pytest.mark.parametrize(
    "cls", [OnePathGateFinish, OnePathBodyFinish], ids=["signal-matcher", "body"]
)
def test_a_handler_that_finishes_ends_the_workflow_finished_wherever_the_error_came_from(
    session, cls
):
    wf = _started(session, cls, signal=cls is OnePathGateFinish)

    _drive(session, wf, runs=3)

    assert reload(session, wf).state == "finished"
    first_step = cls.steps.names[0]
    assert history(session, wf) == [(first_step, "completed", "success")]


def test_a_timed_out_wait_is_not_the_steps_success(session, clock):
    wf = _started(session, OnePathTimeout)
    perform_next_step(wf)  # parks
    clock.advance(days=3, seconds=1)

    run_due(session)  # the timer fires, then the on_timeout step runs

    assert reload(session, wf).state == "finished"
    with pytest.raises(AssertionError):
        assert_step_executed(wf, "await_approval")
    assert_step_executed(wf, "escalate")
    steps = [(e.step_name, e.state, e.outcome, e.is_timer) for e in wf.execution_history]
    assert steps == [
        ("await_approval", "skipped", "timed_out", False),
        ("escalate", "completed", "success", False),
    ]
    everything = wf.execution_history_with_timers
    assert [(e.state, e.outcome, e.is_timer) for e in everything if e.is_timer] == [
        ("completed", "timed_out", True)
    ]
    timed_out = everything[0].read_metadata("timed_out")
    assert timed_out["on_timeout"] == "escalate"
    assert timed_out["after_seconds"] == timedelta(days=3, seconds=1).total_seconds()


def test_when_the_signal_wins_the_disarmed_timer_is_not_part_of_the_steps_history(session):
    wf = _started(session, OnePathTimeout)
    perform_next_step(wf)  # parks, with its timer beside it
    wf.signal("decided")
    session.commit()

    perform_next_step(wf)

    assert [(e.step_name, e.state, e.outcome) for e in wf.execution_history] == [
        ("await_approval", "completed", "success"),
        ("approved", "scheduled", None),
    ]
    timers = [e for e in wf.execution_history_with_timers if e.is_timer]
    assert [(t.state, t.outcome) for t in timers] == [("canceled", "canceled")]

"""Step hooks, instrumentation events and logging context."""

from __future__ import annotations

import logging

import pytest

import geneva_drive
from geneva_drive import Workflow, step
from geneva_drive.testing import perform_next_step
from tests.engine._support import current, history, reload
from tests.support.app import Order

CALLS: list[str] = []


class HookOrder(Workflow):
    def before_step_execution(self, execution) -> None:
        CALLS.append(f"before {execution.step_name} {execution.state}")

    def around_step_execution(self, execution, proceed):
        CALLS.append("around:enter")
        result = proceed()
        CALLS.append("around:exit")
        return result

    def after_step_execution(self, execution) -> None:
        CALLS.append(f"after {execution.step_name}")

    @step
    def first(self) -> None:
        CALLS.append("body")


class HookAroundSkipsProceed(Workflow):
    def around_step_execution(self, execution, proceed):
        CALLS.append("around without proceed")
        return None

    @step
    def first(self) -> None:
        CALLS.append("body")


class HookAfterSeesFailure(Workflow):
    def after_step_execution(self, execution) -> None:
        CALLS.append("after")

    @step
    def first(self) -> None:
        raise RuntimeError("body failed")


class HookBeforeRaises(Workflow):
    def before_step_execution(self, execution) -> None:
        raise RuntimeError("hook failed")

    @step
    def first(self) -> None:
        CALLS.append("body")


class HookAroundPropagatesFlowControl(Workflow):
    def around_step_execution(self, execution, proceed):
        CALLS.append("around")
        return proceed()

    @step
    def first(self) -> None:
        self.skip()

    @step
    def second(self) -> None:
        pass


class HookSkippedByPrecondition(Workflow):
    def before_step_execution(self, execution) -> None:
        CALLS.append("before")

    def around_step_execution(self, execution, proceed):
        CALLS.append("around")
        return proceed()

    def after_step_execution(self, execution) -> None:
        CALLS.append("after")

    @step(skip_if=True)
    def first(self) -> None:
        CALLS.append("body")


class EventSteps(Workflow):
    @step
    def first(self) -> None:
        pass


class EventFails(Workflow):
    @step
    def first(self) -> None:
        raise ValueError("event failure")


class EventSkipped(Workflow):
    @step(skip_if=True)
    def first(self) -> None:
        pass


class EventCanceled(Workflow):
    def cancel_if(self) -> bool:
        return True

    @step
    def first(self) -> None:
        pass


class EventFlow(Workflow):
    @step
    def first(self) -> None:
        self.reattempt(wait=10)


class LogWarns(Workflow):
    @step
    def first(self) -> None:
        raise RuntimeError("logged")


@pytest.fixture(autouse=True)
def _clear_calls():
    CALLS.clear()


@pytest.fixture
def events():
    received: list[tuple[str, dict]] = []
    unsubscribe = geneva_drive.subscribe(
        "*", lambda name, payload: received.append((name, payload))
    )
    yield received
    unsubscribe()


def _start(session, cls):
    order = Order()
    session.add(order)
    wf = cls.create(session, hero=order)
    session.commit()
    return wf


# -- hooks ---------------------------------------------------------------------------------


def test_hooks_run_before_around_body_after_in_that_order(session):
    wf = _start(session, HookOrder)

    perform_next_step(wf)

    assert CALLS == [
        "before first in_progress",
        "around:enter",
        "body",
        "around:exit",
        "after first",
    ]


def test_an_around_hook_that_does_not_call_proceed_skips_the_body(session):
    wf = _start(session, HookAroundSkipsProceed)

    perform_next_step(wf)

    assert CALLS == ["around without proceed"]
    assert history(session, wf) == [("first", "completed", "success")]


def test_the_after_hook_runs_when_the_body_raises(session):
    wf = _start(session, HookAfterSeesFailure)

    with pytest.raises(RuntimeError, match="body failed"):
        perform_next_step(wf)

    assert CALLS == ["after"]
    assert history(session, wf) == [("first", "failed", "failed")]


def test_an_exception_in_a_hook_is_handled_like_a_step_exception(session):
    wf = _start(session, HookBeforeRaises)

    with pytest.raises(RuntimeError, match="hook failed"):
        perform_next_step(wf)

    assert CALLS == []
    assert history(session, wf) == [("first", "failed", "failed")]
    assert reload(session, wf).state == "paused"


def test_flow_control_passes_through_an_around_hook(session):
    wf = _start(session, HookAroundPropagatesFlowControl)

    perform_next_step(wf)

    assert CALLS == ["around"]
    assert history(session, wf)[0] == ("first", "skipped", "skipped")


def test_hooks_do_not_run_when_a_precondition_ends_the_run(session):
    wf = _start(session, HookSkippedByPrecondition)

    perform_next_step(wf)

    assert CALLS == []
    assert history(session, wf) == [("first", "skipped", "skipped")]


# -- events --------------------------------------------------------------------------------


def test_a_completed_step_emits_precondition_step_and_finalize_with_their_payloads(session, events):
    wf = _start(session, EventSteps)
    execution_id = current(session, wf).id

    perform_next_step(wf)

    assert [name for name, _ in events] == ["precondition", "step", "finalize"]
    common = {
        "execution_id": execution_id,
        "workflow_id": wf.id,
        "workflow_class": "EventSteps",
        "step_name": "first",
    }
    for _, payload in events:
        assert common.items() <= payload.items()
        assert payload["duration"] >= 0
    precondition, step_event, finalize = (payload for _, payload in events)
    assert precondition["outcome"] == "passed"
    assert step_event["outcome"] == "completed"
    assert finalize["workflow_state"] == "finished"
    assert finalize["step_state"] == "completed"


def test_a_raising_step_emits_the_exception_in_the_step_event(session, events):
    wf = _start(session, EventFails)

    with pytest.raises(ValueError):
        perform_next_step(wf)

    [step_event] = [payload for name, payload in events if name == "step"]
    assert step_event["outcome"] == "exception"
    assert isinstance(step_event["exception"], ValueError)
    [finalize] = [payload for name, payload in events if name == "finalize"]
    assert finalize["workflow_state"] == "paused"
    assert finalize["step_state"] == "failed"


def test_flow_control_is_the_step_events_outcome(session, events):
    wf = _start(session, EventFlow)

    perform_next_step(wf)

    [step_event] = [payload for name, payload in events if name == "step"]
    assert step_event["outcome"] == "reattempt"


@pytest.mark.parametrize(
    ("cls", "outcome"), [(EventSkipped, "skipped"), (EventCanceled, "canceled")]
)
def test_a_precondition_abort_emits_only_the_precondition_event(session, events, cls, outcome):
    wf = _start(session, cls)

    perform_next_step(wf)

    assert [(name, payload["outcome"]) for name, payload in events] == [("precondition", outcome)]


def test_a_guard_abort_emits_no_event(session, events):
    wf = _start(session, EventSteps)
    wf.pause()
    session.commit()
    from geneva_drive.engine.executor import run_execution

    run_execution(current(session, wf).id)

    assert events == []


def test_subscribing_to_one_event_receives_only_that_event(session):
    received: list[str] = []
    unsubscribe = geneva_drive.subscribe("finalize", lambda name, payload: received.append(name))
    try:
        perform_next_step(_start(session, EventSteps))
    finally:
        unsubscribe()

    assert received == ["finalize"]


def test_a_failing_subscriber_does_not_change_the_outcome(session):
    def broken(name, payload):
        raise RuntimeError("subscriber down")

    unsubscribe = geneva_drive.subscribe("*", broken)
    try:
        wf = _start(session, EventSteps)
        perform_next_step(wf)
    finally:
        unsubscribe()

    assert reload(session, wf).state == "finished"


def test_subscribing_to_an_unknown_event_is_refused():
    with pytest.raises(ValueError, match="unknown event 'stepp'"):
        geneva_drive.subscribe("stepp", lambda name, payload: None)


# -- logging -------------------------------------------------------------------------------


def test_log_records_about_a_step_carry_the_geneva_drive_context(session, caplog):
    wf = _start(session, LogWarns)
    execution_id = current(session, wf).id

    with caplog.at_level(logging.INFO, logger="geneva_drive"):
        perform_next_step(wf, raise_errors=False)

    [record] = [r for r in caplog.records if "step raised RuntimeError" in r.getMessage()]
    assert record.geneva_drive == {
        "workflow_class": "LogWarns",
        "workflow_id": wf.id,
        "hero_type": "Order",
        "hero_id": wf.hero_id,
        "execution_id": execution_id,
        "step_name": "first",
    }
    assert f"workflow_id={wf.id}" in record.getMessage()
    assert f"execution_id={execution_id}" in record.getMessage()

"""geneva_drive.testing: driving workflows in tests and asserting on them."""

from __future__ import annotations

import re

import pytest

from geneva_drive import Workflow, step
from geneva_drive.testing import (
    assert_step_executed,
    assert_workflow_state,
    perform_next_step,
    perform_step_inline,
    speedrun,
)
from tests.engine._support import current, history, reload
from tests.support.app import Order

RUNS: list[str] = []


class HelperThree(Workflow):
    @step
    def first(self) -> None:
        RUNS.append("first")

    @step(wait=3600)
    def second(self) -> None:
        RUNS.append("second")

    @step(wait=86400)
    def third(self) -> None:
        RUNS.append("third")


class HelperForever(Workflow):
    @step
    def first(self) -> None:
        self.reattempt(wait=60)


class HelperFails(Workflow):
    @step
    def first(self) -> None:
        raise RuntimeError("helper failure")

    @step
    def second(self) -> None:
        RUNS.append("second")


@pytest.fixture(autouse=True)
def _clear_runs():
    RUNS.clear()


def _start(session, cls=HelperThree):
    order = Order()
    session.add(order)
    wf = cls.create(session, hero=order)
    session.commit()
    return wf


# -- speedrun ------------------------------------------------------------------------------


def test_speedrun_runs_every_step_now_ignoring_waits(session, clock):
    wf = _start(session)
    started = clock.now()

    result = speedrun(wf)

    assert result is wf
    assert RUNS == ["first", "second", "third"]
    assert wf.state == "finished"
    assert clock.now() == started  # no time travel needed


def test_speedrun_commits_the_callers_pending_work_first(session):
    order = Order()
    session.add(order)
    wf = HelperThree.create(session, hero=order)  # not committed by the test

    speedrun(wf)

    assert wf.state == "finished"


def test_speedrun_stops_at_a_paused_workflow(session):
    wf = _start(session, HelperFails)

    speedrun(wf)

    assert RUNS == []
    assert wf.state == "paused"


def test_speedrun_swallows_step_errors_unless_asked_to_raise_them(session):
    wf = _start(session, HelperFails)

    with pytest.raises(RuntimeError, match="helper failure"):
        speedrun(wf, raise_errors=True)

    assert history(session, wf) == [("first", "failed", "failed")]


def test_speedrun_gives_up_after_max_steps_with_a_clear_message(session):
    wf = _start(session, HelperForever)

    with pytest.raises(
        AssertionError, match=r"HelperForever id=\d+: speedrun exceeded max_steps=5"
    ):
        speedrun(wf, max_steps=5)

    assert len(history(session, wf)) == 6  # five run, the sixth still scheduled


# -- perform_next_step ---------------------------------------------------------------------


def test_perform_next_step_runs_exactly_one_execution_even_if_not_due(session):
    wf = _start(session)
    perform_next_step(wf)

    execution = perform_next_step(wf)  # "second" is due in an hour

    assert RUNS == ["first", "second"]
    assert execution.step_name == "second"
    assert execution.state == "completed"
    assert wf.next_step_name == "third"


def test_perform_next_step_returns_none_when_nothing_is_scheduled(session):
    wf = _start(session)
    speedrun(wf)

    assert perform_next_step(wf) is None


def test_perform_next_step_raises_the_step_error_when_asked(session):
    wf = _start(session, HelperFails)

    with pytest.raises(RuntimeError, match="helper failure"):
        perform_next_step(wf, raise_errors=True)


# -- perform_step_inline -------------------------------------------------------------------


def test_perform_step_inline_runs_the_named_step_now(session):
    wf = _start(session)

    execution = perform_step_inline(wf, "third")

    assert RUNS == ["third"]
    assert execution.step_name == "third"
    assert execution.state == "completed"
    assert reload(session, wf).state == "finished"


def test_perform_step_inline_defaults_to_the_next_step(session):
    wf = _start(session)

    execution = perform_step_inline(wf)

    assert execution.step_name == "first"
    assert RUNS == ["first"]


def test_perform_step_inline_replaces_the_scheduled_execution(session):
    wf = _start(session)
    scheduled = current(session, wf).id

    perform_step_inline(wf, "second")

    rows = history(session, wf)
    assert rows[0] == ("first", "canceled", "canceled")
    assert current(session, wf).id != scheduled
    assert current(session, wf).step_name == "third"


def test_perform_step_inline_rejects_an_unknown_step_listing_the_known_ones(session):
    wf = _start(session)

    with pytest.raises(
        ValueError,
        match=re.escape(
            "Step 'nope' is not defined in HelperThree. Available steps: first, second, third"
        ),
    ):
        perform_step_inline(wf, "nope")


# -- assertions ----------------------------------------------------------------------------


def test_assert_workflow_state_passes_on_the_current_state(session):
    wf = _start(session)
    speedrun(wf)

    assert_workflow_state(wf, "finished")


def test_assert_workflow_state_reads_the_database_not_the_stale_object(session):
    wf = _start(session)
    perform_next_step(wf)
    wf.state = "ready"  # in-memory only; the helper must reload
    session.expire(wf)

    assert_workflow_state(wf, "ready")


def test_assert_workflow_state_fails_with_both_states_in_the_message(session):
    wf = _start(session)

    with pytest.raises(
        AssertionError, match=r"HelperThree id=\d+: expected state 'finished', got 'ready'"
    ):
        assert_workflow_state(wf, "finished")


def test_assert_step_executed_passes_for_an_execution_in_that_state(session):
    wf = _start(session, HelperFails)
    perform_next_step(wf)

    assert_step_executed(wf, "first", state="failed")


def test_assert_step_executed_fails_listing_the_executions(session):
    wf = _start(session, HelperFails)
    perform_next_step(wf)

    with pytest.raises(AssertionError, match=r"no 'completed' execution of step 'first'.*'failed'"):
        assert_step_executed(wf, "first")


def test_assert_step_executed_sees_outcomes_of_executions_the_test_holds(session):
    wf = _start(session)
    held = current(session, wf)  # loaded while still scheduled

    speedrun(wf)

    assert held.step_name == "first"
    assert_step_executed(wf, "first", state="completed")

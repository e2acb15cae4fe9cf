"""geneva_drive.testing: driving workflows in tests and asserting on them."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, inspect, select
from sqlalchemy.orm import Session

from geneva_drive import (
    ExceptionPolicy,
    SignalMatcher,
    StepNotDefinedError,
    Workflow,
    resumable_step,
    step,
)
from geneva_drive.runtime import housekeeping
from geneva_drive.testing import (
    assert_cursor,
    assert_step_executed,
    assert_waiting_for_signal,
    assert_workflow_state,
    perform_next_step,
    perform_step_inline,
    run_iterations,
    speedrun,
    speedrun_current_step,
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


class HelperReattempts(Workflow):
    @step(on_exception=ExceptionPolicy("reattempt", wait=timedelta(minutes=5), max_reattempts=3))
    def first(self) -> None:
        raise RuntimeError("try again later")


class HelperWalkFails(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(range(5)):
            if item == 3:
                raise RuntimeError("walk failed at 3")


class HelperWalks(Workflow):
    @resumable_step(max_iterations=2)
    def walk(self, it: Any) -> None:
        for _ in it.iterate_over(range(5)):
            pass


class HelperSkipIfRaises(Workflow):
    @step(skip_if=lambda wf: wf.explode())
    def first(self) -> None:
        RUNS.append("first")

    def explode(self) -> bool:
        raise LookupError("skip_if blew up")


class HelperCancelIfRaises(Workflow):
    def cancel_if(self) -> bool:
        raise LookupError("cancel_if blew up")

    @step
    def first(self) -> None:
        RUNS.append("first")


def _matcher_explodes(workflow: Workflow, payload: Any) -> bool:
    raise LookupError("matcher blew up")


class HelperMatcherRaises(Workflow):
    @step(wait_for=SignalMatcher("go", _matcher_explodes))
    def first(self) -> None:
        RUNS.append("first")


class HelperWaits(Workflow):
    @step(wait_for="go")
    def first(self) -> None:
        RUNS.append("first")


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


def test_speedrun_raises_the_steps_error_after_committing_the_paused_outcome(session):
    wf = _start(session, HelperFails)

    with pytest.raises(RuntimeError, match="helper failure"):
        speedrun(wf)

    assert RUNS == []
    assert wf.state == "paused"  # refreshed before the error was raised again
    assert history(session, wf) == [("first", "failed", "failed")]


def test_speedrun_with_raise_errors_false_stops_quietly_at_the_paused_workflow(session):
    wf = _start(session, HelperFails)

    result = speedrun(wf, raise_errors=False)

    assert result is wf
    assert RUNS == []
    assert wf.state == "paused"
    assert history(session, wf) == [("first", "failed", "failed")]


def test_speedrun_with_raise_errors_false_reattempts_up_to_the_cap_then_pauses(session):
    wf = _start(session, HelperReattempts)

    speedrun(wf, raise_errors=False)

    assert wf.state == "paused"
    assert history(session, wf) == [("first", "completed", "reattempted")] * 3 + [
        ("first", "failed", "failed")
    ]


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


def test_perform_next_step_raises_the_steps_error_after_committing_the_outcome(session):
    wf = _start(session, HelperFails)

    with pytest.raises(RuntimeError, match="helper failure"):
        perform_next_step(wf)

    assert wf.state == "paused"
    assert history(session, wf) == [("first", "failed", "failed")]


def test_perform_next_step_raises_a_reattempted_steps_error_with_the_reattempt_scheduled(
    session, clock
):
    wf = _start(session, HelperReattempts)

    with pytest.raises(RuntimeError, match="try again later"):
        perform_next_step(wf)

    assert wf.state == "ready"
    assert history(session, wf) == [
        ("first", "completed", "reattempted"),
        ("first", "scheduled", None),
    ]
    assert current(session, wf).scheduled_for == clock.now() + timedelta(minutes=5)


def test_perform_next_step_with_raise_errors_false_returns_the_failed_execution(session):
    wf = _start(session, HelperFails)

    execution = perform_next_step(wf, raise_errors=False)

    assert execution is not None
    assert (execution.state, execution.error_message) == ("failed", "helper failure")
    assert wf.state == "paused"


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


def test_perform_step_inline_raises_the_steps_error_after_committing_the_outcome(session):
    wf = _start(session, HelperFails)

    with pytest.raises(RuntimeError, match="helper failure"):
        perform_step_inline(wf, "first")

    assert wf.state == "paused"
    assert history(session, wf) == [
        ("first", "canceled", "canceled"),
        ("first", "failed", "failed"),
    ]


def test_perform_step_inline_with_raise_errors_false_returns_the_failed_execution(session):
    wf = _start(session, HelperFails)

    execution = perform_step_inline(wf, "first", raise_errors=False)

    assert execution.state == "failed"
    assert wf.state == "paused"


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
    perform_next_step(wf, raise_errors=False)

    assert_step_executed(wf, "first", state="failed")


def test_assert_step_executed_fails_listing_the_executions(session):
    wf = _start(session, HelperFails)
    perform_next_step(wf, raise_errors=False)

    with pytest.raises(AssertionError, match=r"no 'completed' execution of step 'first'.*'failed'"):
        assert_step_executed(wf, "first")


def test_assert_step_executed_sees_outcomes_of_executions_the_test_holds(session):
    wf = _start(session)
    held = current(session, wf)  # loaded while still scheduled

    speedrun(wf)

    assert held.step_name == "first"
    assert_step_executed(wf, "first", state="completed")


# -- speedrun_current_step and run_iterations ----------------------------------------------


def test_speedrun_current_step_raises_the_steps_error_after_committing_the_outcome(session):
    wf = _start(session, HelperWalkFails)

    with pytest.raises(RuntimeError, match="walk failed at 3"):
        speedrun_current_step(wf)

    assert wf.state == "paused"
    assert history(session, wf) == [("walk", "failed", "failed")]


def test_speedrun_current_step_with_raise_errors_false_returns_the_failed_execution(session):
    wf = _start(session, HelperWalkFails)

    execution = speedrun_current_step(wf, raise_errors=False)

    assert execution is not None
    assert execution.state == "failed"
    assert wf.state == "paused"


def test_run_iterations_raises_the_steps_error_after_committing_the_outcome(session):
    wf = _start(session, HelperWalkFails)

    with pytest.raises(RuntimeError, match="walk failed at 3"):
        run_iterations(wf, 10)

    assert wf.state == "paused"
    assert history(session, wf) == [("walk", "failed", "failed")]


def test_run_iterations_with_raise_errors_false_returns_the_failed_execution(session):
    wf = _start(session, HelperWalkFails)

    execution = run_iterations(wf, 10, raise_errors=False)

    assert execution.state == "failed"
    assert wf.state == "paused"


# -- phase-1 errors surface like body errors -----------------------------------------------


def _run_next(wf: Workflow) -> None:
    perform_next_step(wf)


def _speedrun(wf: Workflow) -> None:
    speedrun(wf)


def _inline(wf: Workflow) -> None:
    perform_step_inline(wf, "first")


PHASE_1_RUNNERS = [_run_next, _speedrun, _inline]


@pytest.mark.parametrize("run", PHASE_1_RUNNERS)
@pytest.mark.parametrize(
    ("cls", "message"),
    [(HelperSkipIfRaises, "skip_if blew up"), (HelperCancelIfRaises, "cancel_if blew up")],
    ids=["skip_if", "cancel_if"],
)
def test_a_raising_precondition_surfaces_after_the_paused_outcome_is_committed(
    session, run, cls, message
):
    wf = _start(session, cls)

    with pytest.raises(LookupError, match=message):
        run(wf)

    assert RUNS == []
    assert wf.state == "paused"
    assert history(session, wf)[-1] == ("first", "failed", "failed")


@pytest.mark.parametrize("run", PHASE_1_RUNNERS)
def test_a_raising_signal_matcher_surfaces_after_the_paused_outcome_is_committed(session, run):
    wf = _start(session, HelperMatcherRaises)
    wf.signal("go")  # buffered: the matcher runs when the step's gate looks at it
    session.commit()

    with pytest.raises(LookupError, match="matcher blew up"):
        run(wf)

    assert RUNS == []
    assert wf.state == "paused"
    assert history(session, wf)[-1] == ("first", "failed", "failed")


@pytest.mark.parametrize("run", [_run_next, _speedrun])
def test_a_step_no_longer_defined_surfaces_as_step_not_defined_error(session, run):
    wf = _start(session)
    current(session, wf).step_name = "removed_in_this_deploy"
    session.commit()

    with pytest.raises(StepNotDefinedError, match="'removed_in_this_deploy' is not defined"):
        run(wf)

    assert wf.state == "paused"


def test_with_raise_errors_false_a_raising_precondition_only_pauses(session):
    wf = _start(session, HelperSkipIfRaises)

    speedrun(wf, raise_errors=False)

    assert wf.state == "paused"


# -- helpers end the transactions they open on the caller's session ------------------------


def _count_workflows(session: Session, workflow_id: int) -> int:
    query = select(func.count()).select_from(Workflow).where(Workflow.id == workflow_id)
    return session.execute(query).scalar_one()


def test_after_speedrun_the_callers_session_sees_housekeepings_deletes_and_can_write(
    gd, session, clock
):
    old = _start(session)
    speedrun(old)
    clock.advance(timedelta(days=31))
    wf = _start(session)

    speedrun(wf)
    assert housekeeping.run(gd)["workflows_cleaned_up"] == 1  # in its own session

    assert _count_workflows(session, old.id) == 0
    session.add(Order())
    session.commit()  # SQLite: "database is locked" if speedrun left a snapshot open
    assert wf.state == "finished"


def _parked_helper(session: Session) -> Workflow:
    wf = _start(session, HelperWaits)
    perform_next_step(wf)
    return wf


def _failing_speedrun(wf: Workflow) -> None:
    with pytest.raises(RuntimeError):
        speedrun(wf)


def _failing_run_iterations(wf: Workflow) -> None:
    with pytest.raises(RuntimeError):
        run_iterations(wf, 10)


def _unknown_step_inline(wf: Workflow) -> None:
    with pytest.raises(ValueError):
        perform_step_inline(wf, "nope")


HELPER_CALLS: dict[str, tuple[type[Workflow], Callable[[Workflow], Any]]] = {
    "speedrun": (HelperThree, speedrun),
    "perform_next_step": (HelperThree, perform_next_step),
    "perform_step_inline": (HelperThree, lambda wf: perform_step_inline(wf, "second")),
    "speedrun_current_step": (HelperWalks, speedrun_current_step),
    "run_iterations": (HelperWalks, lambda wf: run_iterations(wf, 1)),
    "assert_workflow_state": (HelperThree, lambda wf: assert_workflow_state(wf, "ready")),
    "assert_step_executed": (
        HelperThree,
        lambda wf: assert_step_executed(wf, "first", state="scheduled"),
    ),
    "assert_cursor": (HelperThree, lambda wf: assert_cursor(wf, None)),
    "failing speedrun": (HelperFails, _failing_speedrun),
    "failing run_iterations": (HelperWalkFails, _failing_run_iterations),
    "unknown step": (HelperThree, _unknown_step_inline),
}


@pytest.mark.parametrize("name", HELPER_CALLS)
def test_a_helper_leaves_no_transaction_open_and_the_workflow_loaded(gd, name):
    cls, call = HELPER_CALLS[name]
    with Session(gd.engine) as session:  # expire_on_commit on, SQLAlchemy's default
        wf = _start(session, cls)

        call(wf)

        assert not session.in_transaction()
        assert not inspect(wf).expired_attributes
        assert wf.state in ("ready", "performing", "paused", "finished")
        assert not session.in_transaction()  # reading it opened nothing either


def test_a_helper_refusing_a_parked_execution_leaves_no_transaction_open(session):
    wf = _parked_helper(session)

    with pytest.raises(AssertionError, match="parked waiting for"):
        speedrun(wf)

    assert not session.in_transaction()
    assert_waiting_for_signal(wf, "go")
    assert not session.in_transaction()

"""geneva_drive.testing: time travel, runs until a wait, crash injection, history and reload."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from geneva_drive import SystemClock, Workflow, step
from geneva_drive.runtime import housekeeping
from geneva_drive.runtime.configure import configured
from geneva_drive.testing import (
    SimulatedCrash,
    advance_and_run,
    assert_waiting_for_signal,
    crash_next_step,
    history,
    perform_next_step,
    reload,
    run_due,
    run_until_parked,
    speedrun,
)
from tests.engine._support import other_session
from tests.support.app import AuditEntry, Order

HOUR = timedelta(hours=1)


class TimeTwoSteps(Workflow):
    @step
    def first(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="first"))

    @step(wait=HOUR)
    def second(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="second"))


class TimeWaitsWithTimeout(Workflow):
    @step
    def ask(self) -> None:
        pass

    @step(wait_for="approved", timeout=HOUR)
    def approve(self) -> None:
        pass

    @step
    def after(self) -> None:
        pass


class TimeFailsLater(Workflow):
    @step(wait=60)
    def first(self) -> None:
        raise LookupError("first failed")


class TimeAroundHook(Workflow):
    around_calls = 0

    def around_step_execution(self, execution, proceed):
        type(self).around_calls += 1
        return proceed()

    @step
    def only(self) -> None:
        pass


def _start(session, cls=TimeTwoSteps):
    order = Order()
    session.add(order)
    wf = cls.create(session, hero=order)
    session.commit()
    return wf


def _notes(session, wf) -> list[str]:
    rows = session.execute(select(AuditEntry.note).where(AuditEntry.order_id == int(wf.hero_id)))
    notes = list(rows.scalars())
    session.commit()
    return notes


# -- run_due and advance_and_run -------------------------------------------------------------


def test_run_due_runs_what_is_due_and_leaves_a_waiting_step_alone(session, clock):
    wf = _start(session)

    assert run_due(wf) == 1
    assert history(wf) == [("first", "completed", "success"), ("second", "scheduled", None)]
    assert run_due(wf) == 0  # "second" is due in an hour
    assert wf.state == "ready"


def test_advance_and_run_moves_the_clock_then_runs_what_came_due(session, clock):
    wf = _start(session)
    start = clock.now()
    advance_and_run(wf)

    assert advance_and_run(wf, minutes=59) == 0
    assert advance_and_run(wf, timedelta(minutes=1)) == 1

    assert clock.now() == start + HOUR
    assert wf.state == "finished"
    assert _notes(session, wf) == ["first", "second"]


def test_advance_and_run_fires_a_signal_timeout_and_runs_on(session, clock):
    wf = _start(session, TimeWaitsWithTimeout)
    run_until_parked(wf)
    assert_waiting_for_signal(wf, "approved")

    assert advance_and_run(wf, seconds=HOUR.total_seconds()) == 2  # the timer, then "after"

    assert wf.state == "finished"
    assert history(wf) == [
        ("ask", "completed", "success"),
        ("approve", "skipped", "timed_out"),
        ("approve", "completed", "timed_out"),
        ("after", "completed", "success"),
    ]


def test_run_due_raises_a_steps_error_after_committing_its_outcome(session, clock):
    wf = _start(session, TimeFailsLater)

    with pytest.raises(LookupError, match="first failed"):
        advance_and_run(wf, seconds=60)

    assert wf.state == "paused"
    assert history(wf) == [("first", "failed", "failed")]


def test_advance_and_run_refuses_a_clock_that_is_not_frozen_naming_the_workflow(session):
    wf = _start(session)
    with configured(clock=SystemClock()), pytest.raises(TypeError) as caught:
        advance_and_run(wf, hours=1)

    assert f"TimeTwoSteps id={wf.id}" in str(caught.value)
    assert "FrozenClock" in str(caught.value)
    assert history(wf) == [("first", "scheduled", None)]


# -- run_until_parked -----------------------------------------------------------------------


def test_run_until_parked_stops_at_a_signal_wait_where_speedrun_fails(session, clock):
    wf = _start(session, TimeWaitsWithTimeout)
    with pytest.raises(AssertionError, match="parked waiting"):
        speedrun(wf)

    assert run_until_parked(wf) is wf

    assert wf.state == "ready"
    assert_waiting_for_signal(wf, "approved")
    wf.signal("approved")
    session.commit()
    assert run_until_parked(wf).state == "finished"


def test_run_until_parked_runs_steps_that_are_not_due_yet(session, clock):
    wf = _start(session)
    start = clock.now()

    run_until_parked(wf)

    assert wf.state == "finished"
    assert clock.now() == start  # the hour's wait was skipped, not waited out
    assert _notes(session, wf) == ["first", "second"]


# -- crash_next_step ------------------------------------------------------------------------


def test_crash_next_step_leaves_the_execution_in_progress_and_rolls_back_the_body(session, clock):
    wf = _start(session)

    execution = crash_next_step(wf)

    assert execution.state == "in_progress"
    assert execution.lease_expires_at is None
    assert history(wf) == [("first", "in_progress", None)]
    assert _notes(session, wf) == []  # the body ran; its write never committed


def test_a_crashed_step_with_a_lease_is_recovered_after_the_lease_and_runs_again(
    gd, session, clock
):
    wf = _start(session)

    execution = crash_next_step(wf, worker_id="dead-worker", lease=30)

    assert execution.lease_owner == "dead-worker"
    assert execution.lease_expires_at == clock.now() + timedelta(seconds=30)
    clock.advance(seconds=31)
    assert housekeeping.run(gd)["expired_leases_recovered"] == 1
    assert run_due(wf) == 1
    assert history(wf) == [
        ("first", "completed", "recovered"),
        ("first", "completed", "success"),
        ("second", "scheduled", None),
    ]
    assert _notes(session, wf) == ["first"]


def test_crash_next_step_puts_back_the_class_hooks(session, clock):
    plain = _start(session)
    crash_next_step(plain)
    assert "around_step_execution" not in TimeTwoSteps.__dict__

    TimeAroundHook.around_calls = 0
    hooked = _start(session, TimeAroundHook)
    crash_next_step(hooked)
    assert TimeAroundHook.around_calls == 1  # the class's own hook ran inside the crash
    assert TimeAroundHook.__dict__["around_step_execution"].__name__ == "around_step_execution"


def test_crash_next_step_refuses_a_workflow_with_nothing_scheduled(session, clock):
    wf = _start(session)
    speedrun(wf)

    with pytest.raises(AssertionError, match=f"TimeTwoSteps id={wf.id}: crash_next_step needs"):
        crash_next_step(wf)


def test_simulated_crash_is_no_exception_a_policy_could_catch():
    assert not issubclass(SimulatedCrash, Exception)


# -- history and reload ---------------------------------------------------------------------


def test_reload_sees_what_another_session_committed(session, clock):
    wf = _start(session)
    perform_next_step(wf)
    with other_session() as s:
        s.get(Workflow, wf.id).pause()
        s.commit()
    assert wf.state == "ready"  # the object this session holds

    assert reload(wf).state == "paused"
    assert history(wf) == [("first", "completed", "success"), ("second", "scheduled", None)]

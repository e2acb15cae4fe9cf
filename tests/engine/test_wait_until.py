"""Absolute waits: ``@step(wait_until=…)``, and ``wait_until=`` on reattempt, suspend and
skip_to. A datetime is scheduled for exactly that instant; a callable is asked in phase 1,
where a time not reached yet leaves the step scheduled for then, and its mistakes are the
step's errors."""

from __future__ import annotations

import threading
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from geneva_drive import StepConfigurationError, Workflow, resumable_step, step
from geneva_drive.runtime.configure import configured
from geneva_drive.testing import perform_next_step, run_due
from tests.engine._support import current, executions, history

NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)
NINE_IN_BERLIN = datetime(2030, 1, 2, 9, tzinfo=ZoneInfo("Europe/Berlin"))  # 08:00 UTC
SHIP_AT: dict[int, Any] = {}  # what the callable of WaitUntilShip returns, per workflow id


class WaitUntilFixed(Workflow):
    may_proceed_without_hero = True

    @step(wait_until=NINE_IN_BERLIN)
    def ship(self) -> None:
        pass


class WaitUntilShip(Workflow):
    may_proceed_without_hero = True

    @step
    def pack(self) -> None:
        pass

    @step(wait_until=lambda wf: SHIP_AT[wf.id])
    def ship(self) -> None:
        pass


class WaitUntilReattempt(Workflow):
    may_proceed_without_hero = True
    until: Any = NINE_IN_BERLIN

    @step
    def poll(self) -> None:
        if len(self.execution_history) == 1:
            self.reattempt(wait_until=WaitUntilReattempt.until)


class WaitUntilSkipTo(Workflow):
    may_proceed_without_hero = True

    @resumable_step
    def walk(self, it: Any) -> None:
        if it.cursor is None:
            it.skip_to(5, wait_until=NINE_IN_BERLIN)


def _define(**options: Any) -> type[Workflow]:
    body = {
        "may_proceed_without_hero": True,
        "ship": step(lambda self: None, name="ship", **options),
        "__module__": __name__,
    }
    return type("WaitUntilBad", (Workflow,), body)


# --- bad input, at class definition ---------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (datetime(2030, 1, 1, 9), "got the naive datetime 2030-01-01T09:00:00"),
        (float("nan"), "takes an aware datetime .* got float nan"),
        (date(2030, 1, 1), "takes an aware datetime .* got date"),
        (
            datetime(2200, 1, 1, tzinfo=UTC),
            "got 2200-01-01T00:00:00.00:00, more than 100 years ahead",
        ),
        ("2030-01-01T09:00:00Z", "takes an aware datetime .* got str"),
    ],
)
def test_a_wait_until_that_is_no_aware_datetime_is_refused_naming_the_step(value: Any, says: str):
    with pytest.raises(
        StepConfigurationError, match=rf"WaitUntilBad.step 'ship': wait_until= {says}"
    ):
        _define(wait_until=value)


def test_wait_and_wait_until_together_are_refused():
    with pytest.raises(StepConfigurationError, match="takes wait= or wait_until=, not both"):
        _define(wait=60, wait_until=NINE_IN_BERLIN)


def test_a_callable_that_cannot_take_the_workflow_is_refused():
    with pytest.raises(
        StepConfigurationError, match=r"wait_until= must be callable as \(workflow\)"
    ):
        _define(wait_until=lambda: NINE_IN_BERLIN)


# --- a datetime -----------------------------------------------------------------------------


def test_a_step_with_a_datetime_is_scheduled_for_that_instant(gd: Any, clock: Any, session: Any):
    clock.set(NOW)
    wf = WaitUntilFixed.create(session)
    session.commit()
    assert current(session, wf).scheduled_for == NINE_IN_BERLIN  # aware: 08:00 UTC
    assert run_due(wf) == 0  # not due yet
    clock.set(NINE_IN_BERLIN)
    assert run_due(wf) == 1
    assert wf.state == "finished"


def test_a_datetime_already_passed_is_due_at_once(gd: Any, clock: Any, session: Any):
    clock.set(NINE_IN_BERLIN + timedelta(days=1))
    wf = WaitUntilFixed.create(session)
    session.commit()
    assert current(session, wf).scheduled_for == clock.now()


# --- a callable -----------------------------------------------------------------------------


def test_a_callable_is_asked_in_phase_1_and_a_time_ahead_leaves_the_step_scheduled_for_then(
    gd: Any, clock: Any, session: Any
):
    clock.set(NOW)
    wf = WaitUntilShip.create(session)
    session.commit()
    SHIP_AT[wf.id] = NINE_IN_BERLIN
    assert run_due(wf) == 2  # pack; then ship's phase 1, which puts it off until 9:00
    assert history(session, wf) == [("pack", "completed", "success"), ("ship", "scheduled", None)]
    assert current(session, wf).scheduled_for == NINE_IN_BERLIN
    SHIP_AT[wf.id] = NINE_IN_BERLIN + timedelta(hours=1)  # moved: asked again at 9:00
    clock.set(NINE_IN_BERLIN)
    run_due(wf)
    assert current(session, wf).scheduled_for == NINE_IN_BERLIN + timedelta(hours=1)
    clock.advance(hours=1)
    run_due(wf)
    assert wf.state == "finished"


def test_a_callable_returning_a_naive_datetime_is_the_steps_error_naming_it(
    gd: Any, clock: Any, session: Any
):
    clock.set(NOW)
    wf = WaitUntilShip.create(session)
    session.commit()
    SHIP_AT[wf.id] = datetime(2030, 1, 2, 9)
    perform_next_step(wf)
    with pytest.raises(
        ValueError,
        match=r"WaitUntilShip.step 'ship' \(for WaitUntilShip id=\d+\): wait_until= got the naive",
    ):
        perform_next_step(wf)
    assert wf.state == "paused"  # the default exception policy, as for a body's error


# --- flow control ---------------------------------------------------------------------------


def test_reattempt_wait_until_schedules_the_step_again_for_that_instant(
    gd: Any, clock: Any, session: Any
):
    clock.set(NOW)
    wf = WaitUntilReattempt.create(session)
    session.commit()
    perform_next_step(wf)
    assert current(session, wf).scheduled_for == NINE_IN_BERLIN


def test_reattempt_with_a_naive_datetime_is_a_value_error_naming_the_workflow_and_step(
    gd: Any, clock: Any, session: Any, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(WaitUntilReattempt, "until", datetime(2030, 1, 2, 9))
    clock.set(NOW)
    wf = WaitUntilReattempt.create(session)
    session.commit()
    with pytest.raises(
        ValueError,
        match=r"WaitUntilReattempt id=\d+, step 'poll': reattempt\(\): wait_until= got the naive",
    ):
        perform_next_step(wf)


def test_skip_to_wait_until_continues_at_that_instant(gd: Any, clock: Any, session: Any):
    clock.set(NOW)
    wf = WaitUntilSkipTo.create(session)
    session.commit()
    perform_next_step(wf)
    successor = current(session, wf)
    assert (successor.cursor_value, successor.scheduled_for) == (5, NINE_IN_BERLIN)


class _TickingClock:
    """Moves a second forward at every read: a second read would show in the rows."""

    def __init__(self, start: datetime) -> None:
        self._now, self._lock = start, threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            self._now += timedelta(seconds=1)
            return self._now


def test_phase_3_reads_the_clock_once_so_the_wait_lands_exactly_on_the_instant(
    gd: Any, session: Any
):
    with configured(engine=gd.engine, clock=_TickingClock(NOW), backend=gd.backend):
        wf = WaitUntilReattempt.create(session)
        session.commit()
        perform_next_step(wf)
        [first, again] = executions(session, wf)
    assert again.scheduled_for == NINE_IN_BERLIN
    assert again.created_at == first.finished_at  # the one `now` of phase 3

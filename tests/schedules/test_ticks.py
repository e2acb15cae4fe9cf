"""Which ticks a schedule has, and what a due schedule row runs (pure: no database).

Europe/Berlin in 2026/2027: clocks go back on 25 October 2026 (03:00 CEST → 02:00 CET, so
02:00–02:59 happens twice) and forward on 28 March 2027 (02:00 CET → 03:00 CEST, so 02:00–02:59
does not exist).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from geneva_drive import Schedule
from geneva_drive.definition.schedule import ON_TIME
from geneva_drive.engine.schedules import TickPlan, plan_tick

BERLIN = ZoneInfo("Europe/Berlin")


def _checked(schedule: Schedule) -> Schedule:
    schedule.check("Test")
    return schedule


def _ticks(schedule: Schedule, start: datetime, count: int) -> list[datetime]:
    ticks, at = [], start
    for _ in range(count):
        nxt = schedule.next_after(at)
        assert nxt is not None
        ticks.append(nxt)
        at = nxt
    return ticks


def _berlin(
    year: int, month: int, day: int, hour: int, minute: int = 0, *, fold: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=BERLIN, fold=fold).astimezone(UTC)


def test_ticks_are_instants_in_utc_of_the_local_time():
    nightly = _checked(Schedule("0 3 * * *", timezone="Europe/Berlin"))
    assert _ticks(nightly, datetime(2030, 1, 1, 12, tzinfo=UTC), 2) == [
        datetime(2030, 1, 2, 2, tzinfo=UTC),  # 03:00 CET
        datetime(2030, 1, 3, 2, tzinfo=UTC),
    ]


def test_a_tick_in_the_spring_forward_gap_runs_at_the_first_time_after_it():
    half_past_two = _checked(Schedule("30 2 * * *", timezone="Europe/Berlin"))
    ticks = _ticks(half_past_two, _berlin(2027, 3, 27, 12), 3)
    assert ticks == [
        _berlin(2027, 3, 28, 3, 0),  # 02:30 does not exist: 03:00 CEST, once
        _berlin(2027, 3, 29, 2, 30),
        _berlin(2027, 3, 30, 2, 30),
    ]


def test_a_tick_at_a_time_that_happens_twice_runs_once_at_its_first_occurrence():
    half_past_two = _checked(Schedule("30 2 * * *", timezone="Europe/Berlin"))
    ticks = _ticks(half_past_two, _berlin(2026, 10, 24, 12), 2)
    assert ticks == [_berlin(2026, 10, 25, 2, 30, fold=0), _berlin(2026, 10, 26, 2, 30)]
    # Asked again from inside the repeated hour (after the first 02:30), it does not come back.
    assert half_past_two.next_after(_berlin(2026, 10, 25, 2, 10, fold=1)) == _berlin(
        2026, 10, 26, 2, 30
    )
    assert half_past_two.latest_at_or_before(_berlin(2026, 10, 25, 2, 10, fold=1)) == _berlin(
        2026, 10, 25, 2, 30, fold=0
    )


def test_an_hourly_expression_ticks_on_both_repeated_hours_and_skips_the_missing_one():
    hourly = _checked(Schedule("30 * * * *", timezone="Europe/Berlin"))
    autumn = _ticks(hourly, _berlin(2026, 10, 25, 1, 45), 3)
    assert autumn == [
        _berlin(2026, 10, 25, 2, 30, fold=0),
        _berlin(2026, 10, 25, 2, 30, fold=1),  # an hour later: a different instant
        _berlin(2026, 10, 25, 3, 30),
    ]
    spring = _ticks(hourly, _berlin(2027, 3, 28, 1, 45), 1)
    assert spring == [_berlin(2027, 3, 28, 3, 30)]


def test_every_tick_is_after_the_previous_one_through_both_transitions():
    for cron in ("30 2 * * *", "0 * * * *", "*/20 1-3 * * *", "0 3 * * *"):
        schedule = _checked(Schedule(cron, timezone="Europe/Berlin"))
        for start in (_berlin(2026, 10, 24, 0), _berlin(2027, 3, 27, 0)):
            ticks = _ticks(schedule, start, 60)
            assert ticks == sorted(set(ticks)), cron


# --- what a due row runs --------------------------------------------------------------------

NIGHTLY = _checked(Schedule("0 3 * * *", timezone="UTC", missed="run_once"))
NIGHTLY_SKIP = _checked(Schedule("0 3 * * *", timezone="UTC", missed="skip"))
TICK = datetime(2030, 1, 2, 3, tzinfo=UTC)
NEXT = datetime(2030, 1, 3, 3, tzinfo=UTC)


def test_a_tick_seen_within_the_on_time_window_runs_in_either_mode():
    now = TICK + ON_TIME
    assert plan_tick(NIGHTLY, TICK, None, now) == TickPlan(TICK, NEXT)
    assert plan_tick(NIGHTLY_SKIP, TICK, None, now) == TickPlan(TICK, NEXT)


def test_missed_ticks_run_once_for_the_newest_with_run_once():
    now = TICK + timedelta(days=3, hours=1)  # four ticks missed
    newest = TICK + timedelta(days=3)
    assert plan_tick(NIGHTLY, TICK, None, now) == TickPlan(newest, newest + timedelta(days=1))


def test_missed_ticks_are_skipped_with_skip_and_only_the_next_future_tick_is_kept():
    now = TICK + timedelta(days=3, hours=1)
    newest = TICK + timedelta(days=3)
    assert plan_tick(NIGHTLY_SKIP, TICK, None, now) == TickPlan(None, newest + timedelta(days=1))


def test_a_tick_at_or_before_the_last_one_run_never_runs_again():
    assert plan_tick(NIGHTLY, TICK, TICK, TICK + timedelta(minutes=1)) == TickPlan(None, NEXT)

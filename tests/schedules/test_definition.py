"""A schedule is checked when its class is defined: every mistake names the class."""

from __future__ import annotations

import pytest

from geneva_drive import Schedule, StepConfigurationError, Workflow, step
from tests.schedules.apps import NightlyBackfill


def _define(name: str, schedule: object, *, heroless: bool = True) -> type[Workflow]:
    body = {
        "may_proceed_without_hero": heroless,
        "schedule": schedule,
        "work": step(lambda self: None),
        "__module__": __name__,
    }
    return type(name, (Workflow,), body)


@pytest.mark.parametrize(
    ("cron", "says"),
    [
        ("61 * * * *", "Bad minute"),
        ("every night", "Wrong number of fields"),
        ("0 0 30 2 *", "Bad day-of-month"),
        ("", "takes a cron expression"),
    ],
)
def test_a_bad_cron_expression_is_refused_naming_the_class(cron: str, says: str):
    with pytest.raises(StepConfigurationError, match=f"SchedBadCron.schedule: .*{says}"):
        _define("SchedBadCron", Schedule(cron))


def test_an_unknown_time_zone_is_refused_naming_the_class_and_the_zone():
    with pytest.raises(
        StepConfigurationError, match=r"SchedBadZone.schedule: unknown time zone 'Europe/Berlln'"
    ):
        _define("SchedBadZone", Schedule("0 3 * * *", timezone="Europe/Berlln"))


def test_a_missed_value_other_than_run_once_or_skip_is_refused():
    with pytest.raises(
        StepConfigurationError,
        match=r"SchedBadMissed.schedule: missed='all' is neither 'run_once' .* nor 'skip'",
    ):
        _define("SchedBadMissed", Schedule("0 3 * * *", missed="all"))  # type: ignore[arg-type]


def test_a_schedule_that_is_not_a_schedule_object_is_refused():
    with pytest.raises(StepConfigurationError, match=r"SchedString.schedule: expected Schedule"):
        _define("SchedString", "0 3 * * *")


def test_a_scheduled_class_must_proceed_without_a_hero():
    with pytest.raises(
        StepConfigurationError,
        match=r"SchedWithHero.schedule: .* set may_proceed_without_hero = True",
    ):
        _define("SchedWithHero", Schedule("0 3 * * *"), heroless=False)


def test_a_subclass_does_not_inherit_its_parents_schedule():
    child: type[Workflow] = type("SchedNightlyChild", (NightlyBackfill,), {"__module__": __name__})
    assert NightlyBackfill._schedule == Schedule(
        "0 3 * * *", timezone="Europe/Berlin", missed="run_once"
    )
    assert child._schedule is None

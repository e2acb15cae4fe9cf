"""Scheduled workflow classes for the schedule tests (module level: worker processes import
them by name)."""

from __future__ import annotations

from geneva_drive import Schedule, Workflow, step

RAN: list[object] = []  # the scheduled_tick each run saw (in-process runs)


class NightlyBackfill(Workflow):
    may_proceed_without_hero = True
    schedule = Schedule("0 3 * * *", timezone="Europe/Berlin", missed="run_once")

    @step
    def backfill(self) -> None:
        RAN.append(self.scheduled_tick)


class HalfPastTwo(Workflow):
    """At 02:30 Berlin time: the hour that does not exist in spring and happens twice in
    autumn."""

    may_proceed_without_hero = True
    schedule = Schedule("30 2 * * *", timezone="Europe/Berlin", missed="skip")

    @step
    def work(self) -> None:
        RAN.append(self.scheduled_tick)


class EveryFifteenMinutes(Workflow):
    may_proceed_without_hero = True
    schedule = Schedule("*/15 * * * *", missed="skip")

    @step
    def work(self) -> None:
        RAN.append(self.scheduled_tick)

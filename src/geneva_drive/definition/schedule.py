"""``Schedule``: a cron expression in a time zone, set as ``schedule = …`` on a workflow class.

The expression is parsed and evaluated by ``cronsim`` (never by hand); it is checked with its
time zone when the class is defined. This module only answers "which ticks" — pure functions
of an instant; the database side (one workflow per tick) is ``engine.schedules``.

Times: a tick is an instant, stored in UTC. The expression is evaluated in the schedule's time
zone, with cronsim's (Debian cron's) daylight-saving rules for expressions that name a fixed
minute and hour ("30 2 * * *"):

- spring forward (Europe/Berlin, last Sunday of March: 02:00 → 03:00): a tick at a local time
  that does not exist runs at the first local time after the gap (02:30 runs at 03:00 CEST);
- fall back (last Sunday of October: 03:00 → 02:00): a local time that happens twice ticks
  once, at its first occurrence (02:30 CEST, not 02:30 CET again an hour later).

Expressions with ``*`` in the minute or hour field ("*/15 * * * *", "0 * * * *") tick on every
matching wall-clock time that exists, as the clock passes it: both 02:00s on the fall-back
night, none in the spring-forward gap. Whatever the expression, :meth:`Schedule.next_after`
only ever returns an instant *after* the one it is given, so no tick is returned twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from geneva_drive.core.errors import StepConfigurationError

MISSED = ("run_once", "skip")
Missed = Literal["run_once", "skip"]
# A tick older than this when a worker first sees it due counts as missed (workers were down,
# or the schedule was paused): ``missed=`` decides whether it still runs. Younger ones are
# merely late (a worker looks for due ticks at every heartbeat) and run in either mode.
ON_TIME = timedelta(minutes=5)
# How many ticks forward next_after() walks past ones at or before the given instant (only a
# daylight-saving fall-back makes cronsim return one) before giving up.
_MAX_STEPS = 10_000


class Schedule:
    """Create a workflow of the class at every tick of ``cron`` in ``timezone``.

    ``missed``: what a worker does with ticks that passed while no worker ran or while the
    schedule was paused — ``"skip"`` runs none of them, only the next future tick;
    ``"run_once"`` creates one workflow, for the newest missed tick.
    """

    __slots__ = ("cron", "missed", "timezone", "zone")

    def __init__(self, cron: str, *, timezone: str = "UTC", missed: Missed = "skip") -> None:
        self.cron = cron
        self.timezone = timezone
        self.missed = missed
        self.zone: ZoneInfo | None = None  # set by check()

    def check(self, owner: str) -> None:
        """Refuse a bad expression, time zone or ``missed=``, naming ``owner`` (the class)."""
        where = f"{owner}.schedule"
        if not isinstance(self.cron, str) or not self.cron.strip():
            raise StepConfigurationError(
                f"{where}: Schedule() takes a cron expression such as '0 3 * * *' (minute "
                f"hour day-of-month month day-of-week), got {self.cron!r}"
            )
        if self.missed not in MISSED:
            raise StepConfigurationError(
                f"{where}: missed={self.missed!r} is neither 'run_once' (one workflow for the "
                "newest missed tick) nor 'skip' (only the next future tick)"
            )
        self.zone = _zone(where, self.timezone)
        from cronsim import CronSim, CronSimError  # only classes with a schedule pay for it

        try:
            next(CronSim(self.cron, datetime(2000, 1, 1, tzinfo=self.zone)))
        except CronSimError as error:
            raise StepConfigurationError(
                f"{where}: the cron expression {self.cron!r} is not valid ({error}); expected "
                "5 fields, minute hour day-of-month month day-of-week, such as '0 3 * * *'"
            ) from None
        except StopIteration:
            raise StepConfigurationError(
                f"{where}: the cron expression {self.cron!r} never matches a date; check its "
                "day-of-month and month"
            ) from None

    # -- ticks (instants in UTC) ----------------------------------------------------------

    def next_after(self, instant: datetime) -> datetime | None:
        """The first tick strictly after ``instant``; None if there is none within 50 years."""
        for tick in self._forward(instant):
            if tick > instant:
                return tick
        return None

    def latest_at_or_before(self, instant: datetime) -> datetime | None:
        """The newest tick at or before ``instant`` (None if none within 50 years).

        cronsim's reverse walk, then corrected forward: reversing over a fall-back night can
        land on the day before.
        """
        from cronsim import CronSim

        local = instant.astimezone(self._zone())
        try:
            candidate = next(CronSim(self.cron, local + timedelta(seconds=1), reverse=True))
        except StopIteration:
            return None
        latest = candidate.astimezone(UTC)
        if latest > instant:  # never expected; be safe rather than run a future tick
            return None
        while True:
            following = self.next_after(latest)
            if following is None or following > instant:
                return latest
            latest = following

    def _forward(self, instant: datetime) -> Iterator[datetime]:
        from cronsim import CronSim

        ticks = CronSim(self.cron, instant.astimezone(self._zone()))
        for _ in range(_MAX_STEPS):
            try:
                yield next(ticks).astimezone(UTC)
            except StopIteration:
                return

    def _zone(self) -> ZoneInfo:
        if self.zone is None:
            self.zone = _zone("Schedule", self.timezone)
        return self.zone

    def describe(self) -> str:
        return f"{self.cron} ({self.timezone}, missed={self.missed})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schedule):
            return NotImplemented
        return (self.cron, self.timezone, self.missed) == (other.cron, other.timezone, other.missed)

    def __hash__(self) -> int:
        return hash((self.cron, self.timezone, self.missed))

    def __repr__(self) -> str:
        return f"Schedule({self.cron!r}, timezone={self.timezone!r}, missed={self.missed!r})"


def _zone(where: str, name: Any) -> ZoneInfo:
    if not isinstance(name, str) or not name:
        raise StepConfigurationError(
            f"{where}: timezone= takes an IANA time zone name such as 'Europe/Berlin' or "
            f"'UTC', got {name!r}"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise StepConfigurationError(
            f"{where}: unknown time zone {name!r}; use an IANA name such as 'Europe/Berlin' "
            "or 'UTC' (and install the tzdata package where the system has no zone database)"
        ) from None

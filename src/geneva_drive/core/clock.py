"""Where geneva-drive gets the time from.

Every timestamp the library writes comes from ``Clock.now()`` so that tests can freeze and move
time (``FrozenClock``) instead of sleeping. All times are timezone-aware UTC.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    """The real time, in UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def __repr__(self) -> str:
        return "SystemClock()"


class FrozenClock:
    """A clock that stands still until told to move. Thread-safe."""

    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
        if start.tzinfo is None:
            raise ValueError(f"FrozenClock needs a timezone-aware start time, got {start!r}")
        self._now = start.astimezone(UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, delta: timedelta | float | None = None, **kwargs: float) -> datetime:
        """Move forward by ``delta`` (a timedelta or seconds) or timedelta keyword arguments."""
        step = to_timedelta(delta) if delta is not None else timedelta(**kwargs)
        with self._lock:
            self._now += step
            return self._now

    def set(self, moment: datetime) -> None:
        with self._lock:
            self._now = moment.astimezone(UTC)

    def __repr__(self) -> str:
        return f"FrozenClock({self._now.isoformat()})"


def to_timedelta(value: timedelta | float | int) -> timedelta:
    if isinstance(value, timedelta):
        return value
    return timedelta(seconds=value)

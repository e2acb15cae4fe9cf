"""Absolute waits: the checks a ``wait_until`` value passes, wherever it is given.

``@step(wait_until=…)``, ``self.reattempt(wait_until=…)``, ``self.suspend(wait_until=…)`` and
``it.skip_to(value, wait_until=…)`` take an aware ``datetime``; the step option also takes a
callable of the workflow returning one. A naive datetime (which instant would it be?), any
other type — a number, ``float("nan")``, a ``date`` — and a date more than 100 years ahead (a
unit mistake, not a plan) are refused, naming where it was given.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

MAX_AHEAD = timedelta(days=36525)  # 100 years


def until_problem(value: Any, now: datetime | None = None) -> str | None:
    """What is wrong with ``value`` as an absolute wait, or None. ``now``: the instant the
    100-year bound is counted from (the real time when not given)."""
    if not isinstance(value, datetime):
        return (
            f"takes an aware datetime (e.g. datetime(2030, 1, 1, 9, tzinfo=ZoneInfo("
            f"'Europe/Berlin'))), got {type(value).__name__} {value!r:.60}"
        )
    if value.tzinfo is None or value.utcoffset() is None:
        return (
            f"got the naive datetime {value.isoformat()}, which names no instant; give it a "
            "tzinfo (datetime.now(UTC), or ZoneInfo('Europe/Berlin') for a local time)"
        )
    reference = now if now is not None else datetime.now(UTC)
    if value - reference > MAX_AHEAD:
        return f"got {value.isoformat()}, more than 100 years ahead; check the date's units"
    return None


def checked_until(value: Any, where: str, now: datetime | None = None) -> datetime:
    """``value`` as an aware UTC datetime; a ``ValueError`` naming ``where`` if it is not one."""
    problem = until_problem(value, now)
    if problem is not None:
        raise ValueError(f"{where}: wait_until= {problem}")
    checked: datetime = value
    return checked.astimezone(UTC)


def delay_until(until: datetime | None, now: datetime) -> timedelta | None:
    """How long from ``now`` to ``until`` (None: due now — a time passed is due at once)."""
    if until is None or until <= now:
        return None
    return until - now

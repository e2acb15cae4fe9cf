"""How values look on the page: times, ages, durations, JSON. Pure functions,
registered as Jinja filters in ``app.py``; their output is escaped like any other value."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any


def timestamp(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


def seconds(value: float | None) -> str:
    """A duration, as an operator reads it: 340 ms, 12.5 s, 4 min 10 s, 3 h 5 min, 2 d 4 h."""
    if value is None:
        return "—"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    whole = int(value)
    for unit, size, sub_unit, sub_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "min", 60),
        ("min", 60, "s", 1),
    ):
        if whole >= size:
            rest = (whole % size) // sub_size
            return f"{whole // size} {unit}" + (f" {rest} {sub_unit}" if rest else "")
    return f"{whole} s"  # pragma: no cover - the loop always returns for value >= 60


def age(value: datetime | None, now: datetime) -> str:
    """How long ago (or, for a future time, in how long)."""
    if value is None:
        return "—"
    delta = (now - value).total_seconds()
    return f"{seconds(delta)} ago" if delta >= 0 else f"in {seconds(-delta)}"


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


def number(value: int) -> str:
    return f"{value:,}"

"""How values look on the page: times, ages, durations, JSON. Pure functions,
registered as Jinja filters in ``app.py``; their output is escaped like any other value."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from geneva_drive.admin.act import describe_change

# What an operator action records besides its arguments (the timeline says them in words).
ACTION_RECORD = frozenset({"state_before", "state_after", "step_before", "step_after", "detail"})


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


def action_change(detail: Mapping[str, Any]) -> str:
    """An operator action's change in words, as its flash message said it (``at approve → at
    done``), from the detail it recorded; actions recorded before steps were, say states only."""
    if "state_before" not in detail:
        return ""
    return describe_change(
        str(detail["state_before"]),
        str(detail.get("state_after", detail["state_before"])),
        detail.get("step_before"),
        detail.get("step_after"),
    )

"""Which workflows an admin query is about: :class:`WorkflowFilter`, and its parsing."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from geneva_drive.core import text
from geneva_drive.core.errors import AdminInputError
from geneva_drive.core.states import WorkflowState
from geneva_drive.storage.queries.admin import Selection

# Short spellings accepted by parse() (and the CLI's --where), beside the field names.
ALIASES = {
    "type": "workflow_type",
    "class": "workflow_type",
    "step": "current_step",
    "error": "error_class",
    "signal": "awaiting_signal",
    "failed": "has_failed_execution",
    "id": "ids",
}


@dataclass(frozen=True)
class WorkflowFilter(Selection):
    """Every field narrows the selection; None means any. A tuple: any of its values.
    The fields are those of the query layer's :class:`Selection`; this adds their parsing."""

    @classmethod
    def parse(cls, items: Sequence[str]) -> WorkflowFilter:
        """``["state=paused", "type=Onboarding", "created_after=2026-12-01T00:00"]``.

        ``a,b`` gives several values where a field takes a tuple; times are ISO 8601 (UTC
        unless they say otherwise); ``hero=Order:42`` sets both hero fields.
        """
        values: dict[str, Any] = {}
        for item in items:
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise AdminInputError(
                    f"filter {item!r}: expected key=value, e.g. state=paused or type=Onboarding"
                )
            raw = raw.strip()
            if key == "hero":
                hero_type, colon, hero_id = raw.partition(":")
                if not colon or not hero_type or not hero_id:
                    raise AdminInputError(
                        f"filter {item!r}: hero= takes Type:id, e.g. hero=Order:42"
                    )
                values.update(hero_type=hero_type, hero_id=hero_id)
                continue
            name = ALIASES.get(key, key)
            if name not in _PARSERS:
                raise AdminInputError(f"filter {item!r}: unknown key {key!r}; {_suggest(key)}")
            values[name] = _PARSERS[name](name, raw)
        return cls(**values)

    def __post_init__(self) -> None:
        for name in _TEXT_FIELDS:
            value = getattr(self, name)
            for one in (value,) if isinstance(value, str) else value or ():
                problem = text.describe(one) if isinstance(one, str) else None
                if problem is not None:
                    # No stored text holds one (core.text refuses it on the way in), and
                    # PostgreSQL would refuse the query: an input error, never a DataError.
                    raise AdminInputError(
                        f"WorkflowFilter({name}={value!r}): holds {problem}, which no stored "
                        "value can hold (geneva-drive refuses NUL and lone surrogates on every "
                        "database); remove it"
                    )
        for name in ("state",):
            value = getattr(self, name)
            for state in (value,) if isinstance(value, str) else value or ():
                if state not in _STATES:
                    raise AdminInputError(
                        f"WorkflowFilter(state={value!r}): {state!r} is not a workflow state; "
                        f"use one of {', '.join(_STATES)}"
                    )
        for name in (
            "created_after",
            "created_before",
            "transitioned_after",
            "transitioned_before",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
                raise AdminInputError(
                    f"WorkflowFilter({name}={value!r}): expected a timezone-aware datetime, "
                    "e.g. datetime(2026, 12, 1, tzinfo=UTC)"
                )


_STATES = tuple(state.value for state in WorkflowState)
_TEXT_FIELDS = (
    "workflow_type",
    "state",
    "hero_type",
    "hero_id",
    "current_step",
    "error_class",
    "awaiting_signal",
)


def _text(name: str, raw: str) -> str:
    if not raw:
        raise AdminInputError(f"filter {name}=: expected a value after '='")
    return raw


def _texts(name: str, raw: str) -> str | tuple[str, ...]:
    parts = tuple(part.strip() for part in raw.split(",") if part.strip())
    if not parts:
        raise AdminInputError(f"filter {name}=: expected a value after '=' (a,b for several)")
    return parts[0] if len(parts) == 1 else parts


def _when(name: str, raw: str) -> datetime:
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise AdminInputError(
            f"filter {name}={raw!r}: expected an ISO 8601 time, e.g. 2026-12-01T03:00 "
            "(UTC unless an offset is given)"
        ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _flag(name: str, raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("true", "yes", "1"):
        return True
    if lowered in ("false", "no", "0"):
        return False
    raise AdminInputError(f"filter {name}={raw!r}: expected true or false")


def _ids(name: str, raw: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        raise AdminInputError(
            f"filter {name}={raw!r}: expected workflow ids, e.g. ids=12,15"
        ) from None


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "workflow_type": _texts,
    "state": _texts,
    "hero_type": _text,
    "hero_id": _text,
    "current_step": _text,
    "error_class": _text,
    "awaiting_signal": _text,
    "created_after": _when,
    "created_before": _when,
    "transitioned_after": _when,
    "transitioned_before": _when,
    "has_failed_execution": _flag,
    "ids": _ids,
}


def _suggest(key: str) -> str:
    known = [*_PARSERS, *ALIASES, "hero"]
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}known keys: {', '.join(sorted(known))}"


__all__ = ["AdminInputError", "WorkflowFilter"]

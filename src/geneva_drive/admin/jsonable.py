"""``to_json``: admin results as JSON-ready values."""

from __future__ import annotations

import dataclasses
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any
from uuid import UUID


def to_json(value: Any) -> Any:
    """Dataclasses become dicts, datetimes ISO 8601 strings, tuples lists.

    Other values a cursor or metadata may hold: enums their value, durations seconds,
    Decimal/UUID and anything else unknown their ``str()``.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return to_json(value.value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_json(v) for v in value]
    if isinstance(value, Decimal | UUID):
        return str(value)
    return str(value)

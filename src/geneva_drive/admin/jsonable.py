"""``to_json``: admin results as JSON-ready values."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any


def to_json(value: Any) -> Any:
    """Dataclasses become dicts, datetimes ISO 8601 strings, tuples lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value

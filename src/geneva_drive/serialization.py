"""Typed JSON for payloads, cursors and metadata — never pickle.

Plain JSON values pass through unchanged. Values JSON cannot express are wrapped in a one-key
object ``{"__gd__": [tag, value]}`` so they come back as the same Python type: datetime, date,
time, timedelta, Decimal, UUID, enums (by import path), tuples, sets, dicts with non-string keys
are refused. Encoding is deterministic (sorted keys, compact), so byte-size limits are stable.
"""

from __future__ import annotations

import importlib
import json
import uuid
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any

from .errors import SerializationError

_TAG = "__gd__"


def encode(value: Any) -> Any:
    """Turn ``value`` into plain JSON-compatible data (with typed wrappers)."""
    if isinstance(value, Enum):  # before str/int: a StrEnum or IntEnum member is both
        cls = type(value)
        return {_TAG: ["enum", f"{cls.__module__}:{cls.__qualname__}", encode(value.value)]}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime):
        return {_TAG: ["datetime", value.isoformat()]}
    if isinstance(value, date):
        return {_TAG: ["date", value.isoformat()]}
    if isinstance(value, time):
        return {_TAG: ["time", value.isoformat()]}
    if isinstance(value, timedelta):
        return {_TAG: ["timedelta", value.total_seconds()]}
    if isinstance(value, Decimal):
        return {_TAG: ["decimal", str(value)]}
    if isinstance(value, uuid.UUID):
        return {_TAG: ["uuid", str(value)]}
    if isinstance(value, tuple):
        return {_TAG: ["tuple", [encode(v) for v in value]]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        if _TAG in value:  # it would read back as a typed wrapper, not as this dict
            raise SerializationError(
                f"cannot store a dict with the key {_TAG!r}: geneva-drive reserves it for typed "
                "values; rename that key"
            )
        out: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(key, Enum):
                key = key.value
            if not isinstance(key, str):
                raise SerializationError(
                    f"cannot store a dict key {key!r} of type {type(key).__name__}: "
                    "JSON object keys must be strings; convert the keys with str() first"
                )
            out[key] = encode(item)
        return out
    raise SerializationError(
        f"cannot store a value of type {type(value).__name__} ({value!r}) as JSON; supported: "
        "None, bool, int, float, str, list, tuple, dict with str keys, datetime, date, time, "
        "timedelta, Decimal, UUID and Enum members"
    )


def decode(data: Any) -> Any:
    """Inverse of :func:`encode`."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if isinstance(data, dict):
        if len(data) == 1 and _TAG in data:
            return _decode_tagged(data[_TAG])
        return {k: decode(v) for k, v in data.items()}
    return data


def _decode_tagged(tagged: list[Any]) -> Any:
    tag, *rest = tagged
    if tag == "datetime":
        return datetime.fromisoformat(rest[0])
    if tag == "date":
        return date.fromisoformat(rest[0])
    if tag == "time":
        return time.fromisoformat(rest[0])
    if tag == "timedelta":
        return timedelta(seconds=rest[0])
    if tag == "decimal":
        return Decimal(rest[0])
    if tag == "uuid":
        return uuid.UUID(rest[0])
    if tag == "tuple":
        return tuple(decode(v) for v in rest[0])
    if tag == "enum":
        module_name, _, qualname = rest[0].partition(":")
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
        return target(decode(rest[1]))
    raise SerializationError(f"unknown typed JSON tag {tag!r}")


def dumps(value: Any) -> str:
    """Encode to a compact, deterministic JSON string."""
    return json.dumps(encode(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def encoded_size(value: Any) -> int:
    """Bytes of the UTF-8 JSON that would be stored for ``value``."""
    return len(dumps(value).encode())

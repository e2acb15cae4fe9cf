"""Typed JSON for payloads, cursors and metadata — never pickle.

Plain JSON values pass through unchanged. Values JSON cannot express are wrapped in a one-key
object ``{"__gd__": [tag, value]}`` so they come back as the same Python type: datetime, date,
time, timedelta, Decimal, UUID, enums (by import path), tuples; sets and dicts with non-string
keys are refused. Encoding is deterministic (sorted keys, compact), so byte-size limits are
stable.

A mapped SQLAlchemy instance (an ``Order``, a ``User``) is stored as a *reference*: its class
name and primary key, ``{"__gd__": ["record", "Order", 42]}`` — never its columns, which would
go stale. Decoding is lazy, because loading a row needs a session:

- ``decode(data, session=s)`` loads the instance with ``s.get(...)`` (``None`` if the row was
  deleted since);
- inside ``with decoding_session(s):`` the same happens without passing ``session=`` —
  geneva-drive does this around signal matchers and step bodies, so
  ``self.received_signal.payload["order"]`` is the ``Order`` itself, loaded in the step's
  session;
- anywhere else a :class:`Reference` comes back; ``ref.resolve(session)`` loads it.

The class is found by name among the mapped classes of the process (as for heroes), so the
module defining it must be imported; single-column primary keys only.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from typing import TYPE_CHECKING, Any

from sqlalchemy import inspect as sa_inspect
from sqlalchemy.exc import NoInspectionAvailable

from .errors import SerializationError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

_TAG = "__gd__"
# The session references decode into when ``decode()`` is not handed one (see the docstring).
_SESSION: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "geneva_drive_decoding_session", default=None
)


@dataclass(frozen=True)
class Reference:
    """A stored mapped instance that has not been loaded: class name and primary key."""

    class_name: str
    key: Any

    def resolve(self, session: Session) -> Any:
        """The instance, loaded in ``session``; None if its row no longer exists."""
        from .workflow import resolve_hero_class  # late: workflow imports this module

        return session.get(resolve_hero_class(self.class_name), self.key)


@contextlib.contextmanager
def decoding_session(session: Session | None) -> Iterator[None]:
    """Within the block, ``decode()`` loads stored references in ``session``."""
    token = _SESSION.set(session)
    try:
        yield
    finally:
        _SESSION.reset(token)


def _mapped_reference(value: Any) -> list[Any] | None:
    """``["record", class name, key]`` for a mapped instance; None for anything else."""
    if isinstance(value, type):
        return None
    try:
        state = sa_inspect(value)
    except NoInspectionAvailable:
        return None
    mapper = getattr(state, "mapper", None)
    if mapper is None:
        return None
    name = type(value).__name__
    if len(mapper.primary_key) != 1:
        raise SerializationError(
            f"cannot store a reference to {name} {value!r}: it has a composite primary key, "
            "and references need a single-column key; store the key values instead"
        )
    identity = state.identity
    if identity is None:
        raise SerializationError(
            f"cannot store a reference to {name} {value!r}: it has no primary key yet; add it "
            "to the session and flush() first"
        )
    return ["record", name, encode(identity[0])]


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
    reference = None if isinstance(value, dict) else _mapped_reference(value)
    if reference is not None:
        return {_TAG: reference}
    if isinstance(value, Reference):  # an unloaded reference is stored as it was
        return {_TAG: ["record", value.class_name, encode(value.key)]}
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
        "timedelta, Decimal, UUID, Enum members and mapped SQLAlchemy instances"
    )


def decode(data: Any, *, session: Session | None = None) -> Any:
    """Inverse of :func:`encode`; references load in ``session`` (or the decoding session)."""
    return _decode(data, session if session is not None else _SESSION.get())


def _decode(data: Any, session: Session | None) -> Any:
    if isinstance(data, list):
        return [_decode(v, session) for v in data]
    if isinstance(data, dict):
        if len(data) == 1 and _TAG in data:
            return _decode_tagged(data[_TAG], session)
        return {k: _decode(v, session) for k, v in data.items()}
    return data


def _decode_tagged(tagged: list[Any], session: Session | None) -> Any:
    tag, *rest = tagged
    if tag == "record":
        reference = Reference(rest[0], _decode(rest[1], None))
        return reference if session is None else reference.resolve(session)
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
        return tuple(_decode(v, session) for v in rest[0])
    if tag == "enum":
        module_name, _, qualname = rest[0].partition(":")
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
        return target(_decode(rest[1], None))
    raise SerializationError(f"unknown typed JSON tag {tag!r}")


def dumps(value: Any) -> str:
    """Encode to a compact, deterministic JSON string."""
    return json.dumps(encode(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def encoded_size(value: Any) -> int:
    """Bytes of the UTF-8 JSON that would be stored for ``value``."""
    return len(dumps(value).encode())

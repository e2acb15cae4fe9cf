"""Typed JSON for payloads, cursors and metadata — never pickle.

Plain JSON values pass through unchanged. Values JSON cannot express are wrapped in a one-key
object ``{"__gd__": [tag, value]}`` so they come back as the same Python type: datetime, date,
time, timedelta, Decimal, UUID, enums (by import path), tuples; sets and dicts with non-string
keys are refused. Encoding is deterministic (sorted keys, compact), so byte-size limits are
stable.

A mapped SQLAlchemy instance (an ``Order``, a ``User``) is stored as a *reference*: its class
name and primary key, ``{"__gd__": ["record", "Order", 42]}`` — never its columns, which would
go stale. The name is the one ``hero_type`` would store (``__hero_type__`` if the class
declares one; refused if two mapped classes share it, see ``storage.heroes``). Decoding is
lazy, because loading a row needs a session:

- ``decode(data, session=s)`` loads the instance with ``s.get(...)`` (``None`` if the row was
  deleted since);
- inside ``with decoding_session(s):`` the same happens without passing ``session=`` —
  geneva-drive does this around signal matchers and step bodies, so
  ``self.received_signal.payload["order"]`` is the ``Order`` itself, loaded in the step's
  session;
- anywhere else a :class:`Reference` comes back; ``ref.resolve(session)`` loads it.

The class is found by that name among the mapped classes of the process (as for heroes), so
the module defining it must be imported; single-column primary keys only.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import json
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from typing import TYPE_CHECKING, Any

from sqlalchemy import inspect as sa_inspect
from sqlalchemy.exc import NoInspectionAvailable

from geneva_drive.core import text
from geneva_drive.core.errors import (
    SerializationError,
    StepConfigurationError,
    UnstorableTextError,
)
from geneva_drive.storage.heroes import checked_hero_type, resolve_hero_class

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

_TAG = "__gd__"
# The deepest nesting stored, counted in JSON containers as written (typed wrappers included).
# MariaDB's JSON functions — and with them the json_valid() check on its JSON columns — stop at
# 32 levels; this leaves room for the object the library wraps metadata values in.
MAX_DEPTH = 24
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
        return session.get(resolve_hero_class(self.class_name), self.key)


@contextlib.contextmanager
def decoding_session(session: Session | None) -> Iterator[None]:
    """Within the block, ``decode()`` loads stored references in ``session``."""
    token = _SESSION.set(session)
    try:
        yield
    finally:
        _SESSION.reset(token)


def _mapped_reference(value: Any, depth: int) -> list[Any] | None:
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
    try:
        stored = checked_hero_type(type(value))
    except StepConfigurationError as error:  # a name two classes share, a bad __hero_type__
        raise SerializationError(f"cannot store a reference to {name} {value!r}: {error}") from None
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
    return ["record", stored, _encode(identity[0], depth)]


class _Misplaced(SerializationError):
    """Raised inside the codec; :func:`encode` turns it into a ``kind`` with a path."""

    def __init__(self, reason: str, kind: type[SerializationError] = SerializationError) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        self.path: list[str] = []


def encode(value: Any) -> Any:
    """Turn ``value`` into plain JSON-compatible data (with typed wrappers).

    Refused, before anything is written: values JSON has no form for (NaN, ±Infinity, sets,
    arbitrary objects), nesting deeper than :data:`MAX_DEPTH`, and strings or keys holding
    text no database can store (NUL, lone surrogates: :class:`UnstorableTextError`, see
    :mod:`geneva_drive.core.text`).
    """
    try:
        return _encode(value, 0)
    except _Misplaced as error:
        where = "".join(reversed(error.path))
        at = f" (at value{where})" if where else ""
        raise error.kind(f"{error.reason}{at}") from None


def _encode(value: Any, depth: int) -> Any:
    """``value`` encoded as if ``depth`` JSON containers enclosed it."""
    if isinstance(value, Enum):  # before str/int: a StrEnum or IntEnum member is both
        cls = type(value)
        path = f"{cls.__module__}:{cls.__qualname__}"
        return {_TAG: ["enum", path, _encode(value.value, _nest(depth, 2))]}
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Misplaced(
                f"cannot store the float {value!r}: JSON has no NaN or Infinity (SQLite would "
                "store invalid JSON, PostgreSQL and MariaDB refuse it); store None, a bound, or "
                "a string instead"
            )
        return value
    if isinstance(value, str):
        _check_text(value, "string")
        return value
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, list):
        inner = _nest(depth, 1)
        return [_item(v, inner, f"[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return _encode_dict(value, _nest(depth, 1))
    tagged = _encode_tagged(value, depth)
    if tagged is not None:
        return {_TAG: tagged}
    raise _Misplaced(
        f"cannot store a value of type {type(value).__name__} ({value!r}) as JSON; supported: "
        "None, bool, int, float, str, list, tuple, dict with str keys, datetime, date, time, "
        "timedelta, Decimal, UUID, Enum members and mapped SQLAlchemy instances"
    )


def _nest(depth: int, levels: int) -> int:
    """The depth inside ``levels`` more containers; refuses to go beyond MAX_DEPTH."""
    depth += levels
    if depth > MAX_DEPTH:
        raise _Misplaced(
            f"cannot store a value nested more than {MAX_DEPTH} levels deep (typed values such "
            "as tuples and datetimes count two levels of their own); flatten it, or store a "
            "reference to the data instead"
        )
    return depth


def _check_text(value: str, what: str) -> None:
    problem = text.describe(value)
    if problem is not None:
        raise _Misplaced(
            f"cannot store the {what} {value!r:.80}: it holds {problem}; {text.RULE}",
            UnstorableTextError,
        )


def _item(value: Any, depth: int, step: str) -> Any:
    try:
        return _encode(value, depth)
    except _Misplaced as error:
        error.path.append(step)
        raise


def _encode_tagged(value: Any, depth: int) -> list[Any] | None:
    """The ``[tag, ...]`` list of a typed wrapper, or None for a type without one."""
    if isinstance(value, datetime):
        _nest(depth, 2)
        return ["datetime", value.isoformat()]
    if isinstance(value, date):
        _nest(depth, 2)
        return ["date", value.isoformat()]
    if isinstance(value, time):
        _nest(depth, 2)
        return ["time", value.isoformat()]
    if isinstance(value, timedelta):
        _nest(depth, 2)
        return ["timedelta", value.total_seconds()]
    if isinstance(value, Decimal):
        _nest(depth, 2)
        return ["decimal", str(value)]
    if isinstance(value, uuid.UUID):
        _nest(depth, 2)
        return ["uuid", str(value)]
    if isinstance(value, tuple):
        inner = _nest(depth, 3)
        return ["tuple", [_item(v, inner, f"[{i}]") for i, v in enumerate(value)]]
    if isinstance(value, Reference):  # an unloaded reference is stored as it was
        return ["record", value.class_name, _encode(value.key, _nest(depth, 2))]
    try:
        return _mapped_reference(value, _nest(depth, 2))
    except SerializationError as error:
        if isinstance(error, _Misplaced):
            raise
        raise _Misplaced(str(error)) from None


def _encode_dict(value: dict[Any, Any], depth: int) -> dict[str, Any]:
    if _TAG in value:  # it would read back as a typed wrapper, not as this dict
        raise _Misplaced(
            f"cannot store a dict with the key {_TAG!r}: geneva-drive reserves it for typed "
            "values; rename that key"
        )
    out: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(key, Enum):
            key = key.value
        if not isinstance(key, str):
            raise _Misplaced(
                f"cannot store a dict key {key!r} of type {type(key).__name__}: "
                "JSON object keys must be strings; convert the keys with str() first"
            )
        _check_text(key, "dict key")
        out[key] = _item(item, depth, f"[{key!r}]")
    return out


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

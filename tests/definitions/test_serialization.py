"""The typed JSON codec for payloads, cursors and metadata (no database)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from enum import Enum, IntEnum, StrEnum

import pytest

from geneva_drive import SerializationError
from geneva_drive.storage.serialization import decode, dumps, encode, encoded_size


class SerializationColour(StrEnum):
    RED = "red"
    BLUE = "blue"


class SerializationLevel(IntEnum):
    LOW = 1
    HIGH = 2


class SerializationPlain(Enum):
    ONE = (1, "one")


def _round_trip(value):
    """Encode, go through real JSON text, decode."""
    return decode(json.loads(json.dumps(encode(value))))


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, -7, 3.25, "", "héllo ✓", [1, "a", None], {"a": 1, "b": [True]}],
)
def test_plain_json_values_pass_through_unchanged(value):
    assert encode(value) == value
    assert _round_trip(value) == value


@pytest.mark.parametrize(
    "value",
    [
        datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        datetime(2030, 1, 2, 3, 4, 5),
        date(2030, 2, 28),
        time(23, 59, 1, 5),
        timedelta(days=2, seconds=3, microseconds=4),
        Decimal("12345678901234567890.000000001"),
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        (1, "two", None),
    ],
    ids=lambda v: type(v).__name__,
)
def test_typed_values_come_back_as_the_same_type_and_value(value):
    result = _round_trip(value)
    assert type(result) is type(value)
    assert result == value


def test_an_aware_datetime_keeps_its_offset():
    value = datetime(2030, 1, 1, 9, 0, tzinfo=timezone(timedelta(hours=-3)))
    assert _round_trip(value).utcoffset() == timedelta(hours=-3)


def test_a_naive_datetime_stays_naive():
    assert _round_trip(datetime(2030, 1, 1, 9, 0)).tzinfo is None


@pytest.mark.parametrize(
    "member", [SerializationColour.BLUE, SerializationLevel.HIGH, SerializationPlain.ONE]
)
def test_enum_members_come_back_as_the_same_member(member):
    assert _round_trip(member) is member


def test_typed_values_nested_in_lists_and_dicts_come_back():
    value = {
        "when": datetime(2030, 1, 1, tzinfo=UTC),
        "items": [Decimal("1.10"), (uuid.UUID(int=1), date(2030, 1, 1))],
        "inner": {"wait": timedelta(minutes=5)},
    }
    assert _round_trip(value) == value


def test_enum_dict_keys_are_stored_as_their_values():
    assert encode({SerializationColour.RED: 1}) == {"red": 1}


@pytest.mark.parametrize("key", [1, 2.5, None, (1, 2), SerializationLevel.LOW])
def test_dict_keys_that_are_not_strings_are_refused_with_a_fix(key):
    with pytest.raises(SerializationError, match=r"JSON object keys must be strings.*str\(\)"):
        encode({key: "x"})


@pytest.mark.parametrize("value", [{1, 2}, object(), b"bytes", frozenset()])
def test_values_json_cannot_express_are_refused_listing_what_is_supported(value):
    with pytest.raises(SerializationError, match=r"cannot store a value of type .* supported:"):
        encode(value)


def test_a_refused_value_deep_inside_a_structure_is_refused():
    with pytest.raises(SerializationError, match="set"):
        encode({"a": [{"b": {1, 2}}]})


def test_a_dict_using_the_reserved_tag_key_is_refused():
    # It would otherwise read back as a typed wrapper instead of the dict that was stored.
    with pytest.raises(SerializationError, match="reserves it for typed values; rename that key"):
        encode({"__gd__": ["datetime", "2030-01-01"]})


def test_a_dict_with_the_tag_key_among_others_is_refused_too():
    with pytest.raises(SerializationError, match="__gd__"):
        encode({"__gd__": 1, "other": 2})


def test_decoding_an_unknown_tag_fails_clearly():
    with pytest.raises(SerializationError, match="unknown typed JSON tag 'mystery'"):
        decode({"__gd__": ["mystery", 1]})


def test_dumps_is_compact_and_sorted_so_sizes_are_stable():
    assert dumps({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'
    assert dumps({"a": 1, "b": 2}) == dumps({"b": 2, "a": 1})


def test_encoded_size_counts_utf8_bytes():
    assert encoded_size("é") == len('"é"'.encode())
    assert encoded_size({"k": "v"}) == len(b'{"k":"v"}')


def test_encoded_size_includes_the_typed_wrapper():
    value = timedelta(seconds=1)
    assert encoded_size(value) == len(dumps(value).encode())
    assert encoded_size(value) > len(b"1.0")

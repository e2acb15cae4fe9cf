"""``configure(...)`` (and ``Settings(...)``) refuse numeric settings that make no sense — a
negative or zero threshold, a size below 1, a number where a timedelta is expected — naming
the setting, and leave the current settings as they were."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

import geneva_drive
from geneva_drive.core.errors import StepConfigurationError
from geneva_drive.core.settings import Settings, settings


@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [
        ("housekeeping_batch_size", 0, "expected a positive integer"),
        ("housekeeping_batch_size", 2.5, "expected a positive integer"),
        ("housekeeping_batch_size", math.nan, "expected a positive integer"),
        ("housekeeping_batch_size", True, "expected a positive integer"),
        ("max_cursor_size", 0, "a positive number of bytes, or None"),
        ("max_cursor_size", -1, "a positive number of bytes, or None"),
        ("max_signal_payload_size", math.inf, "a positive number of bytes, or None"),
        ("stuck_in_progress_threshold", timedelta(0), "a timedelta above 0"),
        ("stuck_in_progress_threshold", 3600, "a timedelta above 0"),
        ("stuck_scheduled_threshold", timedelta(minutes=-1), "a timedelta above 0"),
        ("delete_completed_workflows_after", timedelta(days=-1), "a timedelta of 0 or more"),
        ("delete_completed_workflows_after", 30, "a timedelta of 0 or more, or None"),
        ("waiting_visibility_threshold", timedelta(seconds=-1), "a timedelta of 0 or more"),
    ],
)
def test_a_nonsense_numeric_setting_is_refused_naming_it(setting, value, says):
    before = settings()

    with pytest.raises(StepConfigurationError) as refused:
        geneva_drive.configure(**{setting: value})

    assert f"configure({setting}={value!r})" in str(refused.value)
    assert says in str(refused.value)
    assert settings() is before


def test_edge_values_that_make_sense_are_accepted():
    accepted = Settings(
        housekeeping_batch_size=1,
        max_cursor_size=None,
        max_signal_payload_size=1,
        delete_completed_workflows_after=timedelta(0),
        waiting_visibility_threshold=None,
        stuck_scheduled_threshold=timedelta(seconds=1),
    )

    assert accepted.delete_completed_workflows_after == timedelta(0)

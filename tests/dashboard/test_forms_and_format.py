"""The pure parts: reading the filter form, and how values are shown."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from geneva_drive.admin import AdminInputError, WorkflowFilter
from geneva_drive.dashboard import format as fmt
from geneva_drive.dashboard.forms import FilterForm, parse_body


def test_the_filter_form_turns_fields_into_a_workflow_filter():
    form = FilterForm.from_items(
        [
            ("type", "Onboarding"),
            ("state", "ready"),
            ("state", "paused"),
            ("hero_id", " 42 "),
            ("failed", "yes"),
            ("created_after", "2026-12-01T08:00"),
            ("after", "cursor"),
        ]
    )
    assert form.to_filter() == WorkflowFilter(
        workflow_type="Onboarding",
        state=("ready", "paused"),
        hero_id="42",
        has_failed_execution=True,
        created_after=datetime(2026, 12, 1, 8, tzinfo=UTC),
    )
    assert FilterForm.from_items(form.items()) == form  # links and bulk forms carry it whole


def test_an_empty_form_filters_nothing_and_says_so():
    assert FilterForm.from_items([("hero_id", "  "), ("order", "oldest")]).empty
    assert FilterForm().to_filter() == WorkflowFilter()


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([("state", "running")], "'running' is not a workflow state"),
        ([("created_before", "yesterday")], "ISO 8601"),
        ([("failed", "maybe")], "expected yes, no or nothing"),
    ],
)
def test_a_bad_field_is_an_admin_input_error_naming_it(items, message):
    with pytest.raises(AdminInputError, match=message):
        FilterForm.from_items(items).to_filter()


def test_a_form_body_over_the_limit_is_refused():
    with pytest.raises(AdminInputError, match="at most"):
        parse_body(b"x=" + b"a" * 300_000)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.34, "340 ms"),
        (12.5, "12.5 s"),
        (250, "4 min 10 s"),
        (3600, "1 h"),
        (11_100, "3 h 5 min"),
        (187_200, "2 d 4 h"),
    ],
)
def test_durations_read_as_an_operator_says_them(seconds, shown):
    assert fmt.seconds(seconds) == shown


def test_ages_say_ago_or_in():
    now = datetime(2026, 12, 1, tzinfo=UTC)
    assert fmt.age(now - timedelta(minutes=2), now) == "2 min ago"
    assert fmt.age(now + timedelta(seconds=30), now) == "in 30.0 s"
    assert fmt.age(None, now) == "—"

"""``admin.schedules()`` and ``geneva-drive schedules``: list, pause, resume, and mistakes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.orm import Session

from geneva_drive import admin
from geneva_drive.engine.schedules import run_due_schedules
from tests.ops_cli._support import command, invoke, invoke_json, one_error_line
from tests.schedules.apps import NightlyBackfill

START = datetime(2030, 1, 1, 12, tzinfo=UTC)
FIRST_TICK = datetime(2030, 1, 2, 2, tzinfo=UTC)


def test_the_list_has_every_scheduled_class_with_its_next_tick(
    gd: Any, clock: Any, session: Session
):
    clock.set(START)
    run_due_schedules(gd, [NightlyBackfill])
    with session.begin():
        found = {s.workflow_type: s for s in admin.schedules(session)}
    nightly = found["NightlyBackfill"]
    assert (nightly.cron, nightly.timezone, nightly.missed) == (
        "0 3 * * *",
        "Europe/Berlin",
        "run_once",
    )
    assert (nightly.next_tick, nightly.last_tick, nightly.paused) == (FIRST_TICK, None, False)
    # A class this process defines that no worker has seen: listed, with no tick yet.
    assert found["HalfPastTwo"].next_tick is None


def test_a_class_no_worker_has_seen_can_be_paused_before_its_first_tick(
    gd: Any, clock: Any, session: Session
):
    clock.set(START)
    with session.begin():
        info = admin.pause_schedule(session, NightlyBackfill)
    assert (info.paused, info.next_tick) == (True, FIRST_TICK)
    clock.set(FIRST_TICK)
    assert run_due_schedules(gd, [NightlyBackfill]) == []


def test_pausing_a_class_without_a_schedule_names_it_and_lists_the_schedules(
    gd: Any, session: Session
):
    with pytest.raises(admin.AdminNotFound, match=r"pause_schedule\('OpsNoSuch'\): no schedule"):
        admin.pause_schedule(session, "OpsNoSuch")


def test_the_command_lists_pauses_and_resumes(gd: Any, clock: Any, installed_database_url: str):
    clock.set(START)
    run_due_schedules(gd, [NightlyBackfill])
    listed = invoke(installed_database_url, "schedules")
    assert listed.exit_code == 0, listed.output
    assert "NightlyBackfill" in listed.output and "2030-01-02 02:00:00" in listed.output
    [paused] = invoke_json(installed_database_url, "schedules", "pause", "NightlyBackfill")
    assert (paused["workflow_type"], paused["paused"]) == ("NightlyBackfill", True)
    assert "paused" in invoke(installed_database_url, "schedules").output
    [resumed] = invoke_json(installed_database_url, "schedules", "resume", "NightlyBackfill")
    assert resumed["paused"] is False


@pytest.mark.parametrize("arguments", [["stop", "NightlyBackfill"], ["pause"], ["x", "y", "z"]])
def test_anything_but_pause_or_resume_class_is_a_usage_mistake(
    gd: Any, installed_database_url: str, arguments: list[str]
):
    result = invoke(installed_database_url, "schedules", *arguments)
    assert result.exit_code == 2
    assert "pause CLASS or resume CLASS" in result.output


def test_the_command_on_a_class_without_a_schedule_is_one_line_and_exit_1(
    gd: Any, installed_database_url: str
):
    result = command("schedules", "pause", "OpsNoSuch", url=installed_database_url)
    assert result.returncode == 1
    assert "pause_schedule('OpsNoSuch'): no schedule" in one_error_line(result.stderr)

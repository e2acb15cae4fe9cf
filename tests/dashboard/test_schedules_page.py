"""The Schedules page: next and last tick, paused or not; pause and resume behind authorize."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from geneva_drive import admin
from geneva_drive.engine.schedules import run_due_schedules
from geneva_drive.storage.models import ScheduleRow
from tests.dashboard.conftest import allow_everything, csrf
from tests.schedules.apps import NightlyBackfill

START = datetime(2030, 1, 1, 12, tzinfo=UTC)
FIRST_TICK = datetime(2030, 1, 2, 2, tzinfo=UTC)


def _ticked(gd: Any, clock: Any) -> None:
    clock.set(START)
    run_due_schedules(gd, [NightlyBackfill])
    clock.set(FIRST_TICK + timedelta(seconds=5))
    run_due_schedules(gd, [NightlyBackfill])


def _paused(session: Any) -> bool:
    session.expire_all()
    row = session.get(ScheduleRow, "NightlyBackfill")
    paused = bool(row.paused)
    session.rollback()
    return paused


def _post(client: Any, action: str, token: bool = True) -> Any:
    data = {"action": action, "workflow_type": "NightlyBackfill"}
    if token:
        data["csrf_token"] = csrf(client)
    return client.post("/schedules/act", data=data, follow_redirects=False)


def test_the_page_shows_each_schedules_next_and_last_tick_and_links_the_last_workflow(
    client_for: Any, gd: Any, clock: Any, session: Any
):
    _ticked(gd, clock)
    with session.begin():
        last = admin.schedules(session)
    [nightly] = [s for s in last if s.workflow_type == "NightlyBackfill"]
    page = client_for(authorize=allow_everything).get("/schedules")
    assert page.status_code == 200
    row = page.text.split('data-schedule="NightlyBackfill"')[1].split("</tr>")[0]
    assert "0 3 * * *" in row and "Europe/Berlin" in row and "run_once" in row
    assert "2030-01-03 02:00" in row  # the next tick
    assert f"/workflows/{nightly.last_workflow_id}" in row  # the last tick's workflow
    assert ">Pause<" in row


def test_pause_and_resume_from_the_page(client_for: Any, gd: Any, clock: Any, session: Any):
    _ticked(gd, clock)
    client = client_for(authorize=allow_everything)
    assert _post(client, "pause_schedule").status_code == 303
    assert _paused(session)
    assert ">Resume<" in client.get("/schedules").text
    assert _post(client, "resume_schedule").status_code == 303
    assert not _paused(session)


def test_authorize_decides_with_the_schedule_as_target_and_a_refusal_changes_nothing(
    client_for: Any, gd: Any, clock: Any, session: Any
):
    _ticked(gd, clock)
    asked: list[tuple[str, str]] = []

    def authorize(_request: Any, action: str, target: Any) -> bool:
        asked.append((action, target.workflow_type))
        return False

    client = client_for(authorize=authorize)
    assert ">Pause<" not in client.get("/schedules").text
    refused = _post(client, "pause_schedule")
    assert refused.status_code == 403
    assert ("pause_schedule", "NightlyBackfill") in asked
    assert not _paused(session)


def test_without_a_csrf_token_or_authorize_nothing_changes(
    client_for: Any, gd: Any, clock: Any, session: Any
):
    _ticked(gd, clock)
    assert (
        _post(client_for(authorize=allow_everything), "pause_schedule", token=False).status_code
        == 403
    )
    assert _post(client_for(), "pause_schedule").status_code == 403  # read-only
    assert not _paused(session)


def test_an_unknown_action_or_class_is_refused(client_for: Any, gd: Any, clock: Any):
    _ticked(gd, clock)
    client = client_for(authorize=allow_everything)
    assert _post(client, "delete_schedule").status_code == 400
    data = {"action": "pause_schedule", "workflow_type": "NoSuch", "csrf_token": csrf(client)}
    assert client.post("/schedules/act", data=data).status_code == 404

"""admin.show: one workflow's timeline — executions, timers, signals, waits, metadata."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update

from geneva_drive import Workflow, admin, resumable_step
from geneva_drive.admin import AdminNotFound
from geneva_drive.storage.models import workflows_table
from geneva_drive.testing import perform_next_step
from tests.admin.apps import AdminFlaky, AdminRetries, AdminThreeSteps, AdminWaits
from tests.support.app import Order


class AdminShowResumable(Workflow):
    """Ten items, four a run, committed every three: runs of 4, 4 and 2 iterations."""

    @resumable_step(max_iterations=4, checkpoint_every=3)
    def walk(self, it: Any) -> None:
        for _ in it.iterate_over(range(10)):
            pass


def test_a_reattempted_execution_carries_its_error_class_message_and_backtrace(session, make):
    wf = make(AdminRetries, status="busy", run=1)  # raised; reattempted, nothing failed

    (reattempted, scheduled) = admin.show(session, wf.id).executions

    assert (reattempted.state, reattempted.outcome) == ("completed", "reattempted")
    assert reattempted.error_class == "ConnectionError"
    assert reattempted.error_message == "gateway busy, try later"
    assert "ConnectionError: gateway busy, try later" in (reattempted.error_backtrace or "")
    assert (scheduled.error_class, scheduled.error_message) == (None, None)


def test_show_lists_every_execution_in_order_with_attempts_errors_and_durations(
    session, make, clock
):
    wf = make(AdminFlaky, run=2)  # prepare ok, charge failed → paused
    wf.resume()
    session.commit()
    perform_next_step(wf, raise_errors=False)  # charge fails again

    timeline = admin.show(session, wf.id)

    assert timeline.workflow.state == "paused"
    assert timeline.steps == ("prepare", "charge", "receipt")
    rows = [(e.step_name, e.state, e.outcome, e.attempt) for e in timeline.executions]
    assert rows == [
        ("prepare", "completed", "success", 1),
        ("charge", "failed", "failed", 1),
        ("charge", "failed", "failed", 2),
    ]
    failed = timeline.executions[-1]
    assert failed.error_class == "RuntimeError"
    assert failed.error_message == "card declined"
    assert failed.error_backtrace is not None and "card declined" in failed.error_backtrace
    assert failed.duration_seconds == 0.0  # the frozen clock
    assert failed.queue == "default"
    assert not failed.is_timer
    assert timeline.workflow.last_error_class == "RuntimeError"
    assert timeline.truncated is False


def test_a_parked_step_shows_its_signal_its_deadline_and_its_timer(session, make, clock):
    wf = make(AdminWaits, run=2)

    timeline = admin.show(session, wf.id)

    deadline = clock.now() + timedelta(hours=2)
    assert (timeline.awaiting_signal, timeline.wait_deadline) == ("approved", deadline)
    *_, parked, timer = timeline.executions
    assert (parked.state, parked.awaiting_signal, parked.wait_deadline) == (
        "waiting",
        "approved",
        deadline,
    )
    assert timer.is_timer and timer.state == "scheduled" and timer.scheduled_for == deadline
    assert timer.attempt == parked.attempt == 1


def test_signals_show_their_state_key_payload_preview_and_who_claimed_and_consumed_them(
    session, make
):
    wf = make(AdminWaits, run=2)
    wf.signal("approved", payload={"by": "ops", "note": "x" * 500}, idempotency_key="evt-1")
    wf.signal("unrelated", payload=None, allow_unknown=True)
    session.commit()
    perform_next_step(wf)  # approve runs with the signal

    timeline = admin.show(session, wf.id)

    approved, unrelated = timeline.signals
    woken = [e for e in timeline.executions if e.step_name == "approve" and e.state == "completed"]
    assert approved.name == "approved" and approved.state == "consumed"
    assert approved.idempotency_key == "evt-1"
    assert len(approved.payload_preview) == 200 and approved.payload_preview.startswith('{"by"')
    assert approved.claimed_by == woken[0].id == approved.consumed_by
    assert (unrelated.state, unrelated.payload_preview, unrelated.claimed_by) == (
        "pending",
        "",
        None,
    )


def test_show_decodes_metadata_and_a_resumable_cursor(session, make):
    wf = make(AdminThreeSteps)
    wf.write_metadata("ticket", "OPS-12")
    session.commit()

    timeline = admin.show(session, wf.id)

    assert timeline.metadata == {"ticket": "OPS-12"}
    assert json.loads(json.dumps(admin.to_json(timeline)))["metadata"] == {"ticket": "OPS-12"}


def test_show_keeps_only_the_newest_executions_of_a_long_history_and_says_so(session, make):
    wf = make(AdminThreeSteps, run=2)  # first, second done; third scheduled

    timeline = admin.show(session, wf.id, max_executions=2)

    assert [e.step_name for e in timeline.executions] == ["second", "third"]
    assert timeline.truncated is True


def test_show_of_an_unknown_id_names_it(session):
    with pytest.raises(AdminNotFound, match="id=424242"):
        admin.show(session, 424242)


def test_to_json_gives_plain_json_values(session, make):
    wf = make(AdminWaits, run=2)
    order = session.get(Order, int(wf.hero_id))

    data = admin.to_json(admin.show(session, wf.id))

    text = json.dumps(data)  # would raise on datetimes or dataclasses
    assert data["workflow"]["id"] == wf.id and data["workflow"]["hero_id"] == str(order.id)
    assert data["wait_deadline"].endswith("+00:00")
    assert isinstance(data["executions"], list) and "approved" in text
    assert admin.to_json(admin.count(session)) == {"value": 1, "exact": True}


def test_each_run_of_a_resumable_step_shows_how_many_iterations_it_checkpointed(session, make):
    # The first two runs stop at max_iterations (their last checkpoint commits the count);
    # the third ends its loop between batched commits (the count lands with the step's end).
    wf = make(AdminShowResumable, run=3)

    runs = admin.show(session, wf.id).executions

    assert [(e.outcome, e.iterations, e.cursor) for e in runs] == [
        ("continued", 4, 4),
        ("continued", 4, 8),
        ("success", 2, 10),
    ]


def test_a_waiting_workflow_says_since_when_it_waits_in_show_and_in_find(session, make, clock):
    wf = make(AdminWaits, run=1)
    parked_at = clock.advance(minutes=10)
    perform_next_step(wf)  # parks "approve", waiting for "approved"
    session.commit()
    clock.advance(hours=1)
    other = make(AdminThreeSteps, run=1)

    timeline = admin.show(session, wf.id)
    page = admin.find(session, admin.WorkflowFilter(ids=(wf.id, other.id)))

    assert timeline.workflow.waiting_since == parked_at
    parked = next(e for e in timeline.executions if e.state == "waiting")
    assert parked.waiting_since == parked_at
    since = {item.id: item.waiting_since for item in page.items}
    assert since == {wf.id: parked_at, other.id: None}


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _store_trace_context(session, workflow_id: int, traceparent: str | None) -> None:
    session.execute(
        update(workflows_table)
        .where(workflows_table.c.id == workflow_id)
        .values(trace_context=traceparent)
    )
    session.commit()


def test_show_gives_the_trace_id_of_the_traceparent_stored_with_the_workflow(session, make):
    wf = make(AdminThreeSteps)
    _store_trace_context(session, wf.id, TRACEPARENT)

    assert admin.show(session, wf.id).trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_show_gives_no_trace_id_when_none_or_a_malformed_one_was_stored(session, make):
    wf = make(AdminThreeSteps)
    assert admin.show(session, wf.id).trace_id is None

    _store_trace_context(session, wf.id, "00-not-hex-01")
    assert admin.show(session, wf.id).trace_id is None

"""admin actions by id: each goes through the engine's verbs, is recorded, or is refused
leaving the database as it was."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from geneva_drive import StepExecution, admin
from geneva_drive.admin import AdminInputError, AdminNotFound, AdminRefused
from geneva_drive.storage.models import OperatorAction
from geneva_drive.testing import perform_next_step
from tests.admin.apps import AdminFlaky, AdminThreeSteps, AdminWaits
from tests.support.app import Order


def _rows(session: Any) -> list[tuple[Any, ...]]:
    """Every execution and action row, to prove a refusal wrote nothing."""
    session.expire_all()
    executions = session.execute(
        select(
            StepExecution.id,
            StepExecution.state,
            StepExecution.scheduled_for,
            StepExecution.outcome,
        ).order_by(StepExecution.id)
    ).all()
    actions = session.execute(select(OperatorAction.id)).all()
    return [*executions, *actions]


def _history(session: Any, wf: Any) -> list[tuple[str, str, str | None]]:
    return [(e.step_name, e.state, e.outcome) for e in admin.show(session, wf.id).executions]


def test_pause_then_resume_are_recorded_with_actor_and_reason_in_the_timeline(session, make):
    wf = make(AdminThreeSteps, run=1)

    paused = admin.pause(session, wf.id, actor="alice", reason="incident 42")
    session.commit()
    resumed = admin.resume(session, wf.id, actor="bob")
    session.commit()

    assert (paused.state_before, paused.state_after) == ("ready", "paused")
    assert (resumed.state_before, resumed.state_after) == ("paused", "ready")
    actions = admin.show(session, wf.id).actions
    assert [(a.action, a.actor, a.reason) for a in actions] == [
        ("pause", "alice", "incident 42"),
        ("resume", "bob", None),
    ]
    assert actions[0].detail is not None and actions[0].detail["state_after"] == "paused"
    second = next(e for e in admin.show(session, wf.id).executions if e.step_name == "second")
    assert actions[1].execution_id == second.id


def test_skip_moves_on_to_the_next_step(session, make):
    wf = make(AdminThreeSteps, run=1)  # second scheduled an hour from now

    result = admin.skip(session, wf.id, actor="ops")
    session.commit()

    assert result.state_after == "ready"
    assert _history(session, wf)[-2:] == [
        ("second", "skipped", "skipped"),
        ("third", "scheduled", None),
    ]


def test_skip_says_which_step_it_left_and_where_the_workflow_stands_now(session, make):
    wf = make(AdminThreeSteps, run=1)

    result = admin.skip(session, wf.id, actor="ops")

    assert (result.step_before, result.step_after) == ("second", "third")
    assert result.change == "at second → at third"  # not "ready → ready"
    assert "ready → ready" not in result.detail


def test_cancel_ends_the_workflow(session, make):
    wf = make(AdminWaits, run=2)  # parked, with a timer

    result = admin.cancel(session, wf.id, actor="ops", reason="customer left")
    session.commit()

    assert (result.state_before, result.state_after) == ("ready", "canceled")
    states = {(e.state, e.is_timer) for e in admin.show(session, wf.id).executions[-2:]}
    assert states == {("canceled", False), ("canceled", True)}


def test_retry_makes_a_scheduled_step_due_now(session, make, clock):
    wf = make(AdminThreeSteps, run=1)  # second due in an hour

    result = admin.retry(session, wf.id, actor="ops")
    session.commit()

    current = admin.show(session, wf.id).executions[-1]
    assert (current.step_name, current.state, current.scheduled_for) == (
        "second",
        "scheduled",
        clock.now(),
    )
    assert "due now" in result.detail


def test_retry_of_a_paused_failed_workflow_runs_its_step_again_after_the_fix(session, make):
    wf = make(AdminFlaky, run=2)  # charge failed, paused
    session.get(Order, int(wf.hero_id)).status = "fixed"
    session.commit()

    result = admin.retry(session, wf.id, actor="ops", reason="card updated")
    session.commit()
    perform_next_step(wf)

    assert (result.state_before, result.state_after) == ("paused", "ready")
    assert _history(session, wf)[-2:] == [
        ("charge", "completed", "success"),
        ("receipt", "scheduled", None),
    ]


def test_resume_at_continues_a_paused_workflow_at_the_named_step(session, make, clock):
    wf = make(AdminFlaky, run=2)  # paused at charge

    result = admin.resume_at(session, wf.id, "receipt", actor="ops", reason="charged by hand")
    session.commit()

    assert (result.state_before, result.state_after) == ("paused", "ready")
    assert _history(session, wf)[-1] == ("receipt", "scheduled", None)
    timeline = admin.show(session, wf.id)
    assert timeline.executions[-1].scheduled_for == clock.now()
    assert timeline.actions[-1].detail is not None
    assert timeline.actions[-1].detail["step"] == "receipt"


def test_resume_at_with_wait_until_schedules_the_named_step_for_then(session, make, clock):
    paused = make(AdminFlaky, run=2)  # paused at charge
    ready = make(AdminThreeSteps, run=1)  # scheduled at second
    at = clock.now() + timedelta(hours=3)

    moved = admin.resume_at(session, paused.id, "receipt", wait_until=at, actor="ops")
    later = admin.resume_at(session, ready.id, "second", wait_until=at, actor="ops")
    session.commit()

    assert (moved.state_before, moved.state_after) == ("paused", "ready")
    assert admin.show(session, paused.id).executions[-1].scheduled_for == at
    assert "due at" in later.detail
    assert admin.show(session, ready.id).executions[-1].scheduled_for == at
    assert _history(session, ready)[-1] == ("second", "scheduled", None)  # the same row
    assert admin.show(session, paused.id).actions[-1].detail["wait_until"] == at.isoformat()


def test_resume_at_refuses_a_naive_wait_until_naming_the_workflow_and_changes_nothing(
    session, make
):
    wf = make(AdminFlaky, run=2)

    with pytest.raises(AdminInputError, match=rf"workflow id={wf.id}.*wait_until="):
        admin.resume_at(session, wf.id, "receipt", wait_until=datetime(2030, 1, 1), actor="ops")
    session.commit()

    assert admin.show(session, wf.id).workflow.state == "paused"
    assert admin.show(session, wf.id).actions == ()


def test_resume_at_moves_a_ready_workflow_off_its_scheduled_or_waiting_step(session, make):
    ready = make(AdminThreeSteps, run=1)
    waiting = make(AdminWaits, run=2)

    admin.resume_at(session, ready.id, "first", actor="ops")
    admin.resume_at(session, waiting.id, "done", actor="ops")
    session.commit()

    assert _history(session, ready)[-2:] == [
        ("second", "skipped", "skipped"),
        ("first", "scheduled", None),
    ]
    rows = [(e.step_name, e.state, e.is_timer) for e in admin.show(session, waiting.id).executions]
    assert rows[-3:] == [
        ("approve", "skipped", False),
        ("approve", "canceled", True),  # its timer, disarmed
        ("done", "scheduled", False),
    ]


def test_resume_at_is_the_way_out_when_a_deploy_removed_the_step_it_stands_at(session, make):
    wf = make(AdminFlaky, run=2)  # failed and paused at charge: nothing scheduled
    wf.next_step_name = "charge_v1"  # as if the deployed code had since dropped that step
    session.commit()
    with pytest.raises(AdminRefused, match="resume_at"):
        admin.resume(session, wf.id, actor="ops")

    admin.resume_at(session, wf.id, "receipt", actor="ops")
    session.commit()

    assert _history(session, wf)[-1] == ("receipt", "scheduled", None)
    assert [a.action for a in admin.show(session, wf.id).actions] == ["resume_at"]


def test_signal_delivers_and_wakes_the_waiting_step_and_a_redelivery_changes_nothing(session, make):
    wf = make(AdminWaits, run=2)

    first = admin.signal(session, wf.id, "approved", payload={"ok": True}, key="k1", actor="ops")
    session.commit()
    again = admin.signal(session, wf.id, "approved", key="k1", actor="ops")
    session.commit()

    assert "woke its step" in first.detail
    assert "duplicate" in again.detail
    timeline = admin.show(session, wf.id)
    assert [s.name for s in timeline.signals] == ["approved"]
    assert timeline.signals[0].state == "claimed"
    assert [a.action for a in timeline.actions] == ["signal", "signal"]


@pytest.mark.parametrize(
    ("setup", "action", "message"),
    [
        ("paused", "pause", "cannot pause a paused workflow; pause needs it to be ready or"),
        ("ready", "resume", "cannot resume a ready workflow; resume needs it to be paused"),
        ("finished", "skip", "cannot skip a finished workflow"),
        ("canceled", "cancel", "cannot cancel a canceled workflow"),
        ("finished", "retry", "cannot retry a finished workflow"),
        ("waiting", "retry", "waits for signal 'approved'; send it with signal"),
        ("finished", "signal", "cannot signal a finished workflow"),
        ("finished", "resume_at", "cannot resume_at a finished workflow"),
        ("waiting", "resume_at_same", "already stands at that step, waiting for 'approved'"),
    ],
)
def test_a_refused_action_names_class_id_and_state_and_changes_nothing(
    session, make, setup, action, message
):
    wf = {
        "paused": lambda: make(AdminFlaky, run=2),
        "ready": lambda: make(AdminThreeSteps, run=1),
        "finished": lambda: make(AdminThreeSteps, run="all"),
        "canceled": lambda: _canceled(session, make),
        "waiting": lambda: make(AdminWaits, run=2),
    }[setup]()
    before = _rows(session)
    calls = {
        "signal": lambda: admin.signal(session, wf.id, "approved", actor="ops"),
        "resume_at": lambda: admin.resume_at(session, wf.id, "first", actor="ops"),
        "resume_at_same": lambda: admin.resume_at(session, wf.id, "approve", actor="ops"),
    }
    call = calls.get(action, lambda: getattr(admin, action)(session, wf.id, actor="ops"))

    with pytest.raises(AdminRefused, match=message) as refused:
        call()
    session.commit()

    assert f"{type(wf).__name__} id={wf.id}" in str(refused.value)
    assert _rows(session) == before


def _canceled(session: Any, make: Any) -> Any:
    wf = make(AdminThreeSteps)
    wf.cancel()
    session.commit()
    return wf


def test_bad_input_is_refused_before_anything_is_written(session, make):
    wf = make(AdminThreeSteps, run=1)
    before = _rows(session)

    with pytest.raises(AdminNotFound, match="id=999999"):
        admin.pause(session, 999_999, actor="ops")
    with pytest.raises(AdminInputError, match="actor"):
        admin.pause(session, wf.id, actor=" ")
    with pytest.raises(AdminInputError, match=r"no such step; use one of: first, second, third"):
        admin.resume_at(session, wf.id, "fourth", actor="ops")
    with pytest.raises(AdminInputError, match="signal name"):
        admin.signal(session, wf.id, "", actor="ops")
    session.commit()

    assert _rows(session) == before


def test_an_action_is_part_of_the_callers_transaction(session, make, clock):
    wf = make(AdminThreeSteps, run=1)

    admin.pause(session, wf.id, actor="ops")
    session.rollback()

    assert admin.show(session, wf.id).workflow.state == "ready"
    assert admin.show(session, wf.id).actions == ()
    clock.advance(timedelta(seconds=1))


# -- a class this process has not loaded ------------------------------------------------------
# The row loads as the base Workflow, which has no steps: a verb that moves along the steps
# would compute "no step after this one" and finish the workflow (what `geneva-drive skip`
# without --app did). Such verbs are refused, naming the class and how to load it.


def _as_unloaded(session: Any, wf: Any, name: str) -> None:
    from sqlalchemy import update

    from geneva_drive import Workflow

    session.execute(update(Workflow).where(Workflow.id == wf.id).values(type=name))
    session.commit()
    session.expunge_all()


@pytest.mark.parametrize("paused", [False, True], ids=["ready", "paused"])
def test_skip_of_a_workflow_whose_class_is_not_loaded_is_refused_and_changes_nothing(
    session, make, paused
):
    wf = make(AdminThreeSteps, run=1)  # second scheduled
    if paused:
        admin.pause(session, wf.id, actor="alice")
        session.commit()
    _as_unloaded(session, wf, "OrderCheckoutGoneHere")
    before = _rows(session)

    with pytest.raises(AdminRefused) as refused:
        admin.skip(session, wf.id, actor="alice")
    session.commit()

    message = str(refused.value)
    assert "OrderCheckoutGoneHere" in message and "not loaded" in message
    assert "--app" in message  # how to load it
    assert _rows(session) == before
    assert admin.show(session, wf.id).workflow.state == ("paused" if paused else "ready")


def test_resume_at_and_resume_of_an_unloaded_class_say_it_is_not_loaded(session, make):
    wf = make(AdminFlaky, run=2)  # charge failed: paused, no execution kept
    _as_unloaded(session, wf, "FlakyGoneHere")
    before = _rows(session)

    for act in (
        lambda: admin.resume(session, wf.id, actor="alice"),
        lambda: admin.retry(session, wf.id, actor="alice"),
        lambda: admin.resume_at(session, wf.id, "charge", actor="alice"),
    ):
        with pytest.raises((AdminRefused, AdminInputError)) as refused:
            act()
        session.rollback()
        assert "FlakyGoneHere" in str(refused.value)
        assert "not loaded" in str(refused.value), str(refused.value)
    assert _rows(session) == before

"""admin.stats: counts of ongoing work, overdue backlog by queue, waits, outcomes, leases."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from geneva_drive import StepExecution, admin
from tests.admin.apps import AdminFlaky, AdminThreeSteps, AdminWaits


def test_stats_count_ongoing_work_by_class_and_state_and_the_last_hours_endings(
    session, make, clock
):
    make(AdminThreeSteps, run=1)
    make(AdminThreeSteps, run=1).pause()
    session.commit()
    make(AdminFlaky, run=2)  # failed at charge → paused
    make(AdminWaits, run=2)
    make(AdminThreeSteps, run="all")
    make(AdminThreeSteps).cancel()
    session.commit()
    clock.advance(minutes=1)

    stats = admin.stats(session)

    assert stats.at == clock.now()
    assert stats.by_class_state == (
        ("AdminFlaky", "paused", 1),
        ("AdminThreeSteps", "paused", 1),
        ("AdminThreeSteps", "ready", 1),
        ("AdminWaits", "ready", 1),
    )
    assert (stats.finished_last_hour, stats.canceled_last_hour) == (1, 1)
    assert stats.failed_last_hour == 1
    outcomes = {
        (o.workflow_type, o.step, o.outcome): (o.last_5m, o.last_60m) for o in stats.outcomes
    }
    assert outcomes[("AdminFlaky", "charge", "failed")] == (1, 1)
    assert outcomes[("AdminThreeSteps", "first", "success")] == (3, 3)
    assert outcomes[("AdminThreeSteps", "third", "success")] == (1, 1)

    later = admin.stats(session, now=clock.now() + timedelta(minutes=30))
    assert later.outcomes[0].last_5m == 0 and later.outcomes[0].last_60m > 0
    assert admin.stats(session, now=clock.now() + timedelta(hours=2)).outcomes == ()


def test_stats_show_overdue_rows_by_queue_waits_past_their_deadline_and_expired_leases(
    session, make, clock
):
    start = clock.now()
    make(AdminThreeSteps, run=1)  # "second" due in an hour: the oldest overdue row later
    make(AdminThreeSteps, run=1).pause()  # kept for resume(): not a backlog
    session.commit()
    make(AdminWaits, run=2)  # waits for two hours; its timer is a scheduled row then
    stuck = make(AdminThreeSteps, run=1)
    session.execute(  # as a worker that died mid-step leaves its row
        update(StepExecution)
        .where(StepExecution.workflow_id == stuck.id, StepExecution.state == "scheduled")
        .values(state="in_progress", lease_owner="dead-worker", lease_expires_at=start)
    )
    session.commit()

    before = admin.stats(session, now=start + timedelta(minutes=30))
    assert (before.overdue, before.waiting, before.overdue_waits) == ((), 1, 0)
    assert before.expired_leases == 1

    after = admin.stats(session, now=start + timedelta(hours=3))
    assert after.overdue == (admin.QueueBacklog("default", 2, 7200.0),)
    assert (after.waiting, after.overdue_waits) == (1, 1)

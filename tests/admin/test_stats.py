"""admin.stats: counts of ongoing work, overdue backlog by queue, waits, outcomes, leases."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import event, update

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


def test_stats_bucket_the_last_hours_outcomes_in_twelve_five_minute_slices(session, make, clock):
    start = clock.now()
    make(AdminThreeSteps, run=1)  # one success at start
    clock.advance(minutes=12)
    make(AdminFlaky, run=2)  # a success (prepare) and a failure (charge) at start + 12 min
    clock.advance(minutes=30)
    wf = make(AdminWaits, run=2)  # ask succeeds at start + 42 min, approve parks (not ended)
    wf.cancel()  # the parked row and its timer end canceled, also at start + 42 min
    session.commit()
    now = start + timedelta(minutes=50)

    stats = admin.stats(session, now=now)

    assert [b.start for b in stats.buckets] == [
        now - timedelta(minutes=60 - 5 * n) for n in range(12)
    ]
    counts = {n: (b.success, b.failed, b.other) for n, b in enumerate(stats.buckets) if b.total}
    # start is 50 min ago: bucket 2 ([-50, -45) min); +12 min: bucket 4; +42 min: bucket 10.
    assert counts == {2: (1, 0, 0), 4: (1, 1, 0), 10: (1, 0, 2)}
    assert stats.failed_last_hour == 1

    # The last bucket is the last five minutes; the first starts an hour ago, inclusive.
    soon = admin.stats(session, now=start + timedelta(minutes=45))
    assert [b.total for b in soon.buckets][-1] == 3
    assert sum(o.last_5m for o in soon.outcomes) == 3
    later = admin.stats(session, now=start + timedelta(minutes=102))
    assert [b.total for b in later.buckets] == [3] + [0] * 11


# -- planned as the short reads they are (issue 42) -------------------------------------------

_SETTINGS = "SELECT current_setting('jit'), current_setting('max_parallel_workers_per_gather')"


def test_stats_queries_run_without_jit_or_parallel_workers_on_postgresql(session, make, db_backend):
    """Stock PostgreSQL JIT-compiled one of them at every call and started parallel workers
    for them on 2 cores; the overview's transaction turns both off for its queries only."""
    if db_backend != "postgresql":
        pytest.skip("jit and parallel workers are PostgreSQL's")
    make(AdminThreeSteps, run=1)
    session.commit()
    connection = session.connection()
    before = tuple(connection.exec_driver_sql(_SETTINGS).one())
    seen: list[tuple[str, str]] = []

    def settings_then(conn, cursor, statement, parameters, context, executemany):
        if "current_setting" in statement or "set_config" in statement:
            return  # ours, or the dialect's
        seen.append(tuple(conn.exec_driver_sql(_SETTINGS).one()))

    event.listen(connection, "before_cursor_execute", settings_then)
    try:
        admin.stats(session)
    finally:
        event.remove(connection, "before_cursor_execute", settings_then)

    assert len(seen) >= 5  # every statistics query…
    assert set(seen) == {("off", "0")}  # …ran with both off
    assert before != ("off", "0")
    # And the rest of the caller's transaction plans as it did before.
    assert tuple(connection.exec_driver_sql(_SETTINGS).one()) == before


def test_stats_change_no_setting_of_the_callers_transaction_elsewhere(session, db_backend):
    sent: list[str] = []
    connection = session.connection()

    def record(conn, cursor, statement, parameters, context, executemany):
        sent.append(statement)

    event.listen(connection, "before_cursor_execute", record)
    try:
        admin.stats(session)
    finally:
        event.remove(connection, "before_cursor_execute", record)

    settings_changed = [s for s in sent if "set_config" in s]
    assert len(settings_changed) == (2 if db_backend == "postgresql" else 0), sent

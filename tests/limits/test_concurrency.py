"""A concurrency limit: at most n steps per key in progress; the rest wait, parked, and a freed
slot wakes the next. Phase 1 and phase 3 are driven one at a time, so the order is exact."""

from __future__ import annotations

from sqlalchemy import select

from geneva_drive.engine.limits import PARKED_UNTIL
from geneva_drive.engine.prepare import Ended, NotClaimed, Prepared
from geneva_drive.engine.recovery import recover_expired_leases
from geneva_drive.runtime import housekeeping
from geneva_drive.storage.models import LimitWaiter
from tests.limits._support import claim_and_start, counts, finish, rows, start_all
from tests.limits.apps import OnePerTenant, TwoAtATime, Unlimited


def _create(session, cls, count, tenant=None):
    workflows = []
    for _ in range(count):
        given = {"tenant": tenant} if tenant is not None else None
        workflows.append(cls.create(session, input=given))
    session.commit()
    return workflows


def test_a_third_step_of_a_limit_of_two_is_parked_not_started(gd, session):
    workflows = _create(session, TwoAtATime, 3)

    runs = start_all(gd)

    started = [s for _, s in runs if isinstance(s, Prepared)]
    assert len(started) == 2
    assert [type(s) for _, s in runs].count(Ended) == 1  # the third: claimed once, parked
    states = [(e.state, e.scheduled_for == PARKED_UNTIL) for e in rows(session, workflows)]
    assert sorted(states) == [("in_progress", False), ("in_progress", False), ("scheduled", True)]
    assert counts(session)[:2] == (2, 1)
    # Parked, it is due never: the next claim finds nothing (no polling for a slot).
    again, nothing = claim_and_start(gd)
    again.close()
    assert isinstance(nothing, NotClaimed)
    for step_session, prepared in runs:
        if isinstance(prepared, Prepared):
            step_session.close()


def test_a_finished_holder_frees_its_slot_and_makes_the_waiter_due_now(gd, session, clock):
    workflows = _create(session, TwoAtATime, 3)
    runs = start_all(gd)
    holders = [(s, p) for s, p in runs if isinstance(p, Prepared)]
    parked = next(e for e in rows(session, workflows) if e.state == "scheduled")

    finish(gd, *holders[0])

    woken = next(e for e in rows(session, workflows) if e.id == parked.id)
    assert woken.state == "scheduled"
    assert woken.scheduled_for == clock.now()
    assert session.scalars(select(LimitWaiter)).all() == []
    step_session, started = claim_and_start(gd)
    assert isinstance(started, Prepared) and started.execution_id == parked.id
    assert counts(session)[:2] == (2, 0)
    finish(gd, step_session, started)
    finish(gd, *holders[1])
    assert counts(session)[:2] == (0, 0)
    assert [e.outcome for e in rows(session, workflows)] == ["success"] * 3


def test_keys_are_separate_a_tenant_waits_only_for_itself(gd, session):
    a = _create(session, OnePerTenant, 2, tenant="a")
    b = _create(session, OnePerTenant, 1, tenant="b")

    runs = start_all(gd)

    running = {p.workflow_id for _, p in runs if isinstance(p, Prepared)}
    assert running == {a[0].id, b[0].id} or running == {a[1].id, b[0].id}
    for step_session, prepared in runs:
        if isinstance(prepared, Prepared):
            finish(gd, step_session, prepared)
    # The class-level limit covers its second step too: one per tenant at a time again.
    runs = start_all(gd)
    second = [p.workflow_id for _, p in runs if isinstance(p, Prepared)]
    assert len(second) == 2 and b[0].id in second
    for step_session, prepared in runs:
        if isinstance(prepared, Prepared):
            step_session.close()


def test_a_crashed_holders_slot_is_freed_by_lease_recovery_and_wakes_the_waiter(gd, session, clock):
    workflows = _create(session, TwoAtATime, 3)
    runs = start_all(gd)
    for step_session, _ in runs:
        step_session.close()  # both holders "crash": their bodies never finish
    parked = next(e for e in rows(session, workflows) if e.state == "scheduled")

    clock.advance(seconds=31)  # past the lease
    assert recover_expired_leases(gd) == 2

    assert counts(session)[:2] == (0, 0)
    woken = next(e for e in rows(session, workflows) if e.id == parked.id)
    assert woken.scheduled_for == clock.now()
    runs = start_all(gd)  # the waiter and both recovered steps' fresh executions
    assert sum(isinstance(p, Prepared) for _, p in runs) == 2
    for step_session, _ in runs:
        step_session.close()


def test_a_stale_slot_is_freed_by_the_next_taker(gd, session, clock):
    workflows = _create(session, TwoAtATime, 3)
    runs = start_all(gd)
    # A holder ended by a path that frees nothing (here: by hand) leaves a stale slot.
    for step_session, _ in runs:
        step_session.close()
    holder = next(e for e in rows(session, workflows) if e.state == "in_progress")
    holder.state, holder.outcome = "completed", "success"
    parked = next(e for e in rows(session, workflows) if e.state == "scheduled")
    parked.scheduled_for = clock.now()  # e.g. an operator's "run now"
    session.commit()

    step_session, started = claim_and_start(gd)

    assert isinstance(started, Prepared) and started.execution_id == parked.id
    assert counts(session)[:2] == (2, 0)
    step_session.close()


def test_a_workflow_without_limits_touches_no_limit_table(gd, session):
    workflows = _create(session, Unlimited, 2)

    runs = start_all(gd)
    for step_session, prepared in runs:
        finish(gd, step_session, prepared)

    assert counts(session) == (0, 0, 0)
    assert all(e.read_metadata("limit_keys") is None for e in rows(session, workflows))


def test_housekeeping_wakes_a_waiter_whose_key_has_a_slot_nobody_will_free(gd, session, clock):
    # A waiter is woken by the release of a slot of its key. When none comes — its holder ended
    # by a path that frees nothing, or the release skipped the waiter because another
    # transaction held its execution, and that one rolled back — the slot sits free or stale
    # and the waiter would stay parked for good. Housekeeping wakes it.
    workflows = _create(session, TwoAtATime, 3)
    runs = start_all(gd)
    for step_session, _ in runs:
        step_session.close()
    holder = next(e for e in rows(session, workflows) if e.state == "in_progress")
    holder.state, holder.outcome = "completed", "success"  # ended; its slot left stale
    session.commit()
    parked = next(e for e in rows(session, workflows) if e.state == "scheduled")
    assert parked.scheduled_for == PARKED_UNTIL

    result = housekeeping.run(gd)

    assert result["limit_waiters_woken"] == 1
    woken = next(e for e in rows(session, workflows) if e.id == parked.id)
    assert woken.scheduled_for == clock.now()
    step_session, started = claim_and_start(gd)  # takes the stale slot
    assert isinstance(started, Prepared) and started.execution_id == parked.id
    step_session.close()
    # Nothing left to wake: both slots are held by live executions again.
    assert housekeeping.run(gd)["limit_waiters_woken"] == 0

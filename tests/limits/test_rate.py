"""A rate limit: at most n starts per period per key; a step over it stays scheduled for when
the window has room — not run, not failed, not a reattempt."""

from __future__ import annotations

from datetime import timedelta

from geneva_drive.engine.prepare import Ended, Prepared
from tests.limits._support import counts, finish, rows, start_all
from tests.limits.apps import Gateway


def test_starts_over_the_limit_wait_for_the_window_and_are_not_reattempts(gd, session, clock):
    workflows = [Gateway.create(session) for _ in range(12)]
    session.commit()
    first_instant = clock.now()

    runs = start_all(gd)

    assert sum(isinstance(p, Prepared) for _, p in runs) == 10
    assert sum(isinstance(p, Ended) for _, p in runs) == 2
    waiting = [e for e in rows(session, workflows) if e.state == "scheduled"]
    assert [e.scheduled_for for e in waiting] == [first_instant + timedelta(seconds=1)] * 2
    assert all(e.outcome is None and e.error_message is None for e in waiting)
    for step_session, prepared in runs:
        if isinstance(prepared, Prepared):
            finish(gd, step_session, prepared)

    clock.advance(seconds=0.5)  # still inside the window of the first ten: nothing starts
    assert start_all(gd) == []
    clock.advance(seconds=0.5)
    runs = start_all(gd)

    assert sum(isinstance(p, Prepared) for _, p in runs) == 2
    for step_session, prepared in runs:
        finish(gd, step_session, prepared)
    executions = rows(session, workflows)
    assert len(executions) == 12  # one execution per workflow: no reattempt, no new row
    assert {e.outcome for e in executions} == {"success"}
    assert counts(session)[2] == 12  # kept a minute past its window (engine.limits)


def test_two_classes_naming_one_key_share_its_window(gd, session):
    from tests.limits.test_bad_input import SecondGatewayUser

    for _ in range(8):
        Gateway.create(session)
        SecondGatewayUser.create(session)
    session.commit()

    runs = start_all(gd)

    assert sum(isinstance(p, Prepared) for _, p in runs) == 10
    for step_session, _ in runs:
        step_session.close()

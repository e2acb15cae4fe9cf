"""children_timeout: a child paused for longer fails the parent's waiting fan-in step."""

from __future__ import annotations

from datetime import timedelta

import pytest

from geneva_drive import StepConfigurationError, Workflow, step
from geneva_drive.testing import perform_next_step
from tests.children._support import children_of, reload, run_due
from tests.engine._support import executions


class CtChild(Workflow):
    may_proceed_without_hero = True

    @step
    def work(self):
        pass


class CtParent(Workflow):
    may_proceed_without_hero = True
    children_timeout = timedelta(hours=1)

    @step
    def split(self):
        for key in ("a", "b"):
            self.start_child(CtChild, key=key)

    @step(wait_for_children="all")
    def close(self):
        pass


def _runs(session, parent):
    """The parent's executions without the timers."""
    return [e for e in executions(session, parent) if not e.is_timer]


def _parked_with_a_paused_child(session):
    parent = CtParent.create(session)
    session.commit()
    perform_next_step(parent)  # split
    a, b = children_of(session, parent)
    perform_next_step(a)  # a finished
    b.pause()
    session.commit()
    perform_next_step(parent)  # close parks, its timer due when b has been paused an hour
    return parent, b


def test_a_child_paused_longer_than_children_timeout_fails_the_waiting_step(gd, session, clock):
    parent, b = _parked_with_a_paused_child(session)
    assert _runs(session, parent)[-1].state == "waiting"

    clock.advance(minutes=59)
    run_due(session)
    assert _runs(session, parent)[-1].state == "waiting"

    clock.advance(minutes=1)
    run_due(session)

    close = _runs(session, parent)[-1]
    assert (close.step_name, close.state) == ("close", "failed")
    assert close.error_class_name == "geneva_drive.core.errors.ChildFailed"
    assert f"child CtChild id={b.id} (key 'b') has been paused since" in close.error_message
    assert "CtParent.children_timeout=1:00:00" in close.error_message
    assert reload(session, parent).state == "paused"  # the default policy


def test_a_child_resumed_in_time_is_waited_for(gd, session, clock):
    parent, b = _parked_with_a_paused_child(session)
    clock.advance(minutes=30)
    reload(session, b).resume()
    session.commit()

    clock.advance(hours=2)  # the timer fires: b is no longer paused, so close parks again
    run_due(session)

    assert reload(session, parent).state == "finished"
    assert [e.step_name for e in _runs(session, parent)] == ["split", "close"]


def test_the_timeout_counts_from_the_childs_latest_pause(gd, session, clock):
    parent, b = _parked_with_a_paused_child(session)
    clock.advance(minutes=30)
    reload(session, b).resume()
    session.commit()
    clock.advance(minutes=10)
    reload(session, b).pause()  # paused again at 0:40, before its step ran
    session.commit()

    clock.advance(minutes=20)  # 1:00: the first timer fires; b is paused for 20 minutes only
    run_due(session)
    assert _runs(session, parent)[-1].state == "waiting"
    timers = [e for e in executions(session, parent) if e.is_timer]
    assert [(t.state, t.outcome) for t in timers] == [
        ("completed", "timed_out"),
        ("scheduled", None),
    ]

    clock.advance(minutes=40)  # 1:40: b has been paused for an hour
    run_due(session)
    assert _runs(session, parent)[-1].error_class_name == "geneva_drive.core.errors.ChildFailed"


class CtLate(Workflow):
    may_proceed_without_hero = True
    children_timeout = timedelta(hours=1)

    @step
    def split(self):
        self.start_child(CtChild, key="a")

    @step(wait=timedelta(hours=2))
    def middle(self):
        pass

    @step(wait_for_children="all")
    def close(self):
        pass


def test_a_child_already_paused_too_long_fails_the_step_when_it_is_reached(gd, session, clock):
    parent = CtLate.create(session)
    session.commit()
    perform_next_step(parent)  # split; middle is due in two hours
    (a,) = children_of(session, parent)
    a.pause()
    session.commit()

    clock.advance(hours=2)
    run_due(session)

    close = _runs(session, parent)[-1]
    assert (close.step_name, close.state, close.error_class_name) == (
        "close",
        "failed",
        "geneva_drive.core.errors.ChildFailed",
    )
    assert close.waiting_since is None  # it never parked: the gate found a too long pause


@pytest.mark.parametrize("value", [0, -5, "1h", True, timedelta(0)])
def test_a_bad_children_timeout_is_refused_when_the_class_is_defined(value):
    with pytest.raises(StepConfigurationError, match=r"CtBad\.children_timeout must be a positive"):

        class CtBad(Workflow):
            children_timeout = value

            @step
            def one(self):
                pass

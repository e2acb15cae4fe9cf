"""Canceling, pausing and resuming parents and children."""

from __future__ import annotations

from geneva_drive import Workflow, step
from geneva_drive.testing import perform_next_step
from tests.children._support import children_of, counters, reload, run_due
from tests.engine._support import history
from tests.support.app import AuditEntry


class LcChild(Workflow):
    may_proceed_without_hero = True

    @step
    def first(self):
        pass

    @step
    def second(self):
        pass


class LcGrandparent(Workflow):
    may_proceed_without_hero = True

    @step
    def split(self):
        self.start_child(LcParent, key="p")

    @step(wait_for_children="all")
    def close(self):
        pass


class LcParent(Workflow):
    may_proceed_without_hero = True

    @step
    def split(self):
        for key in ("a", "b"):
            self.start_child(LcChild, key=key, allow_multiple=True)

    @step(wait_for_children="all")
    def close(self):
        self.session.add(AuditEntry(note=f"closed {self.children_ended}/{self.children_started}"))


class LcKeepsChildren(LcParent):
    cancel_children = False


class LcCancelsItself(Workflow):
    may_proceed_without_hero = True

    @step
    def split(self):
        self.start_child(LcChild, key="a", allow_multiple=True)

    @step
    def give_up(self):
        self.cancel()


def _start(session, cls):
    wf = cls.create(session)
    session.commit()
    return wf


def _notes(session):
    session.commit()
    return [n for (n,) in session.query(AuditEntry.note).order_by(AuditEntry.id)]


def test_canceling_a_parent_cancels_its_ongoing_children(gd, session):
    parent = _start(session, LcParent)
    perform_next_step(parent)
    a, b = children_of(session, parent)
    perform_next_step(a)
    perform_next_step(a)  # a finished; b is still ongoing

    reload(session, parent).cancel()
    session.commit()

    assert {k.child_key: k.state for k in children_of(session, parent)} == {
        "a": "finished",
        "b": "canceled",
    }
    assert history(session, b) == [("first", "canceled", "canceled")]
    assert reload(session, parent).state == "canceled"
    assert counters(session, parent) == (2, 2, 1)


def test_canceling_a_workflow_cancels_its_grandchildren_too(gd, session):
    top = _start(session, LcGrandparent)
    perform_next_step(top)
    (middle,) = children_of(session, top)
    perform_next_step(middle)

    reload(session, top).cancel()
    session.commit()

    assert reload(session, middle).state == "canceled"
    assert {k.state for k in children_of(session, middle)} == {"canceled"}


def test_cancel_children_false_leaves_the_children_running(gd, session):
    parent = _start(session, LcKeepsChildren)
    perform_next_step(parent)

    reload(session, parent).cancel()
    session.commit()

    assert {k.state for k in children_of(session, parent)} == {"ready"}
    run_due(session)
    assert {k.state for k in children_of(session, parent)} == {"finished"}


def test_a_parent_that_cancels_itself_in_a_step_cancels_its_children(gd, session):
    parent = _start(session, LcCancelsItself)
    perform_next_step(parent)
    perform_next_step(parent)

    assert reload(session, parent).state == "canceled"
    assert [k.state for k in children_of(session, parent)] == ["canceled"]


def test_pausing_a_parent_leaves_its_children_running(gd, session):
    parent = _start(session, LcParent)
    perform_next_step(parent)

    reload(session, parent).pause()
    session.commit()
    run_due(session)

    assert {k.state for k in children_of(session, parent)} == {"finished"}
    assert reload(session, parent).state == "paused"


def test_children_finishing_while_the_parent_is_paused_wake_it_on_resume(gd, session):
    parent = _start(session, LcParent)
    perform_next_step(parent)
    perform_next_step(parent)  # close parks
    reload(session, parent).pause()
    session.commit()

    run_due(session)  # the children finish; the paused parent is counted, not woken

    assert counters(session, parent) == (2, 2, 0)
    assert history(session, parent)[-1] == ("close", "waiting", None)
    assert _notes(session) == []

    reload(session, parent).resume()
    session.commit()
    run_due(session)

    assert _notes(session) == ["closed 2/2"]
    assert reload(session, parent).state == "finished"

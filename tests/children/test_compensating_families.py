"""Compensation meets child workflows: a canceled parent cancels its children when its
compensations start, and a child canceled with its parent runs its own."""

from __future__ import annotations

from geneva_drive import Workflow, step
from geneva_drive.testing import perform_next_step
from tests.children._support import children_of, reload, run_due
from tests.engine._support import history
from tests.support.app import AuditEntry


def _note(workflow: Workflow, text: str) -> None:
    workflow.session.add(AuditEntry(note=text))


class CfParcel(Workflow):
    may_proceed_without_hero = True

    @step(compensate="unbook")
    def book(self):
        _note(self, f"book {self.child_key}")
        return {"booking": f"b-{self.child_key}"}

    @step
    def hand_over(self):
        _note(self, f"hand over {self.child_key}")

    def unbook(self):
        _note(self, f"unbook {self.result_of('book')['booking']}")


class CfOrder(Workflow):
    may_proceed_without_hero = True

    @step(compensate="release_stock")
    def reserve_stock(self):
        _note(self, "reserve")

    @step
    def split(self):
        for key in ("p1", "p2"):
            self.start_child(CfParcel, key=key, allow_multiple=True)

    @step(wait_for_children="all")
    def close(self):
        _note(self, "close")

    def release_stock(self):
        states = sorted(k.state for k in self.session.query(CfParcel).filter_by(parent_id=self.id))
        _note(self, f"release stock; children {states}")


def _start(session, cls):
    wf = cls.create(session)
    session.commit()
    return wf


def _notes(session):
    session.commit()
    return [n for (n,) in session.query(AuditEntry.note).order_by(AuditEntry.id)]


def test_canceling_a_parent_cancels_its_children_before_its_compensations_run(gd, session):
    order = _start(session, CfOrder)
    perform_next_step(order)  # reserve_stock
    perform_next_step(order)  # split: two parcels, ready
    assert [k.state for k in children_of(session, order)] == ["ready", "ready"]

    reload(session, order).cancel()
    session.commit()

    assert {k.child_key: k.state for k in children_of(session, order)} == {
        "p1": "canceled",
        "p2": "canceled",
    }
    assert reload(session, order).next_step_name == "release_stock"
    run_due(session)
    assert _notes(session) == ["reserve", "release stock; children ['canceled', 'canceled']"]
    assert reload(session, order).state == "canceled"


def test_a_child_canceled_with_its_parent_runs_its_own_compensations(gd, session):
    order = _start(session, CfOrder)
    perform_next_step(order)
    perform_next_step(order)
    p1, _ = children_of(session, order)
    perform_next_step(p1)  # p1 booked: it owes unbook

    reload(session, order).cancel()
    session.commit()
    run_due(session)

    notes = _notes(session)
    assert "unbook b-p1" in notes
    assert "unbook b-p2" not in notes  # p2 booked nothing
    assert history(session, p1)[-1] == ("unbook", "completed", "success")
    assert {k.state for k in children_of(session, order)} == {"canceled"}
    assert reload(session, order).state == "canceled"

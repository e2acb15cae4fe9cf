"""A step is a unit of work: its writes commit with its outcome, or not at all."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import IntegrityError

from geneva_drive import Workflow, step
from geneva_drive.testing import perform_next_step
from tests.engine._support import executions, history, reload
from tests.support.app import AuditEntry, Order


class UowWrites(Workflow):
    @step
    def first(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="first"))
        self.hero.status = "touched"


class UowRaises(Workflow):
    @step
    def first(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="half done"))
        self.hero.status = "half"
        self.session.flush()  # even flushed writes must roll back
        raise RuntimeError("crash mid-step")


class UowRaisesThenReattempts(Workflow):
    @step(on_exception="reattempt")
    def first(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="lost"))
        raise RuntimeError("crash mid-step")


class UowCancels(Workflow):
    @step
    def first(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="before cancel"))
        self.cancel()


class UowPauses(Workflow):
    @step
    def first(self) -> None:
        self.hero.status = "paused-here"
        self.pause()


class UowReattempts(Workflow):
    @step
    def first(self) -> None:
        self.hero.counter += 1
        self.session.add(AuditEntry(order_id=self.hero.id, note=f"try {self.hero.counter}"))
        if self.hero.counter < 2:
            self.reattempt()


class UowSkips(Workflow):
    @step
    def first(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="before skip"))
        self.skip()


class UowWritesRefused(Workflow):
    @step(on_exception="reattempt", max_reattempts=1)
    def first(self) -> None:
        self.hero.status = "lost with the refused row"
        self.session.add(AuditEntry(order_id=self.hero.id, note=None))  # NOT NULL: refused


def _start(session, cls):
    order = Order()
    session.add(order)
    wf = cls.create(session, hero=order)
    session.commit()
    return wf, order


def _notes(session) -> list[str]:
    session.commit()
    session.expire_all()
    return [a.note for a in session.query(AuditEntry).order_by(AuditEntry.id)]


def _order(session, order) -> Order:
    session.commit()
    session.refresh(order)
    return order


def test_a_steps_writes_commit_with_its_outcome(session):
    wf, order = _start(session, UowWrites)

    perform_next_step(wf)

    assert _notes(session) == ["first"]
    assert _order(session, order).status == "touched"
    assert history(session, wf) == [("first", "completed", "success")]


def test_a_step_that_raises_rolls_back_its_writes(session):
    wf, order = _start(session, UowRaises)

    with pytest.raises(RuntimeError, match="crash mid-step"):
        perform_next_step(wf)

    assert _notes(session) == []
    assert _order(session, order).status == "new"
    assert history(session, wf) == [("first", "failed", "failed")]


def test_a_step_that_raises_and_is_reattempted_still_rolls_back_its_writes(session):
    wf, _ = _start(session, UowRaisesThenReattempts)

    with pytest.raises(RuntimeError, match="crash mid-step"):
        perform_next_step(wf)

    assert _notes(session) == []
    assert history(session, wf)[0] == ("first", "completed", "reattempted")


def test_a_step_that_cancels_keeps_its_writes(session):
    wf, _ = _start(session, UowCancels)

    perform_next_step(wf)

    assert _notes(session) == ["before cancel"]
    assert reload(session, wf).state == "canceled"


def test_a_step_that_pauses_keeps_its_writes(session):
    wf, order = _start(session, UowPauses)

    perform_next_step(wf)

    assert _order(session, order).status == "paused-here"
    assert reload(session, wf).state == "paused"


def test_a_step_that_reattempts_keeps_each_attempts_writes(session):
    wf, order = _start(session, UowReattempts)

    perform_next_step(wf)
    perform_next_step(wf)

    assert _notes(session) == ["try 1", "try 2"]
    assert _order(session, order).counter == 2
    assert reload(session, wf).state == "finished"


def test_a_step_that_skips_keeps_its_writes(session):
    wf, _ = _start(session, UowSkips)

    perform_next_step(wf)

    assert _notes(session) == ["before skip"]


def test_writes_the_database_refuses_fail_the_step_like_an_exception(session):
    wf, order = _start(session, UowWritesRefused)

    with pytest.raises(IntegrityError):  # the policy reattempts once
        perform_next_step(wf)
    with pytest.raises(IntegrityError):  # then gives up: the workflow pauses
        perform_next_step(wf)

    assert _notes(session) == []
    assert _order(session, order).status == "new"
    assert history(session, wf) == [
        ("first", "completed", "reattempted"),
        ("first", "failed", "failed"),
    ]
    assert reload(session, wf).state == "paused"
    failed = executions(session, wf)[-1]
    assert "IntegrityError" in (failed.error_class_name or "")

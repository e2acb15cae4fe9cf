"""A step body whose session breaks — a refused flush, an autoflush, a lost connection — fails
the step like any other error: the policy applies and the execution never stays in progress."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from geneva_drive import Workflow, resumable_step, step
from geneva_drive.core.errors import UnitOfWorkError
from geneva_drive.engine.executor import RunOptions, run_execution
from tests.engine._support import executions, history, reload
from tests.support.app import AuditEntry, Order
from tests.support.connections import lose_connection


def _refused(session: Session, order: Order) -> None:
    session.add(AuditEntry(order_id=order.id, note=None))  # NOT NULL: refused


class BrokenFlush(Workflow):
    @step(on_exception="reattempt", max_reattempts=1)
    def first(self) -> None:
        self.hero.status = "lost with the refused row"
        _refused(self.session, self.hero)
        self.session.flush()


class BrokenAutoflush(Workflow):
    @step(on_exception="reattempt", max_reattempts=1)
    def first(self) -> None:
        _refused(self.session, self.hero)
        self.session.execute(select(AuditEntry)).all()  # autoflushes the refused row first


class BrokenSwallowed(Workflow):
    @step(on_exception="reattempt", max_reattempts=1)
    def first(self) -> None:
        _refused(self.session, self.hero)
        with contextlib.suppress(IntegrityError):  # carries on; its transaction is gone
            self.session.flush()


class BrokenConnection(Workflow):
    @step(on_exception="reattempt", max_reattempts=1)
    def first(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="lost with the connection"))
        lose_connection(self.session)
        self.session.execute(select(AuditEntry)).all()


class BrokenConnectionSwallowed(Workflow):
    @step(on_exception="reattempt", max_reattempts=1)
    def first(self) -> None:
        lose_connection(self.session)
        with contextlib.suppress(DBAPIError):
            self.session.execute(select(AuditEntry)).all()


def _start(session: Session, cls: type[Workflow]) -> tuple[Workflow, Order]:
    order = Order()
    session.add(order)
    wf = cls.create(session, hero=order)
    session.commit()
    return wf, order


def _run_current(session: Session, wf: Workflow, raises: type[Exception]) -> Exception:
    current = reload(session, wf).current_execution
    assert current is not None and current.state == "scheduled"
    execution_id = current.id
    session.commit()
    with pytest.raises(raises) as raised:  # the step's error, once its outcome is recorded
        run_execution(execution_id, options=RunOptions(worker_id="w1"))
    return raised.value


def _notes(session: Session) -> list[Any]:
    session.commit()
    session.expire_all()
    return list(session.scalars(select(AuditEntry.note)))


@pytest.mark.parametrize(
    ("cls", "raises"),
    [
        (BrokenFlush, IntegrityError),
        (BrokenAutoflush, IntegrityError),
        (BrokenSwallowed, UnitOfWorkError),
        (BrokenConnection, DBAPIError),
    ],
    ids=["flush", "autoflush", "swallowed", "lost connection"],
)
def test_a_step_whose_session_breaks_fails_and_its_policy_applies(session, cls, raises):
    wf, order = _start(session, cls)

    _run_current(session, wf, raises)  # the policy reattempts once
    _run_current(session, wf, raises)  # then gives up: the workflow pauses

    assert history(session, wf) == [
        ("first", "completed", "reattempted"),
        ("first", "failed", "failed"),
    ]
    assert reload(session, wf).state == "paused"
    failed = executions(session, wf)[-1]
    assert failed.error_class_name and failed.lease_owner is None
    assert _notes(session) == []
    session.refresh(order)
    assert order.status == "new"


def test_a_step_that_swallows_a_refused_flush_is_told_how_to_recover_inside_the_step(session):
    wf, _ = _start(session, BrokenSwallowed)

    message = str(_run_current(session, wf, UnitOfWorkError))

    assert "BrokenSwallowed.step 'first'" in message and "IntegrityError" in message
    assert "begin_nested()" in message


def test_a_step_that_swallows_a_lost_connection_fails_and_its_policy_applies(session):
    wf, _ = _start(session, BrokenConnectionSwallowed)

    error = _run_current(session, wf, UnitOfWorkError)

    assert "connection was lost" in str(error)
    assert history(session, wf) == [
        ("first", "completed", "reattempted"),
        ("first", "scheduled", None),
    ]


class BrokenResumable(Workflow):
    @resumable_step(on_exception="reattempt", max_reattempts=1)
    def walk(self, it: Any) -> None:
        for item in it.iterate_over([1, 2, 3]):
            if item == 2:  # after a checkpoint: the flush breaks the iteration's session
                _refused(self.session, self.hero)
                self.session.flush()
            self.session.add(AuditEntry(order_id=self.hero.id, note=f"item {item}"))


def test_a_resumable_step_whose_session_breaks_mid_iteration_fails_and_its_policy_applies(
    session,
):
    wf, _ = _start(session, BrokenResumable)

    _run_current(session, wf, IntegrityError)

    assert history(session, wf) == [
        ("walk", "completed", "reattempted"),
        ("walk", "scheduled", None),
    ]
    broken = executions(session, wf)[0]
    assert broken.exception_info is not None
    assert broken.exception_info["class"] == "sqlalchemy.exc.IntegrityError"
    assert broken.lease_owner is None
    assert reload(session, wf).state == "ready"  # reattempted once, as the policy says

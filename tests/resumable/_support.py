"""Helpers shared by the resumable-step tests (workflow classes live in each test file)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from geneva_drive import FrozenClock, StepExecution, Workflow
from geneva_drive.core.settings import settings
from tests.engine._support import executions, reload
from tests.support.app import AuditEntry, Order


def start(session: Session, cls: type[Workflow], **attrs: Any) -> tuple[Any, Order]:
    order = Order(**attrs)
    session.add(order)
    wf = cls.create(session, hero=order)
    session.commit()
    return wf, order


def notes(session: Session) -> list[str]:
    """Notes of every audit row, in insertion order, freshly read."""
    session.commit()
    session.expire_all()
    return list(session.execute(select(AuditEntry.note).order_by(AuditEntry.id)).scalars())


def chain(session: Session, workflow: Workflow, step_name: str) -> list[StepExecution]:
    return [e for e in executions(session, workflow) if e.step_name == step_name]


def summary(session: Session, workflow: Workflow) -> list[tuple[str, str, str | None, Any]]:
    """(step, state, outcome, cursor value) of every execution."""
    return [
        (e.step_name, e.state, e.outcome, e.cursor_value) for e in executions(session, workflow)
    ]


def advance_clock(**delta: float) -> None:
    """Move the configured clock (the test's FrozenClock) on, from inside a step body."""
    clock = settings().clock
    assert isinstance(clock, FrozenClock), f"these steps run under a FrozenClock, not {clock!r}"
    clock.advance(**delta)


def other_pause(workflow_id: int) -> None:
    """An operator pauses the workflow from another connection, committed at once."""
    with Session(settings().require_engine()) as s:
        wf = s.get(Workflow, workflow_id)
        assert wf is not None
        wf.pause()
        s.commit()


def other_cancel(workflow_id: int) -> None:
    with Session(settings().require_engine()) as s:
        wf = s.get(Workflow, workflow_id)
        assert wf is not None
        wf.cancel()
        s.commit()


@contextmanager
def counting_commits() -> Iterator[list[int]]:
    """Count COMMITs issued on the configured engine (every connection) inside the block."""
    engine = settings().require_engine()
    count = [0]

    def on_commit(_connection: Any) -> None:
        count[0] += 1

    event.listen(engine, "commit", on_commit)
    try:
        yield count
    finally:
        event.remove(engine, "commit", on_commit)


__all__ = ["chain", "counting_commits", "notes", "other_cancel", "other_pause", "reload", "start"]

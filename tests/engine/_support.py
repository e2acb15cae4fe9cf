"""Small helpers shared by the engine tests (no workflow classes here: those live per file)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive import StepExecution, Workflow
from geneva_drive.core.settings import settings
from geneva_drive.runtime.backends import EnqueuedStep


class RecordingBackend:
    """A real backend that only records the wake-ups it is handed."""

    def __init__(self) -> None:
        self.enqueued: list[EnqueuedStep] = []

    def enqueue(self, step: EnqueuedStep) -> None:
        self.enqueued.append(step)

    @property
    def execution_ids(self) -> list[int]:
        return [s.execution_id for s in self.enqueued]


def history(session: Session, workflow: Workflow) -> list[tuple[str, str, str | None]]:
    """(step_name, state, outcome) of every execution, freshly read from the database."""
    return [(e.step_name, e.state, e.outcome) for e in executions(session, workflow)]


def executions(session: Session, workflow: Workflow) -> list[StepExecution]:
    if session.in_transaction():
        session.commit()
    session.expire_all()
    return list(
        session.execute(
            select(StepExecution)
            .where(StepExecution.workflow_id == workflow.id)
            .order_by(StepExecution.created_at, StepExecution.id)
        ).scalars()
    )


def reload(session: Session, workflow: Workflow) -> Workflow:
    if session.in_transaction():
        session.commit()
    session.expire_all()
    session.refresh(workflow)
    return workflow


def current(session: Session, workflow: Workflow) -> StepExecution | None:
    reload(session, workflow)
    return workflow.current_execution


@contextmanager
def other_session() -> Iterator[Session]:
    """A second application session on the configured engine (another process, in effect)."""
    with Session(settings().require_engine(), expire_on_commit=False) as s:
        yield s


def load_elsewhere(s: Session, workflow_id: int) -> Any:
    return s.get(Workflow, workflow_id)

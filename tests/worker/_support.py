"""Helpers for the worker and housekeeping tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, cast

import pytest
from sqlalchemy import Engine, Table, select, text
from sqlalchemy.orm import Session

from geneva_drive import StepExecution, Workflow
from geneva_drive.engine.executor import RunOptions, run_execution
from geneva_drive.storage.db import session_factory
from tests.worker.apps import SimulatedCrash


def table_of(model: type[Any]) -> Table:
    """A mapped class's table, as the Table it is (SQLAlchemy types ``__table__`` loosely)."""
    return cast(Table, model.__table__)


def crash_current_step(
    session: Session, workflow: Workflow, *, worker_id: str | None = None, lease: float = 30
) -> StepExecution:
    """Run the workflow's scheduled step as a worker that dies mid-step (phase 1 committed).

    With ``worker_id`` the dead worker held a lease (the database worker); without, it held
    none (an external backend such as Celery).
    """
    session.commit()
    session.expire_all()
    current = workflow.current_execution
    assert current is not None and current.state == "scheduled", current
    options = RunOptions(worker_id=worker_id, lease=timedelta(seconds=lease))
    with pytest.raises(SimulatedCrash):
        run_execution(current.id, options=options)
    return fresh_execution(session, current.id)


def fresh_execution(session: Session, execution_id: int) -> StepExecution:
    if session.in_transaction():
        session.commit()
    session.expire_all()
    found = session.get(StepExecution, execution_id)
    assert found is not None
    return found


def trail(session: Session, workflow: Workflow) -> list[tuple[str, str, str | None]]:
    if session.in_transaction():
        session.commit()
    session.expire_all()
    rows = session.execute(
        select(StepExecution.step_name, StepExecution.state, StepExecution.outcome)
        .where(StepExecution.workflow_id == workflow.id)
        .order_by(StepExecution.created_at, StepExecution.id)
    )
    return [(name, state, outcome) for name, state, outcome in rows]


def state_of(session: Session, workflow: Workflow) -> Any:
    if session.in_transaction():
        session.commit()
    session.expire_all()
    session.refresh(workflow)
    return workflow.state


DEADLINE = 60.0


def wait_until_true(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``DEADLINE`` seconds."""
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)  # polling a condition with a deadline


def finished(gd: Any, workflow_id: int) -> Callable[[], bool]:
    """A check, in a fresh session of ``gd``, that the workflow has finished."""

    def check() -> bool:
        with session_factory(gd)() as s:
            return bool(s.get(Workflow, workflow_id).state == "finished")

    return check


def someone_waits_for_a_lock(engine: Engine) -> bool:
    """Whether a backend of this database is waiting for a lock (PostgreSQL)."""
    return lock_waiters(engine) > 0


def lock_waiters(engine: Engine) -> int:
    """How many backends of this database are waiting for a lock (PostgreSQL)."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            ).scalar_one()
        )

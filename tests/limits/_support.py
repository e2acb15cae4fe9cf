"""Driving phase 1 and phases 2–3 separately, so a test can hold steps in progress."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from geneva_drive import StepExecution, Workflow
from geneva_drive.engine.executor import _continue
from geneva_drive.engine.prepare import PhaseOne, Prepared, phase1
from geneva_drive.engine.run_options import RunOptions
from geneva_drive.storage.db import session_factory
from geneva_drive.storage.models import LimitSlot, LimitWaiter, RateStart

OPTIONS = RunOptions(worker_id="test-worker", lease=timedelta(seconds=30))


def claim_and_start(gd: Any) -> tuple[Session, PhaseOne]:
    """Claim the next due execution and run its phase 1 (committed); the step's session is
    returned open, for :func:`finish` to run its body and phase 3."""
    session = session_factory(gd)()
    return session, phase1(session, OPTIONS, gd)


def finish(gd: Any, session: Session, started: PhaseOne) -> None:
    assert isinstance(started, Prepared)
    try:
        _continue(session, started, OPTIONS, gd, reraise=True)
    finally:
        session.close()


def start_all(gd: Any) -> list[tuple[Session, PhaseOne]]:
    """Phase 1 of every due execution, one after another, until nothing is claimed."""
    runs: list[tuple[Session, PhaseOne]] = []
    while True:
        session, started = claim_and_start(gd)
        if type(started).__name__ == "NotClaimed":
            session.close()
            return runs
        runs.append((session, started))


def _fresh(session: Session) -> None:
    """End the session's read transaction (SQLite reads keep their snapshot until then)."""
    if session.in_transaction():
        session.commit()
    session.expire_all()


def rows(session: Session, workflows: Sequence[Workflow]) -> list[StepExecution]:
    _fresh(session)
    ids = [wf.id for wf in workflows]
    return list(
        session.scalars(
            select(StepExecution)
            .where(StepExecution.workflow_id.in_(ids))
            .order_by(StepExecution.workflow_id, StepExecution.id)
        )
    )


def counts(session: Session) -> tuple[int, int, int]:
    """(held slots, waiters, rate starts) in the tables."""
    _fresh(session)
    held = select(func.count()).select_from(LimitSlot).where(LimitSlot.execution_id.is_not(None))
    return (
        session.scalar(held) or 0,
        session.scalar(select(func.count()).select_from(LimitWaiter)) or 0,
        session.scalar(select(func.count()).select_from(RateStart)) or 0,
    )

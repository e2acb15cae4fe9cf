"""Helpers shared by the signal tests (no workflow classes here: those live per file)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive import Signal, StepExecution, Workflow
from geneva_drive.engine.executor import RunOptions, claim_and_run
from tests.engine._support import executions, reload
from tests.support.app import AuditEntry, Order


def start(session: Session, cls: type[Workflow], **hero_fields: Any) -> Any:
    order = Order(**hero_fields)
    session.add(order)
    wf = cls.create(session, hero=order)
    session.commit()
    return wf


def signals_of(session: Session, workflow: Workflow) -> list[Signal]:
    """Every signal of ``workflow``, oldest first, freshly read."""
    if session.in_transaction():
        session.commit()
    session.expire_all()
    return list(
        session.execute(
            select(Signal)
            .where(Signal.workflow_id == workflow.id)
            .order_by(Signal.created_at, Signal.id)
        ).scalars()
    )


def signal_row(session: Session, workflow: Workflow, name: str) -> tuple[str, int, int]:
    """(state, claimed, consumed) of the only signal called ``name``."""
    (row,) = [s for s in signals_of(session, workflow) if s.name == name]
    return (row.state, row.claimed, row.consumed)


def notes(session: Session, workflow: Workflow) -> list[str]:
    if session.in_transaction():
        session.commit()
    return list(
        session.execute(
            select(AuditEntry.note)
            .where(AuditEntry.order_id == int(workflow.hero_id))
            .order_by(AuditEntry.id)
        ).scalars()
    )


def timer_of(session: Session, workflow: Workflow) -> StepExecution | None:
    """The scheduled signal-timeout row of ``workflow``, if any."""
    rows = [
        e
        for e in executions(session, workflow)
        if (e.metadata_json or {}).get("timeout_for") is not None and e.state == "scheduled"
    ]
    session.commit()  # end the read: on SQLite a stale snapshot cannot write later
    return rows[0] if rows else None


def run_due(session: Session) -> int:
    """What a worker does right now: run every due execution; returns how many ran."""
    if session.in_transaction():
        session.commit()
    ran = 0
    while claim_and_run(None, RunOptions()):
        ran += 1
    return ran


__all__ = ["executions", "notes", "reload", "run_due", "signal_row", "signals_of", "start"]


def drive(workflow: Workflow, max_steps: int = 50, *, raise_errors: bool = True) -> Workflow:
    """Like ``speedrun``, but stops (instead of raising) when a step parks for a signal.

    A step's error is raised, as by ``speedrun``, unless ``raise_errors=False``.
    """
    from geneva_drive.testing import perform_next_step

    for _ in range(max_steps):
        reload(workflow.session, workflow)
        if workflow.state in ("finished", "canceled", "paused"):
            return workflow
        execution = workflow.current_execution
        if execution is None or execution.state == "waiting":
            return workflow
        perform_next_step(workflow, raise_errors=raise_errors)
    raise AssertionError(f"drive() exceeded {max_steps} steps")

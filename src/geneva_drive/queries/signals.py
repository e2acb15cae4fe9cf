"""Signal rows and the executions that wait for or are attached to them.

Every look-up reloads what it finds (``populate_existing``): they run under the workflow row
lock, and a row another process committed before we took it must be seen as it is now, not as
an earlier read in this session left it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..models import Signal, StepExecution
from ..states import ExecutionState
from ._sql import in_state

CONSUMED = "consumed"


def find_delivery(session: Session, workflow_id: int, name: str, key: str) -> Signal | None:
    """The signal already delivered with this name and idempotency key, if any."""
    stmt = (
        select(Signal)
        .where(
            Signal.workflow_id == workflow_id,
            Signal.name == name,
            Signal.idempotency_key == key,
        )
        .execution_options(populate_existing=True)
    )
    return session.execute(stmt).scalar_one_or_none()


def unconsumed_signals(session: Session, workflow_id: int) -> Sequence[Signal]:
    """Signals not yet consumed, oldest first: the candidates at the gate and on resume."""
    stmt = (
        select(Signal)
        .where(Signal.workflow_id == workflow_id, Signal.state != CONSUMED)
        .order_by(Signal.created_at, Signal.id)
        .execution_options(populate_existing=True)
    )
    return session.execute(stmt).scalars().all()


def newest_signal_named(session: Session, workflow_id: int, name: str) -> Signal | None:
    stmt = (
        select(Signal)
        .where(Signal.workflow_id == workflow_id, Signal.name == name)
        .order_by(Signal.created_at.desc(), Signal.id.desc())
        .limit(1)
        .execution_options(populate_existing=True)
    )
    return session.execute(stmt).scalar_one_or_none()


def parked_executions(session: Session, workflow_id: int) -> Sequence[StepExecution]:
    """The workflow's executions waiting for a signal, oldest first."""
    stmt = (
        select(StepExecution)
        .where(
            StepExecution.workflow_id == workflow_id,
            in_state(StepExecution.state, ExecutionState.WAITING),
        )
        .order_by(StepExecution.created_at, StepExecution.id)
        .execution_options(populate_existing=True)
    )
    return session.execute(stmt).scalars().all()


def executions_attached_to(session: Session, signal_id: int) -> Sequence[StepExecution]:
    """Every execution that carries ``signal_id``, oldest first."""
    stmt = (
        select(StepExecution)
        .where(StepExecution.signal_id == signal_id)
        .order_by(StepExecution.created_at, StepExecution.id)
    )
    return session.execute(stmt).scalars().all()

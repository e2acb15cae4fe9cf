"""Every query geneva-drive runs, named and documented. Only the engine's modules call these.

Lock order, everywhere: the workflow row first, then its execution rows. Holding the workflow
row lock is what serialises everything that happens to one workflow (phase 1 and phase 3 of
the executor, scheduling, signals, operator verbs, housekeeping); execution rows are only
written by a holder of their workflow's lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from .models import StepExecution
from .states import ExecutionState, Outcome, WorkflowState

if TYPE_CHECKING:
    from .workflow import Workflow

_SWEEPABLE = (ExecutionState.SCHEDULED, ExecutionState.WAITING)


def workflow_model() -> type[Workflow]:
    from .workflow import Workflow

    return Workflow


def lock_workflow(session: Session, workflow_id: int) -> Workflow | None:
    """``SELECT … FOR UPDATE`` the workflow row and refresh the instance from it.

    On SQLite ``FOR UPDATE`` is not rendered; the transaction already holds the database write
    lock from ``BEGIN IMMEDIATE`` (see ``engine.py``), which is stronger. Re-locking a row the
    transaction already holds is re-entrant on every engine.
    """
    stmt = (
        select(workflow_model())
        .where(workflow_model().id == workflow_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    return session.execute(stmt).scalar_one_or_none()


def lock_execution(session: Session, execution_id: int) -> StepExecution | None:
    """Lock one execution row (only after its workflow row — see the module docstring)."""
    stmt = (
        select(StepExecution)
        .where(StepExecution.id == execution_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    return session.execute(stmt).scalar_one_or_none()


def get_execution(session: Session, execution_id: int) -> StepExecution | None:
    return session.get(StepExecution, execution_id)


def sweep_strays(session: Session, workflow_id: int, now: datetime) -> int:
    """Cancel scheduled/waiting executions before a new one is created (one active per workflow).

    In-progress rows are never swept: their worker owns them until phase 3.
    """
    result = session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == workflow_id, StepExecution.state.in_(_SWEEPABLE))
        .values(
            state=ExecutionState.CANCELED,
            outcome=Outcome.CANCELED,
            canceled_at=now,
            updated_at=now,
        )
        .execution_options(synchronize_session="fetch")
    )
    return int(getattr(result, "rowcount", 0) or 0)


def current_execution(session: Session, workflow_id: int) -> StepExecution | None:
    """The single scheduled, waiting or in-progress execution, if any (newest wins)."""
    stmt = (
        select(StepExecution)
        .where(
            StepExecution.workflow_id == workflow_id,
            StepExecution.state.in_(
                (ExecutionState.SCHEDULED, ExecutionState.WAITING, ExecutionState.IN_PROGRESS)
            ),
        )
        .order_by(StepExecution.created_at.desc(), StepExecution.id.desc())
        .limit(1)
        # Rows change under other sessions (workers); never answer from a stale identity map.
        .execution_options(populate_existing=True)
    )
    return session.execute(stmt).scalar_one_or_none()


def execution_history(session: Session, workflow_id: int) -> Sequence[StepExecution]:
    stmt = (
        select(StepExecution)
        .where(StepExecution.workflow_id == workflow_id)
        .order_by(StepExecution.created_at, StepExecution.id)
        .execution_options(populate_existing=True)
    )
    return session.execute(stmt).scalars().all()


def consecutive_reattempt_count(session: Session, workflow_id: int, step_name: str) -> int:
    """Reattempts of ``step_name`` since its last clean completion, by (created_at, id).

    Ordering by (created_at, id) rather than id alone keeps the count right with
    non-monotonic keys. Flow-control reattempts (the step asked for them) do not count.
    """
    of_step = and_(StepExecution.workflow_id == workflow_id, StepExecution.step_name == step_name)
    last_reset = session.execute(
        select(StepExecution.created_at, StepExecution.id)
        .where(
            of_step,
            StepExecution.state == ExecutionState.COMPLETED,
            StepExecution.outcome != Outcome.REATTEMPTED,
        )
        .order_by(StepExecution.created_at.desc(), StepExecution.id.desc())
        .limit(1)
    ).first()
    stmt = select(StepExecution.metadata_json).where(
        of_step, StepExecution.outcome == Outcome.REATTEMPTED
    )
    if last_reset is not None:
        created_at, reset_id = last_reset
        stmt = stmt.where(
            or_(
                StepExecution.created_at > created_at,
                and_(StepExecution.created_at == created_at, StepExecution.id > reset_id),
            )
        )
    return sum(
        1
        for (meta,) in session.execute(stmt)
        if (meta or {}).get("reattempt_reason") != "flow_control"
    )


def find_ongoing_duplicate(
    session: Session, type_: str, hero_type: str | None, hero_id: str | None
) -> int | None:
    """Id of an ongoing, single-instance workflow of ``type_`` for this hero, if any."""
    wf = workflow_model()
    stmt = select(wf.id).where(
        wf.type == type_,
        wf.hero_type == hero_type if hero_type is not None else wf.hero_type.is_(None),
        wf.hero_id == hero_id if hero_id is not None else wf.hero_id.is_(None),
        wf.state.notin_((WorkflowState.FINISHED, WorkflowState.CANCELED)),
        wf.allow_multiple.is_(False),
    )
    return session.execute(stmt.limit(1)).scalar_one_or_none()


def executions_of_step(
    session: Session, workflow_id: int, step_name: str, **filters: Any
) -> Sequence[StepExecution]:
    stmt = (
        select(StepExecution)
        .where(StepExecution.workflow_id == workflow_id, StepExecution.step_name == step_name)
        .execution_options(populate_existing=True)
    )
    for column, value in filters.items():
        stmt = stmt.where(getattr(StepExecution, column) == value)
    return (
        session.execute(stmt.order_by(StepExecution.created_at, StepExecution.id)).scalars().all()
    )


def newest_paused_marker(session: Session, workflow_id: int) -> StepExecution | None:
    """Newest completed/workflow_paused execution without a successor (resumable resume)."""
    successors = (
        select(StepExecution.continues_from_id)
        .where(
            StepExecution.workflow_id == workflow_id,
            StepExecution.continues_from_id.is_not(None),
        )
        .scalar_subquery()
    )
    stmt = (
        select(StepExecution)
        .where(
            StepExecution.workflow_id == workflow_id,
            StepExecution.state == ExecutionState.COMPLETED,
            StepExecution.outcome == Outcome.WORKFLOW_PAUSED,
            StepExecution.id.notin_(successors),
        )
        .order_by(StepExecution.created_at.desc(), StepExecution.id.desc())
        .limit(1)
    )
    return session.execute(stmt).scalar_one_or_none()


def claim_due_execution(
    session: Session, now: datetime, queues: Sequence[str] | None
) -> tuple[int, int] | None:
    """Pick one due scheduled execution and lock its *workflow* row, skipping busy workflows.

    ``FOR UPDATE OF workflows SKIP LOCKED`` takes the workflow lock first (the global lock
    order) and lets concurrent workers pass over each other's rows instead of queueing behind
    them. Lower ``priority`` runs first, then the earliest due. SQLite renders neither clause;
    its ``BEGIN IMMEDIATE`` transaction is already the only writer.
    """
    wf = workflow_model()
    stmt = (
        select(StepExecution.id, StepExecution.workflow_id)
        .join(wf, wf.id == StepExecution.workflow_id)
        .where(StepExecution.state == ExecutionState.SCHEDULED)
        .where(StepExecution.scheduled_for <= now)
        # Only ready workflows: a paused one keeps its row for resume(), and claiming it
        # would be a no-op that a worker repeats forever.
        .where(wf.state == WorkflowState.READY)
        .order_by(StepExecution.priority, StepExecution.scheduled_for)
        .limit(1)
        .with_for_update(of=wf, skip_locked=True)
    )
    if queues:
        stmt = stmt.where(StepExecution.queue.in_(queues))
    row = session.execute(stmt).first()
    return None if row is None else (row[0], row[1])


def next_due_time(session: Session, queues: Sequence[str] | None) -> datetime | None:
    stmt = select(func.min(StepExecution.scheduled_for)).where(
        StepExecution.state == ExecutionState.SCHEDULED
    )
    if queues:
        stmt = stmt.where(StepExecution.queue.in_(queues))
    return session.execute(stmt).scalar_one_or_none()

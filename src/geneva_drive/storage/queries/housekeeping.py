"""Housekeeping's queries: stuck rows, batched deletion of old workflows, and the gauges."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    delete,
    func,
    or_,
    select,
)
from sqlalchemy.orm import Session

from geneva_drive.core.states import (
    TERMINAL_WORKFLOW_STATES,
    ExecutionState,
    WorkflowState,
)
from geneva_drive.storage.dialects import dialect_of
from geneva_drive.storage.models import Signal, StepExecution
from geneva_drive.storage.queries._sql import after_key, in_state, keyset, workflow_model

if TYPE_CHECKING:
    pass


def stuck_in_progress_ids(
    session: Session,
    cutoff: datetime,
    now: datetime,
    limit: int,
    after: tuple[datetime, int] | None = None,
) -> list[tuple[datetime, int]]:
    """In-progress executions started before ``cutoff`` whose lease (if any) has run out.

    A step that runs for hours under a worker that still heartbeats is not stuck: only rows
    without a lease (external backends) or with an expired one qualify. By started_at, id.
    """
    stmt = (
        select(StepExecution.started_at, StepExecution.id)
        .where(
            in_state(StepExecution.state, ExecutionState.IN_PROGRESS),
            StepExecution.started_at < cutoff,
            or_(StepExecution.lease_expires_at.is_(None), StepExecution.lease_expires_at < now),
        )
        .order_by(StepExecution.started_at, StepExecution.id)
        .limit(limit)
    )
    if after is not None:
        stmt = stmt.where(after_key(StepExecution.started_at, StepExecution.id, after))
    return keyset(session, stmt)


def stuck_scheduled_ids(
    session: Session, cutoff: datetime, limit: int, after: tuple[datetime, int] | None = None
) -> list[tuple[datetime, int]]:
    """Scheduled executions overdue since before ``cutoff``, oldest first.

    Rows of paused workflows are left out: they are kept on purpose for ``resume()`` (the gem
    recovered them — H-12). ``waiting`` rows are never stuck: they wait for a signal.
    """
    wf = workflow_model()
    stmt = (
        select(StepExecution.scheduled_for, StepExecution.id)
        .join(wf, wf.id == StepExecution.workflow_id)
        .where(
            in_state(StepExecution.state, ExecutionState.SCHEDULED),
            StepExecution.scheduled_for < cutoff,
            wf.state != WorkflowState.PAUSED,
        )
        .order_by(StepExecution.scheduled_for, StepExecution.id)
        .limit(limit)
    )
    if after is not None:
        stmt = stmt.where(after_key(StepExecution.scheduled_for, StepExecution.id, after))
    return [(row[0], row[1]) for row in session.execute(stmt)]


# -- housekeeping: batched cleanup and gauges ------------------------------------------------


def _old_terminal_workflow_ids(cutoff: datetime) -> Any:
    """Ids of finished/canceled workflows that transitioned before ``cutoff``.

    ``state IN (…) AND transitioned_at < cutoff`` is one range per terminal state of
    ``ix_geneva_drive_workflows_state_transitioned`` (``state`` equal, ``transitioned_at``
    bounded), so a pass that finds nothing old reads a few index pages whatever the history
    kept — where the ``state`` index alone matched nearly every row of a mature table.
    """
    wf = workflow_model()
    return select(wf.id).where(
        wf.state.in_(sorted(TERMINAL_WORKFLOW_STATES)),
        wf.transitioned_at < cutoff,
    )


def _delete_batch(session: Session, table: Any, ids: Any) -> int:
    """Delete the rows of ``table`` whose id the ``ids`` query (with its LIMIT) selects.

    PostgreSQL and SQLite: ``DELETE … WHERE id IN (SELECT id FROM (SELECT … LIMIT n) AS
    batch)`` — a semi-join on the primary key. MySQL/MariaDB: the multi-table form ``DELETE
    FROM t USING t, (SELECT … LIMIT n) AS batch WHERE t.id = batch.id``. The derived table is
    what lets MySQL/MariaDB take a LIMIT and read the table being deleted from; the join is
    because a single-table DELETE with an IN sub-query runs it as a *dependent* sub-query
    for every row of the table (no semi-join for DELETE before MariaDB 11.1): a full scan of
    the table per batch, even when nothing is old.
    """
    batch = ids.subquery("batch")
    if dialect_of(session).deletes_by_semi_join:
        stmt = delete(table).where(table.c.id.in_(select(batch.c.id)))
    else:
        stmt = delete(table).where(table.c.id == batch.c.id)
    result = session.execute(stmt, execution_options={"synchronize_session": False})
    return int(getattr(result, "rowcount", 0) or 0)


def delete_executions_of_old_workflows(session: Session, cutoff: datetime, limit: int) -> int:
    """Delete up to ``limit`` executions of finished/canceled workflows older than ``cutoff``."""
    se = StepExecution.__table__
    ids = (
        select(se.c.id).where(se.c.workflow_id.in_(_old_terminal_workflow_ids(cutoff))).limit(limit)
    )
    return _delete_batch(session, se, ids)


def delete_signals_of_old_workflows(session: Session, cutoff: datetime, limit: int) -> int:
    """Delete up to ``limit`` signals of finished/canceled workflows older than ``cutoff``."""
    sig = Signal.__table__
    ids = (
        select(sig.c.id)
        .where(sig.c.workflow_id.in_(_old_terminal_workflow_ids(cutoff)))
        .limit(limit)
    )
    return _delete_batch(session, sig, ids)


def delete_old_workflows(session: Session, cutoff: datetime, limit: int) -> int:
    """Delete up to ``limit`` finished/canceled workflows older than ``cutoff`` (children first)."""
    table = workflow_model().__table__
    return _delete_batch(session, table, _old_terminal_workflow_ids(cutoff).limit(limit))


def waiting_counts(session: Session, since_before: datetime | None = None) -> list[tuple[str, int]]:
    """(workflow type, count) of ``waiting`` executions, optionally parked before a time.

    Each waiting row looks its workflow's type up by primary key (a correlated sub-query)
    instead of joining: with a join grouped by ``type``, SQLite preferred to walk every
    workflow in ``type`` index order (saving the GROUP BY a sort) and probe its executions —
    a pass that grew with the history. This way every planner starts from the waiting rows
    (the ``state`` index) and the cost follows how many are waiting.
    """
    wf = workflow_model()
    type_ = (
        select(wf.type)
        .where(wf.id == StepExecution.workflow_id)
        .scalar_subquery()
        .label("workflow_type")
    )
    stmt = (
        select(type_, func.count())
        .where(in_state(StepExecution.state, ExecutionState.WAITING))
        .group_by(type_)
    )
    if since_before is not None:
        stmt = stmt.where(StepExecution.waiting_since < since_before)
    return [(row[0], int(row[1])) for row in session.execute(stmt)]

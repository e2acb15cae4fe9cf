"""External queues (Celery): what was sent for an execution, and what must be sent now."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import (
    and_,
    case,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session

from geneva_drive.core.states import ExecutionState, WorkflowState
from geneva_drive.storage.models import StepExecution, WorkflowColumns
from geneva_drive.storage.queries._sql import in_state, workflow_model

# -- external queues (Celery): what was sent, what must be sent --------------------------------


def delivery_facts(session: Session, execution_id: int) -> tuple[str, datetime] | None:
    """(state, scheduled_for) of one execution, or None: what a message's receiver checks first."""
    row = session.execute(
        select(StepExecution.state, StepExecution.scheduled_for).where(
            StepExecution.id == execution_id
        )
    ).first()
    return None if row is None else (row[0], row[1])


def execution_to_send(
    session: Session, execution_id: int
) -> tuple[StepExecution, WorkflowColumns] | None:
    """One scheduled execution and its workflow, to send its message again (it came early)."""
    wf = workflow_model()
    row = session.execute(
        select(StepExecution, wf)
        .join(wf, wf.id == StepExecution.workflow_id)
        .where(
            StepExecution.id == execution_id,
            in_state(StepExecution.state, ExecutionState.SCHEDULED),
        )
    ).first()
    return None if row is None else (row[0], row[1])


def record_job_id(
    session: Session,
    execution_id: int,
    job_id: str | None,
    now: datetime,
    resend_at: datetime | None = None,
) -> None:
    """Remember the message that carries an execution (None: no message is out for it).

    ``resend_at``: when that message counts as lost and is sent again, kept in the row's
    ``lease_expires_at`` — while a row is scheduled the column holds no lease (phase 1 writes
    it anew when the step starts, with or without a lease), and the sent message is, in
    effect, a lease on the row. Written only while the row is still scheduled: a fast worker
    may have started the step before the sender got here, and its lease must stay. No
    migration needed, and :func:`executions_to_dispatch` can compare it in SQL.

    ``job_id`` is delivery bookkeeping, not workflow state, so this one write goes without
    the workflow lock: a send never waits for a step.
    """
    scheduled = in_state(StepExecution.state, ExecutionState.SCHEDULED)
    session.execute(
        update(StepExecution)
        .where(StepExecution.id == execution_id)
        .values(
            job_id=job_id,
            updated_at=now,
            lease_expires_at=case(
                (scheduled, literal(resend_at, StepExecution.lease_expires_at.type)),
                else_=StepExecution.lease_expires_at,
            ),
        )
        .execution_options(synchronize_session=False)
    )


def executions_to_dispatch(
    session: Session, *, now: datetime, send_before: datetime, resend_before: datetime, limit: int
) -> Sequence[tuple[StepExecution, WorkflowColumns]]:
    """Scheduled executions of ready workflows that an external queue must be told about.

    Never sent (``job_id`` is NULL) and due before ``send_before`` (now + the ETA horizon); or
    sent, and its resend time (see :func:`record_job_id`) has come — a message presumed lost.
    A row sent without a resend time (by an older version) is resent once it was sent before
    ``resend_before`` and due since before it. Paused workflows' rows wait for ``resume()``.
    The outer ``scheduled_for`` bound lets the scheduled rows' ``scheduled_for`` index do the
    work: cost follows due rows, not table size.
    """
    wf = workflow_model()
    resend_at = StepExecution.lease_expires_at
    stmt = (
        select(StepExecution, wf)
        .join(wf, wf.id == StepExecution.workflow_id)
        .where(
            in_state(StepExecution.state, ExecutionState.SCHEDULED),
            StepExecution.scheduled_for <= send_before,
            wf.state == WorkflowState.READY,
            or_(
                StepExecution.job_id.is_(None),
                and_(resend_at.is_not(None), resend_at <= now),
                and_(
                    resend_at.is_(None),
                    StepExecution.scheduled_for <= resend_before,
                    StepExecution.updated_at <= resend_before,
                ),
            ),
        )
        .order_by(StepExecution.scheduled_for, StepExecution.id)
        .limit(limit)
        .execution_options(populate_existing=True)
    )
    return [(row[0], row[1]) for row in session.execute(stmt)]

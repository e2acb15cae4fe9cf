"""Child workflows: a parent's children by key and by state, a child's failure.

A child is found by its parent and key through ``ix_geneva_drive_workflows_child`` (unique
over ``(parent_id, child_key)``); every query here reads that index's ``parent_id`` prefix.
The fan-in itself reads none of them: it counts on the parent's counters
(``children_started``, ``children_ended``, ``children_failed``). Only the rarer questions — which
children are still ongoing (a cascading cancel), which one was canceled (``ChildFailed``), how
many are in each state (admin) — read the parent's children.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from geneva_drive.core.states import TERMINAL_WORKFLOW_STATES, WorkflowState
from geneva_drive.storage.models import StepExecution, WorkflowColumns
from geneva_drive.storage.queries._sql import workflow_model


def find_child(session: Session, parent_id: int, key: str) -> WorkflowColumns | None:
    """The child ``parent_id`` started under ``key``, if it exists (one index probe)."""
    wf = workflow_model()
    stmt = select(wf).where(wf.parent_id == parent_id, wf.child_key == key)
    return session.execute(stmt).scalar_one_or_none()


def ongoing_child_ids(session: Session, parent_id: int) -> list[int]:
    """The ids of the parent's children that are not finished or canceled, oldest first."""
    wf = workflow_model()
    stmt = (
        select(wf.id)
        .where(wf.parent_id == parent_id, wf.state.notin_(TERMINAL_WORKFLOW_STATES))
        .order_by(wf.id)
    )
    return list(session.execute(stmt).scalars())


def first_canceled_child(session: Session, parent_id: int) -> WorkflowColumns | None:
    """The parent's first child (by id) that ended canceled: the one ``ChildFailed`` names."""
    wf = workflow_model()
    stmt = (
        select(wf)
        .where(wf.parent_id == parent_id, wf.state == WorkflowState.CANCELED)
        .order_by(wf.id)
        .limit(1)
    )
    return session.execute(stmt).scalar_one_or_none()


def last_error(session: Session, workflow_id: int) -> StepExecution | None:
    """The workflow's newest execution that recorded an error class, if any."""
    stmt = (
        select(StepExecution)
        .where(
            StepExecution.workflow_id == workflow_id,
            StepExecution.error_class_name.is_not(None),
        )
        .order_by(StepExecution.created_at.desc(), StepExecution.id.desc())
        .limit(1)
    )
    return session.execute(stmt).scalar_one_or_none()


def counts_by_state(session: Session, parent_id: int) -> dict[str, int]:
    """How many of the parent's children are in each state (the admin's summary)."""
    wf = workflow_model()
    stmt = (
        select(wf.state, func.count())
        .where(wf.parent_id == parent_id)
        .group_by(wf.state)
        .order_by(wf.state)
    )
    return {str(state): int(count) for state, count in session.execute(stmt)}


def children_page(session: Session, parent_id: int, *, limit: int) -> Sequence[WorkflowColumns]:
    """The parent's first ``limit`` children by key (the admin's links)."""
    wf = workflow_model()
    stmt = select(wf).where(wf.parent_id == parent_id).order_by(wf.child_key).limit(limit)
    return session.execute(stmt).scalars().all()

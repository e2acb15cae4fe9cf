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
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from geneva_drive.core.states import TERMINAL_WORKFLOW_STATES, WorkflowState
from geneva_drive.storage.models import StepExecution, WorkflowColumns, workflows_table
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


def oldest_paused_child(session: Session, parent_id: int) -> WorkflowColumns | None:
    """The parent's child paused the longest (``children_timeout``), if any is paused."""
    wf = workflow_model()
    stmt = (
        select(wf)
        .where(wf.parent_id == parent_id, wf.state == WorkflowState.PAUSED)
        .order_by(wf.transitioned_at, wf.id)
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


def family_of(session: Session, workflow_id: int) -> Any:
    """The workflow's parent (id, type, state), its own key, and its counters: one row, by id.

    On the table, not the mapped class: ``show`` calls it for every workflow, and a reading
    command must not import the workflow DSL to map it (issue 42)."""
    wf = workflows_table
    parent = wf.alias("parent")
    stmt = (
        select(
            wf.c.parent_id,
            wf.c.child_key,
            wf.c.children_started,
            wf.c.children_ended,
            wf.c.children_failed,
            parent.c.type.label("parent_type"),
            parent.c.state.label("parent_state"),
        )
        .select_from(wf.outerjoin(parent, parent.c.id == wf.c.parent_id))
        .where(wf.c.id == workflow_id)
    )
    return session.execute(stmt).first()


def count_child_end(session: Session, parent_id: int, *, failed: bool) -> Any:
    """Add one ended child (and one failed, if it was canceled) to the parent's counters:
    one UPDATE, which takes the parent's row lock until commit and so serialises every
    child's end with the parent's fan-in gate. Returns the parent's ``type``, ``state`` and
    counters as they now are, or None if the parent row is gone.

    ``UPDATE … RETURNING`` where the database has it; MariaDB reads the row back (under the
    lock the UPDATE took, so nothing can change it in between). A loaded parent instance in
    the session gets the new counters too.
    """
    wf: Any = workflows_table
    values = {"children_ended": wf.c.children_ended + 1}
    if failed:
        values["children_failed"] = wf.c.children_failed + 1
    stmt = update(wf).where(wf.c.id == parent_id).values(values)
    columns = (
        wf.c.type,
        wf.c.state,
        wf.c.children_started,
        wf.c.children_ended,
        wf.c.children_failed,
    )
    if session.get_bind().dialect.update_returning:
        row = session.execute(stmt.returning(*columns)).first()
    elif session.execute(stmt).rowcount:  # type: ignore[attr-defined]
        row = session.execute(select(*columns).where(wf.c.id == parent_id)).first()
    else:
        row = None
    if row is not None:
        # Imported here: `show` reads a family through this module and writes nothing (the
        # engine's ORM bypass is ~20 ms of a command's start-up, issue 42).
        from geneva_drive.storage.queries.bypass import mark_written_if_loaded

        counters = ("children_started", "children_ended", "children_failed")
        mark_written_if_loaded(
            session, workflow_model(), parent_id, {k: getattr(row, k) for k in counters}
        )
    return row

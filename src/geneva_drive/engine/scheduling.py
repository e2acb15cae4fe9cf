"""Creating a workflow's next execution: a step's row, or a resumable step's successor.

Every function here runs inside the caller's transaction and takes the workflow row lock
itself (re-entrant if already held), so it is safe from request handlers, the executor and
housekeeping alike. Wake-ups go to the backend after that transaction commits.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from geneva_drive.core.errors import StepNotDefinedError
from geneva_drive.engine import limits
from geneva_drive.engine.outcomes import ended_columns, for_stray
from geneva_drive.engine.wakeups import enqueue_after_commit, enqueued_step
from geneva_drive.storage import queries
from geneva_drive.storage.models import StepExecution

if TYPE_CHECKING:
    from geneva_drive.definition.steps import StepDefinition
    from geneva_drive.definition.workflow import Workflow


def create_step_execution(
    session: Session,
    workflow: Workflow,
    step_def: StepDefinition,
    now: datetime,
    *,
    wait: timedelta | None = None,
    continues_from: StepExecution | None = None,
    cursor: Any = None,
    signal_id: int | None = None,
) -> StepExecution:
    """Sweep strays, insert a scheduled execution of ``step_def``, wake a worker after commit."""
    queries.lock_workflow(session, workflow.id)
    # With whatever else the caller changed on the workflow: one UPDATE of its row, written
    # first so that the sweep's flush finds nothing left to write for it.
    queries.write_through(session, workflow, {"next_step_name": step_def.name, "updated_at": now})
    queries.sweep_strays(
        session, workflow.id, {**ended_columns(for_stray(), now), "updated_at": now}
    )
    options = workflow.merged_job_options(step_def)
    values = execution_values(
        workflow,
        step_def,
        now=now,
        wait=wait,
        options=options,
        continues_from=continues_from,
        cursor=cursor,
        signal_id=signal_id,
    )
    execution = queries.insert_execution(session, values)
    enqueue_after_commit(session, enqueued_step(workflow, execution, options))
    return execution


def execution_values(
    workflow: Workflow,
    step_def: StepDefinition,
    *,
    now: datetime,
    wait: timedelta | None,
    options: dict[str, Any],
    continues_from: StepExecution | None = None,
    cursor: Any = None,
    signal_id: int | None = None,
    started: dict[str, Any] | None = None,
    keys: dict[str, Any] | object | None = limits.UNKNOWN,
) -> dict[str, Any]:
    """The columns of a new execution of ``step_def``, for ``queries.insert_execution``.

    ``options``: the step's merged job options. ``started``: columns of an execution inserted
    already in progress (the executor's chaining, when nothing can stop the step from
    starting). ``keys``: its limit keys' metadata (``limits.scheduled_keys``), when the
    caller computed it already (a key callable runs once).
    """
    values = {
        "workflow_id": workflow.id,
        "step_name": step_def.name,
        "scheduled_for": now + wait if wait else now,
        "queue": options.get("queue") or "default",
        "priority": options.get("priority") or 0,
        "continues_from_id": continues_from.id if continues_from is not None else None,
        "cursor": cursor,
        "signal_id": signal_id,
        "created_at": now,
        # The workflow's fairness key, computed by create() (queries.fairness).
        "fair_key": workflow.fair_key,
        **(started or {}),
    }
    if keys is limits.UNKNOWN:  # not worked out by the caller already
        keys = limits.scheduled_keys(workflow, step_def)  # None unless the step has limits
    if keys is not None:
        values["metadata_json"] = keys
    return values


def create_successor_execution(
    session: Session,
    workflow: Workflow,
    predecessor: StepExecution,
    now: datetime,
    *,
    wait: timedelta | None = None,
    rewind: bool = False,
) -> StepExecution:
    """Continue a resumable step in a new execution, carrying its cursor and signal pin."""
    step_def = type(workflow).steps.named(predecessor.step_name)
    if step_def is None:
        raise StepNotDefinedError.for_step(workflow, predecessor.step_name, doing="continue")
    return create_step_execution(
        session,
        workflow,
        step_def,
        now,
        wait=wait,
        continues_from=predecessor,
        cursor=None if rewind else predecessor.cursor,
        signal_id=predecessor.signal_id,
    )

"""Operator verbs on a workflow row, outside any step: pause, resume, skip, cancel.

Each runs in the caller's session and transaction, takes the workflow row lock and re-checks
the state under it (another process may have moved the workflow since it was loaded), and
leaves the database unchanged when it refuses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from geneva_drive.core.errors import (
    InvalidStateError,
    StepNotDefinedError,
    WorkflowClassNotLoaded,
)
from geneva_drive.core.settings import settings_of
from geneva_drive.core.states import ExecutionState, WorkflowState
from geneva_drive.engine import (
    children,
    compensation,
    outcomes,
    scheduling,
    signals,
    state_log,
    writer,
)
from geneva_drive.engine.wakeups import enqueue_after_commit, enqueued_step
from geneva_drive.storage import queries
from geneva_drive.storage.models import StepExecution
from geneva_drive.storage.queries import children as children_q

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from geneva_drive.definition.workflow import Workflow


def _locked(workflow: Workflow) -> Session:
    session = workflow.session
    queries.coordination.take_write_lock(session)  # SQLite: before any read
    queries.lock_workflow(session, workflow.id)
    return session


def require_class(workflow: Workflow, verb: str) -> None:
    """Refuse ``verb`` when the row's class is not imported here: it stands as the base
    ``Workflow`` (no steps), and "the next step" would be none — a skip would finish it."""
    if type(workflow).__mapper__.polymorphic_identity != workflow.type:
        raise WorkflowClassNotLoaded.for_verb(workflow, verb)


def _refuse(workflow: Workflow, verb: str, allowed: str) -> InvalidStateError:
    return InvalidStateError(
        f"{type(workflow).__name__} id={workflow.id}: cannot {verb} a {workflow.state} "
        f"workflow; {verb}() needs it to be {allowed}"
    )


def cancel_workflow(workflow: Workflow) -> None:
    """Cancel. On a performing workflow the running step finishes and its result is kept.

    Its ongoing children are canceled with it (``cancel_children``, the writer): their rows
    are locked first, deepest first, then this one's — the order in which a child's end
    locks the child, then its parent — so a child ending meanwhile cannot deadlock with us.
    """
    session = workflow.session
    queries.coordination.take_write_lock(session)  # SQLite: before any read
    if type(workflow).cancel_children:
        _lock_descendants(session, workflow.id)
    _locked(workflow)
    if workflow.state not in (WorkflowState.READY, WorkflowState.PAUSED, WorkflowState.PERFORMING):
        raise _refuse(workflow, "cancel", "ready, performing or paused")
    writer.cancel_now(session, workflow, settings_of(session).clock.now(), by_operator=True)
    session.flush()


def _lock_descendants(session: Session, workflow_id: int) -> None:
    """Lock the ongoing descendants of a workflow, the deepest generation first."""
    generations, ids = [], [workflow_id]
    while ids:
        ids = [c for parent in ids for c in children_q.ongoing_child_ids(session, parent)]
        generations.append(ids)
    for generation in reversed(generations):
        for child_id in generation:
            queries.lock_workflow(session, child_id)


def pause_workflow(workflow: Workflow) -> None:
    """Pause. The scheduled or waiting execution is kept for ``resume()``."""
    session = _locked(workflow)
    if workflow.state not in (WorkflowState.READY, WorkflowState.PERFORMING):
        raise _refuse(workflow, "pause", "ready or performing")
    writer.move(workflow, WorkflowState.PAUSED, settings_of(session).clock.now(), guarded=False)
    state_log.by_operator(session, workflow, WorkflowState.PAUSED)
    session.flush()


def skip_workflow(workflow: Workflow) -> None:
    """Skip the current step of a ready or paused workflow and schedule the next one.

    The execution kept for the step (scheduled, or parked waiting for a signal) ends
    ``skipped``; a paused workflow goes back to ready.
    """
    session = _locked(workflow)
    if workflow.state not in (WorkflowState.READY, WorkflowState.PAUSED):
        raise _refuse(workflow, "skip", "ready or paused (pause a performing one first)")
    require_class(workflow, "skip")
    now = settings_of(session).clock.now()
    current = queries.current_execution(session, workflow.id)
    if current is not None and current.state != ExecutionState.IN_PROGRESS:
        writer.apply(session, workflow, current, outcomes.for_operator_skip(), now, guarded=False)
    else:
        if workflow.state == WorkflowState.PAUSED:
            # Paused after the step ended (a failure): settle the signal it had claimed.
            signals.settle_for_skipped_paused(session, workflow)
        writer.move(workflow, WorkflowState.READY, now, guarded=False)
        at = workflow.current_step_name or workflow.next_step_name
        writer.advance(session, workflow, at, now)
        workflow.current_step_name = None
    session.flush()


def resume_workflow(workflow: Workflow) -> StepExecution | None:
    """Continue a paused workflow; returns the execution that will run (or the parked one)."""
    session = _locked(workflow)
    if workflow.state != WorkflowState.PAUSED:
        raise _refuse(workflow, "resume", "paused")
    current = queries.current_execution(session, workflow.id)
    # Paused while a step was running: it is still running, so the workflow is performing.
    target = (
        WorkflowState.PERFORMING
        if current is not None and current.state == ExecutionState.IN_PROGRESS
        else WorkflowState.READY
    )
    now = settings_of(session).clock.now()
    writer.move(workflow, target, now, guarded=False)
    if compensation.cancel_pending(workflow):
        compensation.set_pending(workflow, False)  # resume withdraws a cancel still waiting
    if current is not None:
        if current.state == ExecutionState.WAITING:
            signals.rendezvous(session, workflow, current)
            children.rendezvous(session, workflow, current)
        elif current.state == ExecutionState.SCHEDULED:
            enqueue_after_commit(session, enqueued_step(workflow, current))
        session.flush()
        return current
    marker = queries.newest_paused_marker(session, workflow.id)
    # Only a marker of the step the workflow stands at: one an operator skipped past is stale.
    if marker is not None and marker.step_name == workflow.next_step_name:
        execution = scheduling.create_successor_execution(session, workflow, marker, now)
        session.flush()
        return execution
    failed_with_cursor = [
        e
        for e in queries.executions_of_step(
            session, workflow.id, workflow.next_step_name or "", state=ExecutionState.FAILED
        )
        if e.cursor is not None
    ]
    if failed_with_cursor and _step_is_resumable(workflow, failed_with_cursor[-1].step_name):
        execution = scheduling.create_successor_execution(
            session, workflow, failed_with_cursor[-1], now
        )
        session.flush()
        return execution
    require_class(workflow, "resume")
    step_def = workflow.steps.named(workflow.next_step_name)
    if step_def is None or step_def.removed:
        known = ", ".join(d.name for d in workflow.steps.runnable() if d.name) or "none"
        raise StepNotDefinedError(
            f"{type(workflow).__name__} id={workflow.id}: cannot resume at step "
            f"{workflow.next_step_name!r}, which is not defined any more; use "
            f"resume_at('<step>') with one of: {known}, or declare "
            f"removed_step({workflow.next_step_name!r}) to skip past it",
            workflow=workflow,
        )
    workflow.current_step_name = None
    execution = scheduling.create_step_execution(session, workflow, step_def, now)
    session.flush()
    return execution


def _step_is_resumable(workflow: Workflow, name: str) -> bool:
    step_def = workflow.steps.named(name)
    return step_def is not None and step_def.resumable

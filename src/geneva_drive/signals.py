"""Signals: events delivered to one workflow, and the steps that wait for them.

Sender and receiver meet at two points, both under the workflow row lock, so the order of
arrival never matters:
- the *gate* (receiver): when a ``wait_for=`` step is about to run, it attaches the oldest
  matching unconsumed signal, or parks in ``waiting``;
- *dispatch* (sender): ``workflow.signal()`` stores the row and, in the same transaction, wakes
  every parked execution whose matcher accepts it.
A signal goes ``pending → claimed → consumed``; it is consumed once every chain attached to it
ended cleanly (success or skip), so a reattempt or a resume sees the same payload again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from . import queries, serialization
from .backends.base import EnqueuedStep, enqueue_after_commit
from .config import settings
from .errors import SignalPayloadTooLargeError, WorkflowNotOngoing
from .models import Signal, StepExecution
from .states import ACTIVE_EXECUTION_STATES, ExecutionState, Outcome, WorkflowState

if TYPE_CHECKING:
    from .steps import StepDefinition
    from .workflow import Workflow


def deliver_signal(
    workflow: Workflow, name: str, *, payload: Any = None, idempotency_key: str | None = None
) -> Signal:
    """Persist a signal and wake matching parked steps, in the caller's transaction."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{type(workflow).__name__} id={workflow.id}: signal() needs a name")
    key = None if idempotency_key is None else str(idempotency_key)
    encoded = None if payload is None else serialization.encode(payload)
    limit = settings().max_signal_payload_size
    if encoded is not None and limit is not None:
        size = serialization.encoded_size(payload)
        if size > limit:
            raise SignalPayloadTooLargeError(
                f"{type(workflow).__name__} id={workflow.id}: payload of signal {name!r} is "
                f"{size} bytes, over max_signal_payload_size={limit}; store large data "
                "elsewhere and send a reference"
            )
    session = workflow.session
    queries.lock_workflow(session, workflow.id)
    if not workflow.ongoing:
        existing = _find(session, workflow.id, name, key) if key is not None else None
        if existing is not None:
            existing.duplicate_delivery = True
            return existing
        raise WorkflowNotOngoing(
            f"{type(workflow).__name__} id={workflow.id}: cannot deliver signal {name!r} to a "
            f"{workflow.state} workflow"
        )
    if key is not None:
        existing = _find(session, workflow.id, name, key)
        if existing is not None:
            existing.duplicate_delivery = True
            return existing
    signal = Signal(workflow_id=workflow.id, name=name, idempotency_key=key, payload_json=encoded)
    try:
        # A savepoint: a concurrent duplicate losing on the unique index keeps the caller's
        # transaction usable, and we return the row that won.
        with session.begin_nested():
            session.add(signal)
            session.flush()
    except IntegrityError:
        existing = _find(session, workflow.id, name, key)
        if existing is None:
            raise
        existing.duplicate_delivery = True
        return existing
    signal.duplicate_delivery = False
    if workflow.state != WorkflowState.PAUSED:
        wake_matching(session, workflow, signal)
    return signal


def _find(session: Session, workflow_id: int, name: str, key: str | None) -> Signal | None:
    stmt = select(Signal).where(
        Signal.workflow_id == workflow_id, Signal.name == name, Signal.idempotency_key == key
    )
    return session.execute(stmt).scalar_one_or_none()


def _adopt(signal: Signal, workflow: Workflow) -> Signal:
    # Matchers see the live workflow instance doing the scan (not a stale copy).
    signal.__dict__["workflow"] = workflow
    return signal


def attachable(session: Session, workflow_id: int) -> Sequence[Signal]:
    stmt = (
        select(Signal)
        .where(Signal.workflow_id == workflow_id, Signal.state != "consumed")
        .order_by(Signal.created_at, Signal.id)
    )
    return session.execute(stmt).scalars().all()


def wake_matching(session: Session, workflow: Workflow, signal: Signal) -> list[StepExecution]:
    """Dispatch: wake each parked execution whose matcher accepts ``signal`` (lock held)."""
    if workflow.state == WorkflowState.PAUSED or not workflow.ongoing:
        return []
    now = settings().clock.now()
    woken: list[StepExecution] = []
    parked = session.execute(
        select(StepExecution)
        .where(
            StepExecution.workflow_id == workflow.id,
            StepExecution.state == ExecutionState.WAITING,
        )
        .order_by(StepExecution.created_at, StepExecution.id)
    ).scalars()
    for execution in parked:
        step_def = type(workflow).steps.named(execution.step_name)
        if step_def is None or not step_def.waits_for_signal:
            continue
        if not step_def.signal_matcher.matches(_adopt(signal, workflow)):
            continue
        claim(signal)
        execution.signal_id = signal.id
        execution.state = ExecutionState.SCHEDULED
        execution.scheduled_for = now  # a lost wake-up is then an overdue row: recoverable
        execution.waiting_since = None
        woken.append(execution)
    session.flush()
    for execution in woken:
        step_def = type(workflow).steps.named(execution.step_name)
        assert step_def is not None
        enqueue_after_commit(
            session,
            EnqueuedStep(
                execution.id,
                workflow.id,
                execution.step_name,
                execution.scheduled_for,
                workflow.merged_job_options(step_def),
            ),
        )
    return woken


def claim(signal: Signal) -> None:
    signal.claimed += 1
    if signal.state == "pending":
        signal.state = "claimed"
        signal.claimed_at = settings().clock.now()


def gate(
    session: Session, workflow: Workflow, execution: StepExecution, step_def: StepDefinition
) -> Signal | None:
    """Receiver side: the attached signal, a newly claimed one, or None after parking."""
    if execution.signal_id is not None:
        pinned = session.get(Signal, execution.signal_id)
        if pinned is not None:
            return pinned
    for candidate in attachable(session, workflow.id):
        if step_def.signal_matcher.matches(_adopt(candidate, workflow)):
            claim(candidate)
            execution.signal_id = candidate.id
            return candidate
    execution.state = ExecutionState.WAITING
    execution.waiting_since = settings().clock.now()
    return None


def rendezvous(session: Session, workflow: Workflow, execution: StepExecution) -> None:
    """On resume(): wake a parked execution if a buffered signal matches it."""
    step_def = type(workflow).steps.named(execution.step_name)
    if step_def is None or not step_def.waits_for_signal:
        return
    for candidate in attachable(session, workflow.id):
        if step_def.signal_matcher.matches(_adopt(candidate, workflow)):
            wake_matching(session, workflow, candidate)
            return


def record_clean_resolution(
    session: Session, execution: StepExecution, resolved_step_names: Sequence[str] = ()
) -> None:
    """One attached chain ended cleanly; consume the signal once every chain has."""
    if execution.signal_id is None:
        return
    signal = session.get(Signal, execution.signal_id)
    if signal is None:
        return
    signal.consumed += 1
    if signal.state == "claimed" and fully_resolved(session, signal, resolved_step_names):
        signal.state = "consumed"
        signal.consumed_at = settings().clock.now()


def fully_resolved(
    session: Session, signal: Signal, resolved_step_names: Sequence[str] = ()
) -> bool:
    session.flush()
    attached = session.execute(
        select(StepExecution)
        .where(StepExecution.signal_id == signal.id)
        .order_by(StepExecution.created_at, StepExecution.id)
    ).scalars()
    newest: dict[str, StepExecution] = {}
    for execution in attached:
        if execution.step_name in resolved_step_names:
            continue
        if execution.state in ACTIVE_EXECUTION_STATES:
            return False
        newest[execution.step_name] = execution
    return all(e.outcome in (Outcome.SUCCESS, Outcome.SKIPPED) for e in newest.values())


def settle_signal_for_skipped(session: Session, execution: StepExecution) -> None:
    """A deliberately skipped execution settles its claimed signal (skips are decisions)."""
    if execution.signal_id is None:
        return
    signal = session.get(Signal, execution.signal_id)
    if signal is not None and signal.state == "claimed":
        record_clean_resolution(session, execution, [execution.step_name])


def settle_for_skipped_paused(session: Session, workflow: Workflow) -> None:
    """Operator skip on a paused workflow: settle the signal of the step being skipped."""
    if workflow.next_step_name is None:
        return
    executions = queries.executions_of_step(session, workflow.id, workflow.next_step_name)
    attached = [e for e in executions if e.signal_id is not None]
    if attached:
        settle_signal_for_skipped(session, attached[-1])

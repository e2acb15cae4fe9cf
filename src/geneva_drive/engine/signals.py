"""Signals: events delivered to one workflow, and the steps that wait for them.

Sender and receiver meet at two points, both under the workflow row lock, so the order of
arrival never matters:

- the *gate* (receiver): when a ``wait_for=`` step is about to run, it attaches the oldest
  matching unconsumed signal, or parks in ``waiting``;
- *dispatch* (sender): ``workflow.signal()`` stores the row and, in the same transaction, wakes
  every parked execution whose matcher accepts it.

A signal goes ``pending → claimed → consumed``; it is consumed once every chain attached to it
ended cleanly (success or skip), so a reattempt or a resume sees the same payload again.

Timeouts (``timeout=``/``on_timeout=``, beyond the gem) are ordinary rows: when an execution
parks, a *timer* — a scheduled execution of the same step whose metadata says
``{"timeout_for": <parked id>}`` — is inserted beside it, due at ``waiting_since + timeout``.
The one-active index admits it because ``waiting`` is not in that index. Whoever takes the
workflow lock first wins: dispatch cancels the timer before it wakes the parked row (so the
index still holds), and a timer that runs first resolves the parked row per ``on_timeout``,
after which a late signal is simply buffered. The stray sweep cancels both rows together.
"""

from __future__ import annotations

from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import inspect as sa_inspect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from geneva_drive.core import events, text
from geneva_drive.core.awaiting import settle
from geneva_drive.core.errors import (
    SerializationError,
    SignalPayloadTooLargeError,
    UnknownSignal,
    WorkflowNotOngoing,
)
from geneva_drive.core.ports import EnqueuedStep
from geneva_drive.core.settings import settings_of
from geneva_drive.core.states import (
    ONGOING_WORKFLOW_STATES,
    ExecutionState,
    WorkflowState,
)
from geneva_drive.definition.matchers import SignalMatcher, unknown_signal
from geneva_drive.engine import outcomes, tracing, writer
from geneva_drive.engine.committed import after_commit
from geneva_drive.engine.wakeups import (
    enqueue_after_commit,
    enqueued_step,
    note_woken,
    wake_in_statement,
)
from geneva_drive.storage import queries, serialization
from geneva_drive.storage.dialects import dialect_of
from geneva_drive.storage.models import TIMEOUT_FOR, Signal, StepExecution
from geneva_drive.storage.queries.bypass import (
    as_inserted,
    connection_of,
    execute_direct,
    lock_workflow_state_with,
    mark_written_if_loaded,
)
from geneva_drive.storage.queries.signals import TIMER_KEY, Delivered, delivery
from geneva_drive.storage.queries.signals import delivered as delivered_row

if TYPE_CHECKING:
    from geneva_drive.definition.steps import StepDefinition
    from geneva_drive.definition.workflow import Workflow

_MAX_STRING = 255  # name and idempotency_key columns


# -- delivery (sender side) ----------------------------------------------------------------


def deliver_signal(
    workflow: Workflow,
    name: str,
    *,
    payload: Any = None,
    idempotency_key: str | None = None,
    allow_unknown: bool = False,
) -> Signal:
    """Persist a signal and wake matching parked steps, in the caller's transaction.

    Everything is checked before anything is written; a name no step of the class waits for
    (``definition.matchers``) is refused before any SQL, unless ``allow_unknown``. A dispatch
    that raises (a matcher raising, say) rolls back this delivery only — it runs in a
    savepoint — so the caller's transaction stays usable and the call can simply be retried.
    """
    signal = _deliver(workflow, name, payload, idempotency_key, allow_unknown)
    if events.active("signal"):  # counted once committed: a rolled-back delivery never was
        counted = {
            "workflow_class": type(workflow).__name__,
            "duplicate": signal.duplicate_delivery,
        }
        after_commit(workflow.session, partial(events.emit, "signal", counted))
    return signal


def _deliver(
    workflow: Workflow,
    name: str,
    payload: Any,
    idempotency_key: str | None,
    allow_unknown: bool,
) -> Signal:
    label = _label(workflow)
    session = workflow.session
    key, encoded = _checked(label, name, payload, idempotency_key, session)
    if not allow_unknown:
        unknown = unknown_signal(type(workflow), label, name)
        if unknown is not None:
            raise UnknownSignal(unknown)
    queries.coordination.take_write_lock(session)  # SQLite: before any read
    traceparent = tracing.current_traceparent(settings_of(session))
    # The one statement writes no trace context: with one to keep, the ORM path delivers.
    fast = _deliver_in_one_statement(workflow, name, key, encoded) if not traceparent else None
    if fast is not None:
        return fast
    # The lock (which also reloads the row) serialises us with the gate, the executor and
    # other senders: whichever commits second sees the other's write.
    queries.lock_workflow(session, workflow.id)
    existing = queries.find_delivery(session, workflow.id, name, key) if key is not None else None
    if existing is not None:
        # An exact redelivery returns the first row, whatever the workflow's state now.
        return _duplicate(existing)
    if not workflow.ongoing:
        label = f"{type(workflow).__name__} id={workflow.id}"
        raise WorkflowNotOngoing(
            f"{label}: cannot deliver signal {name!r} to a {workflow.state} workflow; signals "
            "are only accepted while it is ongoing (start a new workflow for new events)"
        )
    with session.begin_nested():  # a failing dispatch undoes this delivery and nothing else
        signal = Signal(
            workflow_id=workflow.id,
            name=name,
            idempotency_key=key,
            state=writer.PENDING,
            claimed=0,
            consumed=0,
            payload_json=encoded,
            trace_context=traceparent,
        )
        if key is None:
            # No idempotency key, no dedup conflict possible (NULL keys never collide): the
            # savepoint below would only cost two round trips.
            session.add(signal)
            session.flush()
        else:
            try:
                # A savepoint of its own: losing a race on the dedup index must not poison
                # the caller's transaction (PostgreSQL aborts it otherwise). Under the
                # workflow lock the look-up above normally sees a committed winner first;
                # this is the backstop for writers that bypass the lock.
                with session.begin_nested():
                    session.add(signal)
                    session.flush()
            except IntegrityError:
                winner = queries.find_delivery(session, workflow.id, name, key)
                if winner is None:
                    raise
                return _duplicate(winner)
        signal.duplicate_delivery = False
        if workflow.state == WorkflowState.PAUSED:
            workflow.logger.info("paused: signal %r buffered until resume()", name)
        else:
            wake_matching(session, workflow, signal)
    return signal


def _label(workflow: Workflow) -> str:
    """``<Class> id=<id>``, the id from the identity map: reading ``workflow.id`` off an
    expired instance would be a SELECT, and on SQLite no read may come before the write lock
    (the transaction's snapshot would be older than the lock)."""
    identity = sa_inspect(workflow).identity
    workflow_id = identity[0] if identity else workflow.id
    return f"{type(workflow).__name__} id={workflow_id}"


def _checked(
    label: str, name: str, payload: Any, idempotency_key: str | None, session: Session
) -> tuple[str | None, Any]:
    """The idempotency key and encoded payload of a delivery, checked without the database:
    a refusal sends no SQL at all and leaves the caller's transaction as it was."""
    if not isinstance(name, str) or not name.strip() or len(name) > _MAX_STRING:
        raise ValueError(
            f"{label}: signal() needs a signal name, a non-blank str of at most {_MAX_STRING} "
            f"characters; got {name!r}"
        )
    text.check(name, f"{label}: signal() signal name")
    key = None if idempotency_key is None else str(idempotency_key)
    if key is not None and (not key or len(key) > _MAX_STRING):
        raise ValueError(
            f"{label}: signal({name!r}) idempotency_key must be a non-empty string of at most "
            f"{_MAX_STRING} characters, got {idempotency_key!r}; pass None for no deduplication"
        )
    if key is not None:
        text.check(key, f"{label}: signal({name!r}) idempotency_key")
    try:
        encoded = None if payload is None else serialization.encode(payload)
    except SerializationError as error:
        raise type(error)(f"{label}: signal({name!r}) payload: {error}") from None
    limit = settings_of(session).max_signal_payload_size
    if encoded is not None and limit is not None:
        size = serialization.encoded_size(payload)
        if size > limit:
            raise SignalPayloadTooLargeError(
                f"{label}: the payload of signal {name!r} is {size} bytes, over "
                f"max_signal_payload_size={limit}; store large data elsewhere and send a "
                "reference (a row, a URL), or raise the limit with configure()"
            )
    return key, encoded


_RUNNING = (WorkflowState.READY, WorkflowState.PERFORMING)


def _deliver_in_one_statement(
    workflow: Workflow, name: str, key: str | None, encoded: Any
) -> Signal | None:
    """The usual delivery on PostgreSQL: the row lock, then one statement, in one round trip.
    None: nothing was written but perhaps the lock; take the slow path.

    For signals no matcher with a predicate waits for — those run Python on the payload, row
    by row — to a workflow that is ongoing, whose waiting steps are on one queue. The
    statement itself declines (writes nothing) when a key was used before, a timer must be
    disarmed or another execution is active; the slow path then decides as always.
    """
    session = workflow.session
    if not dialect_of(session).combined_writes:
        return None
    waiting = _waiting_for(workflow, name)
    if waiting is None:
        return None
    options = {str(d.name): workflow.merged_job_options(d) for d in waiting}
    queues = {str(o.get("queue") or "default") for o in options.values()}
    if len(queues) > 1:
        return None

    now = settings_of(session).clock.now()
    notify, notified = None, False
    if queues:
        notify, notified = wake_in_statement(session, next(iter(queues)), now)
    # The statement reads the executions as the session would have them: its own pending
    # writes first (what the slow path's first query autoflushes).
    session.flush()
    # The lock serialises us with the gate, the executor and other senders (whichever
    # commits second sees the other's write). A statement of its own, so that the
    # delivery's snapshot is taken after it, but sent with the delivery in one round trip:
    # the delivery, written for a running workflow, checks the state the lock waited for.
    fields = {"workflow_id": workflow.id, "name": name, "key": key, "payload": encoded}
    running = delivery(**fields, steps=list(options), now=now, wake_queue=notify, states=_RUNNING)
    state, row = lock_workflow_state_with(session, workflow, *running)
    if state is None or state not in ONGOING_WORKFLOW_STATES:
        return None  # the slow path says why, or finds the earlier delivery of the key
    paused = state == WorkflowState.PAUSED
    if paused:  # buffered, waking nothing: the statement sent with the lock wrote nothing
        buffered = delivery(**fields, steps=[], now=now, wake_queue=None, states=[state])
        row = execute_direct(connection_of(session), *buffered)
    delivered = delivered_row(row)
    if delivered is None:
        return None
    signal = _inserted_signal(session, workflow, delivered, name, key, encoded, now)
    if paused:
        workflow.logger.info("paused: signal %r buffered until resume()", name)
    if delivered.woken and notify is not None:
        note_woken(session, notify)
    for execution_id, step_name in delivered.woken:
        mark_written_if_loaded(session, StepExecution, execution_id, _woken_columns(signal.id, now))
        workflow.logger.info(
            "signal %r (id=%s) woke step %r (execution %s)",
            name,
            signal.id,
            step_name,
            execution_id,
        )
        step = EnqueuedStep(
            execution_id, workflow.id, step_name, now, options[step_name], notified=notified
        )
        enqueue_after_commit(session, step)
    return signal


def _waiting_for(workflow: Workflow, name: str) -> list[StepDefinition] | None:
    """The steps whose matcher takes a signal ``name`` by its name alone; None if a matcher
    could also want Python to decide (a predicate on the payload, or a matcher object of the
    application's own, whatever ``names`` it gives): the slow path runs those, row by row."""
    waiting = []
    for step_def in type(workflow).steps:
        matcher = step_def.signal_matcher
        if matcher is None:
            continue
        if type(matcher) is not SignalMatcher:
            return None
        if matcher.name == name:
            if matcher.predicate is not None:
                return None
            waiting.append(step_def)
    return waiting


def _woken_columns(signal_id: int, now: datetime) -> dict[str, Any]:
    return {**writer.woken_columns(signal_id, now), "updated_at": now}


def _inserted_signal(
    session: Session,
    workflow: Workflow,
    delivered: Delivered,
    name: str,
    key: str | None,
    encoded: Any,
    now: datetime,
) -> Signal:
    claimed = len(delivered.woken)
    values = {
        "id": delivered.signal_id,
        "workflow_id": workflow.id,
        "name": name,
        "idempotency_key": key,
        "state": writer.CLAIMED if claimed else writer.PENDING,
        "payload_json": encoded,
        "claimed_at": now if claimed else None,
        "consumed_at": None,
        "claimed": claimed,
        "consumed": 0,
        "created_at": now,
        "updated_at": now,
    }
    signal: Signal = as_inserted(session, sa_inspect(Signal), values)
    signal.duplicate_delivery = False
    return signal


def _duplicate(signal: Signal) -> Signal:
    signal.duplicate_delivery = True
    return signal


def _adopt(signal: Signal, workflow: Workflow) -> Signal:
    # Matchers see the live workflow instance doing the scan (not a second, stale copy).
    signal.__dict__["workflow"] = workflow
    return signal


def _matches(
    session: Session, step_def: StepDefinition, signal: Signal, workflow: Workflow
) -> bool:
    # References in the payload load in the scanning session (see serialization).
    with serialization.decoding_session(session):
        return bool(settle(step_def.signal_matcher.matches(_adopt(signal, workflow))))


def wake_matching(session: Session, workflow: Workflow, signal: Signal) -> list[StepExecution]:
    """Dispatch: wake each parked execution whose matcher accepts ``signal`` (lock held)."""
    if workflow.state == WorkflowState.PAUSED or not workflow.ongoing:
        return []
    now = settings_of(session).clock.now()
    parked = queries.parked_executions(session, workflow.id)
    woken: list[tuple[StepExecution, StepDefinition]] = []
    for execution in parked:
        step_def = type(workflow).steps.named(execution.step_name)
        # A step whose definition is gone can never match: the matcher lives on it.
        if step_def is None or not step_def.waits_for_signal:
            continue
        if not _matches(session, step_def, signal, workflow):
            continue
        # The timer leaves the one-active index before the parked row enters it.
        writer.cancel_timeout(session, execution, now)
        writer.claim_signal(signal, now)
        writer.wake(execution, signal.id, now)
        session.flush()
        woken.append((execution, step_def))
    for execution, step_def in woken:
        workflow.logger.info(
            "signal %r (id=%s) woke step %r (execution %s)",
            signal.name,
            signal.id,
            execution.step_name,
            execution.id,
        )
        _enqueue(session, workflow, execution, step_def)
    return [execution for execution, _ in woken]


# -- lifecycle -------------------------------------------------------------------------------


def settle_for_skipped_paused(session: Session, workflow: Workflow) -> None:
    """Operator skip on a paused workflow: settle the signal of the step being skipped."""
    if workflow.next_step_name is None:
        return
    executions = queries.executions_of_step(session, workflow.id, workflow.next_step_name)
    attached = [e for e in executions if e.signal_id is not None]
    if attached:
        writer.settle_signal_for_skipped(session, attached[-1])


# -- the gate (receiver side) ----------------------------------------------------------------


def gate(
    session: Session, workflow: Workflow, execution: StepExecution, step_def: StepDefinition
) -> Signal | None:
    """Receiver side: the attached signal, a newly claimed one, or None after parking."""
    now = settings_of(session).clock.now()
    if execution.signal_id is not None:
        # Woken by dispatch, or a resumable successor carrying its predecessor's pin.
        pinned = session.get(Signal, execution.signal_id, populate_existing=True)
        if pinned is not None:
            return pinned
    for candidate in queries.unconsumed_signals(session, workflow.id):
        if _matches(session, step_def, candidate, workflow):
            writer.claim_signal(candidate, now)
            execution.signal_id = candidate.id
            return candidate
    deadline = now + step_def.timeout if step_def.timeout is not None else None
    writer.park(execution, now, awaiting=step_def.awaiting, deadline=deadline)
    if step_def.timeout is not None:
        _arm_timeout(session, workflow, execution, step_def, now)
    workflow.logger.info(
        "step %r parked waiting for %r (execution %s)",
        execution.step_name,
        step_def.signal_matcher,
        execution.id,
    )
    return None


def rendezvous(session: Session, workflow: Workflow, execution: StepExecution) -> None:
    """On resume(): wake a parked execution if a buffered signal matches it."""
    step_def = type(workflow).steps.named(execution.step_name)
    if step_def is None or not step_def.waits_for_signal:
        return
    for candidate in queries.unconsumed_signals(session, workflow.id):
        if _matches(session, step_def, candidate, workflow):
            wake_matching(session, workflow, candidate)
            return
    # Still parked. A timer that came due while the workflow was paused was left alone by
    # the executor; hand it to the backend again so it fires now (or when due).
    timer = writer.armed_timer_of(session, execution)
    if timer is not None:
        _enqueue(session, workflow, timer, step_def)


# -- timeouts --------------------------------------------------------------------------------


def _arm_timeout(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition,
    now: datetime,
) -> None:
    assert step_def.timeout is not None
    arm_timer(session, workflow, execution, step_def, now + step_def.timeout, step_def.on_timeout)


def arm_timer(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition,
    due: datetime,
    on_timeout: str | None = None,
) -> StepExecution:
    """Insert the timer of the parked ``execution``, due at ``due`` (see the module's
    docstring; ``children`` arms one for ``children_timeout`` too)."""
    # The parked row must leave the one-active index before the timer enters it.
    session.flush()
    options = workflow.merged_job_options(step_def)
    metadata: dict[str, Any] = {TIMEOUT_FOR: execution.id}
    if on_timeout is not None:
        metadata["on_timeout"] = on_timeout
    timer = StepExecution(
        workflow_id=workflow.id,
        step_name=execution.step_name,
        state=ExecutionState.SCHEDULED,
        scheduled_for=due,
        queue=options.get("queue") or "default",
        priority=options.get("priority") or 0,
        metadata_json=metadata,
        attempt=0,  # a timer is not a run of its step: the count of runs leaves it out
    )
    session.add(timer)
    session.flush()
    execution.write_metadata(TIMER_KEY, timer.id)
    _enqueue(session, workflow, timer, step_def)
    return timer


def _enqueue(
    session: Session, workflow: Workflow, execution: StepExecution, step_def: StepDefinition
) -> None:
    options = workflow.merged_job_options(step_def)
    enqueue_after_commit(session, enqueued_step(workflow, execution, options))


def fire_timeout(session: Session, workflow: Workflow, timer: StepExecution, now: datetime) -> None:
    """A timer came due before any matching signal: resolve its parked row per on_timeout.

    Runs in the executor's phase 1 under the workflow lock, with ``timer`` still scheduled
    and the workflow ready. If the parked row is no longer waiting (woken, swept, skipped),
    the timer is stale and is disarmed. Otherwise both rows end ``timed_out``: the timer
    (which did its job) and the parked row, whose body never ran.
    """
    parked_id = timer.read_metadata(TIMEOUT_FOR)
    parked = queries.lock_execution(session, int(parked_id))
    if parked is None or parked.state != ExecutionState.WAITING:
        writer.end(timer, outcomes.for_disarmed_timer(), now)
        return
    step_def = type(workflow).steps.named(parked.step_name)
    action = timer.read_metadata("on_timeout") or "skip"
    if step_def is not None and step_def.on_timeout is not None:
        action = step_def.on_timeout  # the deployed code decides, if it still says
    # The timer leaves the one-active index before anything is scheduled.
    writer.end(timer, outcomes.for_fired_timer(), now)
    waited = now - parked.waiting_since if parked.waiting_since is not None else None
    parked.write_metadata(
        "timed_out",
        {
            "after_seconds": waited.total_seconds() if waited is not None else None,
            "on_timeout": action,
            "timer_execution_id": timer.id,
        },
    )
    session.flush()
    # Logged by the writer (engine.state_log), with what follows.
    writer.apply(session, workflow, parked, outcomes.for_timed_out_wait(action), now)
    if events.active("timeout"):  # counted once committed, as the writer's log line is
        counted = {
            "workflow_class": type(workflow).__name__,
            "step_name": parked.step_name,
            "on_timeout": action,
        }
        after_commit(session, partial(events.emit, "timeout", counted))

"""Running one step execution, in three phases.

Phase 1 (prepare) — one short transaction holding the workflow row lock: guards in a fixed
order, preconditions, the signal gate, then ``scheduled → in_progress`` and commit.
Phase 2 (perform) — the step body runs with no lock held, in the same ``Session`` that phase 3
commits: the body's writes are part of the step's unit of work.
Phase 3 (finalize) — re-lock the workflow row *in the body's transaction*, record the outcome,
create the next execution and commit — one commit for the body's writes, the outcome and the
next step together. A failed body is rolled back first, so its writes never land.

Two commits per plain step in total. Everything here is safe to run twice for one execution:
the second run finds the row no longer ``scheduled`` and does nothing.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session

from . import events, queries, scheduling, serialization, signals
from .backends.base import EnqueuedStep, enqueue_after_commit
from .config import Settings, settings
from .errors import StepNotDefinedError
from .flow import Action, FlowControl
from .models import StepExecution
from .policy import Decision, resolve
from .states import (
    ExecutionState,
    Outcome,
    WorkflowState,
    check_step_transition,
    check_workflow_transition,
)

if TYPE_CHECKING:
    from .models import Signal
    from .steps import StepDefinition
    from .workflow import Workflow


# -- results of phase 2 ----------------------------------------------------------------------


@dataclass(frozen=True)
class Completed:
    pass


@dataclass(frozen=True)
class Interrupted:
    """A resumable step stopped at a checkpoint; a successor continues from the cursor."""

    wait: timedelta | None = None


@dataclass(frozen=True)
class Failed:
    error: BaseException


Result = Completed | Interrupted | FlowControl | Failed


@dataclass
class Prepared:
    workflow: Workflow
    execution: StepExecution
    step_def: StepDefinition
    signal: Signal | None


@dataclass
class RunOptions:
    interruptible: bool = True
    max_iterations: int | None = None
    should_exit: Callable[[], bool] | None = None
    worker_id: str | None = None
    lease: timedelta | None = None
    # Chaining (the database worker): given the queue of a next step that is due now, True
    # means "start it in the transaction that completes this one and run it here next".
    chain: Callable[[str], bool] | None = None
    on_chained: Callable[[], None] | None = None
    # Told the id of every step this run starts (the first and each chained one), in the
    # running thread: what a heartbeat renews (leases.RunningExecutions.started).
    on_started: Callable[[int], None] | None = None


@dataclass(frozen=True)
class Aborted:
    """Phase 1 ended the run (a guard or precondition); ``error`` is raised after commit."""

    error: BaseException | None = None


def run_execution(
    execution_id: int,
    *,
    reraise: bool = True,
    options: RunOptions | None = None,
    config: Settings | None = None,
) -> StepExecution | None:
    """Run one execution by id. Returns it (detached) or None when there was nothing to run.

    With ``reraise`` the step's own exception is raised after its outcome has been committed,
    so a job framework sees the failure; the database is already consistent by then.
    """
    config = config or settings()
    options = options or RunOptions()
    with config.session_factory()() as session:
        _, outcome = _phase1(session, options, config, execution_id=execution_id)
        return _continue(session, outcome, options, config, reraise=reraise)


def claim_and_run(
    queues: list[str] | None,
    options: RunOptions,
    config: Settings | None = None,
    *,
    execution_id: int | None = None,
) -> bool:
    """Claim the next due execution (or, eagerly, the given one) and run it. False if none.

    The claim and phase 1 share one transaction (one commit): the claim query locks the
    workflow row with SKIP LOCKED, and phase 1 runs under that lock.
    """
    config = config or settings()
    with config.session_factory()() as session:
        claimed, outcome = _phase1(session, options, config, queues=queues, claim_id=execution_id)
        if claimed:
            _continue(session, outcome, options, config, reraise=False)
        return claimed


def _continue(
    session: Session,
    outcome: Prepared | Aborted | None,
    options: RunOptions,
    config: Settings,
    *,
    reraise: bool,
) -> StepExecution | None:
    if isinstance(outcome, Aborted):
        if outcome.error is not None and reraise:
            raise outcome.error
        return None
    if outcome is None:
        return None
    prepared = outcome
    while True:
        if options.on_started is not None:
            options.on_started(prepared.execution.id)
        result = _perform(session, prepared, options, config)
        error, chained = _finalize(session, prepared, result, config, options)
        if error is not None and reraise:
            raise error
        if chained is None:
            return prepared.execution
        if options.on_chained is not None:
            options.on_chained()
        prepared = chained


# -- phase 1 ---------------------------------------------------------------------------------


def _phase1(
    session: Session,
    options: RunOptions,
    config: Settings,
    *,
    execution_id: int | None = None,
    queues: list[str] | None = None,
    claim_id: int | None = None,
) -> tuple[bool, Prepared | Aborted | None]:
    """Returns (whether an execution was found/claimed, what phase 1 decided). Commits."""
    try:
        with session.begin():
            if execution_id is None:
                now = config.clock.now()
                claimed = (
                    queries.claim_due_execution(session, now, queues)
                    if claim_id is None
                    else queries.claim_execution(session, claim_id, now, queues)
                )
                if claimed is None:
                    return False, None
                execution_id, workflow_id = claimed
                return True, _prepare(session, execution_id, options, config, workflow_id)
            return True, _prepare(session, execution_id, options, config)
    except Exception as error:
        if queries.is_transient(error):
            # A deadlock or lock timeout rolled phase 1 back: the row is still scheduled and
            # will be claimed again. It is the database's trouble, not the step's.
            raise
        if execution_id is None:
            raise  # the claim itself failed: there is no execution to record anything on
        # Unexpected trouble before the body (the transaction above rolled back): record it
        # on the execution in a fresh transaction, let the policies decide, then re-raise.
        with session.begin():
            _record_prepare_failure(session, execution_id, error, config)
        return True, Aborted(error)


def _prepare(
    session: Session,
    execution_id: int,
    options: RunOptions,
    config: Settings,
    workflow_id: int | None = None,
) -> Prepared | Aborted | None:
    if workflow_id is None:  # not claimed: find the workflow to lock first
        found = queries.get_execution(session, execution_id)
        if found is None:
            config.logger.warning("step execution %s not found; nothing to run", execution_id)
            return None
        workflow_id = found.workflow_id
    workflow = queries.lock_workflow(session, workflow_id)
    execution = queries.lock_execution(session, execution_id)
    if workflow is None or execution is None:
        return None
    log = events.execution_logger(workflow, execution)
    now = config.clock.now()

    # 1. Idempotency: anything but "scheduled" means another run got here first.
    if execution.state != ExecutionState.SCHEDULED:
        log.info("already %s, skipping duplicate run", execution.state)
        return None
    # 2. Workflow state. A paused workflow keeps its scheduled row for resume() (the gem
    #    destroyed it); a finished or canceled one can never run it.
    if workflow.state == WorkflowState.PAUSED:
        log.info("workflow is paused; execution kept for resume()")
        return None
    if workflow.state not in (WorkflowState.READY, WorkflowState.PERFORMING):
        _end(execution, ExecutionState.CANCELED, Outcome.CANCELED, now)
        return None
    # A signal timeout's timer row resolves its parked execution; it has no body to run.
    if signals.is_timer(execution):
        signals.fire_timeout(session, workflow, execution, now)
        return None
    return _guards_and_start(session, workflow, execution, options, config, now)


def _guards_and_start(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    options: RunOptions,
    config: Settings,
    now: datetime,
) -> Prepared | Aborted | None:
    log = events.execution_logger(workflow, execution)
    cls = type(workflow)
    # 3. The hero must still exist (unless the class opted out).
    if not cls.may_proceed_without_hero and workflow.hero is None:
        log.info("hero is gone; canceling the workflow")
        _end(execution, ExecutionState.CANCELED, Outcome.CANCELED, now)
        scheduling.transition(workflow, WorkflowState.CANCELED)
        return None
    # 4. The step must still be defined.
    step_def = cls.steps.named(execution.step_name)
    if step_def is None:
        message = f"Step {execution.step_name!r} is not defined in {cls.__name__}"
        execution.error_message = message
        _end(execution, ExecutionState.FAILED, Outcome.FAILED, now)
        scheduling.transition(workflow, WorkflowState.PAUSED)
        return Aborted(StepNotDefinedError(message, step_execution=execution, workflow=workflow))
    if step_def.removed:
        log.info("step was removed from the code; skipping past it")
        _end(execution, ExecutionState.SKIPPED, Outcome.SKIPPED, now)
        signals.settle_signal_for_skipped(session, execution)
        scheduling.transition(workflow, WorkflowState.READY)
        scheduling.schedule_next_step(session, workflow)
        return None
    # 7. Preconditions.
    payload = events.execution_payload(workflow, execution)
    with events.instrument("precondition", payload):
        try:
            if cancel_conditions_hold(workflow):
                payload["outcome"] = "canceled"
                _end(execution, ExecutionState.CANCELED, Outcome.CANCELED, now)
                scheduling.transition(workflow, WorkflowState.CANCELED)
                return None
            if step_def.should_skip(workflow):
                payload["outcome"] = "skipped"
                _end(execution, ExecutionState.SKIPPED, Outcome.SKIPPED, now)
                signals.settle_signal_for_skipped(session, execution)
                scheduling.transition(workflow, WorkflowState.READY)
                workflow.next_step_name = execution.step_name
                scheduling.schedule_next_step(session, workflow)
                return None
        except Exception as error:
            payload["outcome"] = "exception"
            payload["exception"] = error
            _handle_failure(
                session, workflow, execution, step_def, error, config, reason="precondition"
            )
            return Aborted(error)
        payload["outcome"] = "passed"
    # 8. The signal gate: proceed with an attached signal, or park.
    signal = None
    if step_def.waits_for_signal:
        signal = signals.gate(session, workflow, execution, step_def)
        if signal is None:
            return None
    # 9. Start: the execution's and the workflow's UPDATE under the locks phase 1 holds.
    check_step_transition(execution.state, ExecutionState.IN_PROGRESS)
    check_workflow_transition(workflow.state, WorkflowState.PERFORMING)
    performing: dict[str, Any] = {
        "state": WorkflowState.PERFORMING,
        "current_step_name": step_def.name,
        "updated_at": now,
    }
    if workflow.started_at is None:
        performing["started_at"] = now
    started = {**_started_columns(now, options), "updated_at": now}
    queries.start_both(session, execution, started, workflow, performing)
    return Prepared(workflow, execution, step_def, signal)


def _record_prepare_failure(
    session: Session, execution_id: int, error: BaseException, config: Settings
) -> None:
    execution = queries.get_execution(session, execution_id)
    if execution is None:
        return
    workflow = queries.lock_workflow(session, execution.workflow_id)
    execution = queries.lock_execution(session, execution_id)
    if workflow is None or execution is None or execution.state != ExecutionState.SCHEDULED:
        return
    now = config.clock.now()
    _store_error(execution, error)
    _end(execution, ExecutionState.FAILED, Outcome.FAILED, now)
    step_def = type(workflow).steps.named(execution.step_name)
    decision = _decide(session, workflow, execution, step_def, error, config)
    if decision.action is Action.REATTEMPT:
        scheduling.transition(workflow, WorkflowState.READY)
        _reschedule(session, workflow, execution, step_def, decision.wait)
    elif decision.action is Action.CANCEL:
        scheduling.transition(workflow, WorkflowState.CANCELED)
    elif decision.action is Action.SKIP:
        scheduling.transition(workflow, WorkflowState.READY)
        workflow.next_step_name = execution.step_name
        scheduling.schedule_next_step(session, workflow)
    else:
        scheduling.transition(workflow, WorkflowState.PAUSED)


def cancel_conditions_hold(workflow: Workflow) -> bool:
    return any(bool(condition(workflow)) for condition in type(workflow)._cancel_conditions)


# -- phase 2 ---------------------------------------------------------------------------------


def _perform(session: Session, prepared: Prepared, options: RunOptions, config: Settings) -> Result:
    workflow, execution, step_def = prepared.workflow, prepared.execution, prepared.step_def
    payload = events.execution_payload(workflow, execution)
    workflow.__dict__["_gd_received_signal"] = prepared.signal
    hero = workflow.__dict__.get("_gd_hero")
    if hero is not None:
        if sa_inspect(hero).persistent:
            # Loaded by phase 1's hero guard in an earlier transaction: let the body read it
            # fresh in its own, so `hero.counter += 1` does not write back a stale value.
            session.expire(hero)
        else:  # deleted by a step chained before this one: look it up again if asked
            workflow.__dict__.pop("_gd_hero", None)

    def body() -> Result:
        with events.instrument("step", payload):
            try:
                if step_def.resumable:
                    from .iteration import run_resumable

                    outcome: Result = run_resumable(
                        session, workflow, execution, step_def, options, config
                    )
                else:
                    step_def.run(workflow)
                    outcome = Completed()
            except FlowControl as flow:
                outcome = flow
            except Exception as error:
                outcome = Failed(error)
            payload["outcome"] = _describe(outcome)
            if isinstance(outcome, Failed):
                payload["exception"] = outcome.error
            return outcome

    try:
        # Payload references (mapped instances) load in the step's own session.
        with workflow._in_step_context(), serialization.decoding_session(session):
            # Hook errors count as step errors (the gem let them escape and strand the row).
            try:
                workflow.before_step_execution(execution)
                returned = workflow.around_step_execution(execution, body)
                result: Result = (
                    returned
                    if isinstance(returned, Completed | Interrupted | FlowControl | Failed)
                    else Completed()  # an around hook that returned something else
                )
                workflow.after_step_execution(execution)
            except FlowControl as flow:
                result = flow
            except Exception as error:
                result = Failed(error)
    finally:
        workflow.__dict__.pop("_gd_received_signal", None)
    if isinstance(result, Failed):
        events.execution_logger(workflow, execution).warning(
            "step raised %s: %s", type(result.error).__name__, result.error
        )
    return result


def _describe(result: Result) -> str:
    if isinstance(result, Completed):
        return "completed"
    if isinstance(result, Interrupted):
        return "interrupted"
    if isinstance(result, Failed):
        return "exception"
    return "finished" if result.action is Action.FINISH else str(result.action)


# -- phase 3 ---------------------------------------------------------------------------------


def _finalize(
    session: Session, prepared: Prepared, result: Result, config: Settings, options: RunOptions
) -> tuple[BaseException | None, Prepared | None]:
    """Record the outcome and schedule what comes next.

    Returns the step's error, if any, and the next step when it was started in the same
    transaction (chaining, see :func:`_complete`).
    """
    workflow_id, execution_id = prepared.workflow.id, prepared.execution.id
    payload = events.execution_payload(prepared.workflow, prepared.execution)
    if not isinstance(result, Failed):
        result = _save_body_writes(session, prepared, result, config)
    if isinstance(result, Failed):
        session.rollback()  # the body's writes must not land with a failure
    with events.instrument("finalize", payload):
        try:
            if isinstance(result, Completed):
                completed, chained = _complete(session, prepared, config, payload, options)
                if completed:
                    return None, chained
            # Re-lock in the body's own transaction: its writes commit with the outcome.
            workflow = queries.lock_workflow(session, workflow_id)
            execution = queries.lock_execution(session, execution_id)
            assert workflow is not None and execution is not None
            if execution.state != ExecutionState.IN_PROGRESS:
                # Someone took the row from us (lease recovery): our run is the duplicate.
                events.execution_logger(workflow, execution).warning(
                    "execution is %s, not in_progress; discarding this run's work",
                    execution.state,
                )
                session.rollback()
                return None, None
            if workflow.next_step_name == execution.step_name:
                # Navigation reads next_step_name alike; clearing this first lets the workflow
                # row be written once, together with the rest of the outcome.
                workflow.current_step_name = None
            error = _apply(session, workflow, execution, prepared.step_def, result, config)
            workflow.current_step_name = None
            execution.lease_owner = None
            execution.lease_expires_at = None
            payload["workflow_state"] = workflow.state
            payload["step_state"] = execution.state
            session.commit()
        except BaseException as error:
            session.rollback()
            if isinstance(error, Exception) and queries.is_transient(error):
                # The outcome and the body's writes were rolled back together. Hand the
                # execution back now rather than leave it in progress under our live lease
                # (the heartbeat would keep it from ever being recovered).
                _release_after_transient_error(session, execution_id, error, config)
            raise
    prepared.workflow, prepared.execution = workflow, execution
    return error, None


def _save_body_writes(
    session: Session, prepared: Prepared, result: Result, config: Settings
) -> Result:
    """Flush what the body wrote; writes the database refuses make the step a failure.

    A constraint the body's rows violate surfaces only when they are flushed. Left to the
    commit, it would roll back the outcome too and leave the execution in progress under a
    live lease; here it becomes the step's error, for the exception policies to decide like
    any other. A transient error (deadlock, lock timeout) is the database's trouble: the
    execution is handed back and runs again.
    """
    try:
        session.flush()
    except Exception as error:
        session.rollback()
        if queries.is_transient(error):
            _release_after_transient_error(session, prepared.execution.id, error, config)
            raise
        events.execution_logger(prepared.workflow, prepared.execution).warning(
            "the step's writes could not be saved: %s: %s", type(error).__name__, error
        )
        return Failed(error)
    return result


def _complete(
    session: Session,
    prepared: Prepared,
    config: Settings,
    payload: dict[str, Any],
    options: RunOptions,
) -> tuple[bool, Prepared | None]:
    """Phase 3 of a completed step, when nobody touched the workflow since phase 1 (fast path).

    Returns (False, None) having written nothing when the workflow changed meanwhile — an
    operator paused, canceled or redirected it, or the body modified it: the general path
    then takes over. Otherwise (True, the next step if it was started here).

    The first statement locks the workflow row *and* checks it is as phase 1 left it, by
    writing the new navigation only on that condition; the completion then checks the
    execution is still ours. No reload of either, and no stray sweep: nothing can be left to
    sweep, as the one-active index allows no other scheduled row while ours was in progress,
    and a parked row only ever exists as a workflow's one active execution (every other way
    of creating an execution sweeps first).

    Chaining: when the next step is due now and ``options.chain`` accepts its queue, its
    phase 1 runs right here, under the lock this transaction holds, and one commit records
    this step's outcome and the next one's start; the caller runs it without a claim. When
    nothing can keep it from starting (no hero to check, no cancel_if, skip_if or signal
    gate), it is inserted in progress at once.
    """
    workflow, execution = prepared.workflow, prepared.execution
    if session.is_modified(workflow, include_collections=False):
        return False, None
    now = config.clock.now()
    following = type(workflow).steps.next_after(workflow.current_step_name)
    chain = direct = False
    navigation: dict[str, Any]
    if following is None:
        navigation = {
            "state": WorkflowState.FINISHED,
            "transitioned_at": now,
            "current_step_name": None,
            "next_step_name": None,
        }
    else:
        job_options = workflow.merged_job_options(following)
        queue = str(job_options.get("queue") or "default")
        chain = options.chain is not None and not following.wait_delta and options.chain(queue)
        direct = chain and _nothing_to_check(workflow, following)
        navigation = {
            "state": WorkflowState.PERFORMING if direct else WorkflowState.READY,
            "current_step_name": following.name if direct else None,
            "next_step_name": following.name,
        }
    as_started = {
        "state": workflow.state,
        "current_step_name": workflow.current_step_name,
        "next_step_name": workflow.next_step_name,
        "transitioned_at": workflow.transitioned_at,
    }
    navigation["updated_at"] = now
    check_step_transition(execution.state, ExecutionState.COMPLETED)
    done = {
        "state": ExecutionState.COMPLETED,
        "outcome": Outcome.SUCCESS,
        "completed_at": now,
        "finished_at": now,
        "lease_owner": None,
        "lease_expires_at": None,
        "updated_at": now,
    }
    created: StepExecution | None = None
    new_row = None
    if following is not None:
        new_row = scheduling.execution_values(
            workflow,
            following,
            now=now,
            wait=following.wait_delta,
            started=_started_columns(now, options) if direct else None,
            options=job_options,
        )
    if _one_statement(session, execution, following is None or direct):
        wrote_workflow, wrote_execution, created = queries.complete_in_one_statement(
            session, workflow, navigation, as_started, execution, done, new_row
        )
    else:
        wrote_workflow = queries.write_through(session, workflow, navigation, expect=as_started)
        wrote_execution = wrote_workflow and queries.write_through(
            session, execution, done, expect={"state": ExecutionState.IN_PROGRESS}
        )
    if not wrote_workflow:
        return False, None
    queries.remember_workflow_lock(session, workflow.id, workflow)
    if not wrote_execution:
        # Someone took the row from us (lease recovery): our run is the duplicate.
        events.execution_logger(workflow, execution).warning(
            "execution is no longer in_progress; discarding this run's work"
        )
        session.rollback()
        return True, None
    signals.record_clean_resolution(session, execution)
    chained: Prepared | Aborted | None = None
    if following is not None and new_row is not None:
        if created is None:
            created = queries.insert_execution(session, new_row)
        if direct:
            chained = _started_directly(workflow, created, following)
        elif chain:
            chained = _start_chained(session, workflow, created, following, options, config)
        else:
            wake = EnqueuedStep.for_execution(workflow, created, job_options)
            enqueue_after_commit(session, wake)
    payload["workflow_state"] = workflow.state
    payload["step_state"] = execution.state
    session.commit()
    return True, chained if isinstance(chained, Prepared) else None


def _one_statement(session: Session, execution: StepExecution, inserts_started: bool) -> bool:
    """Whether phase 3's writes can go as one statement (``queries.complete_in_one_statement``).

    PostgreSQL only (data-modifying CTEs), for a finished workflow or a next step inserted
    already started, an execution that settles no signal, and nothing pending on it.
    """
    return (
        inserts_started
        and execution.signal_id is None
        and session.get_bind().dialect.name == "postgresql"
        and not session.is_modified(execution, include_collections=False)
    )


def _nothing_to_check(workflow: Workflow, step_def: StepDefinition) -> bool:
    """Whether phase 1 of ``step_def`` is certain to start it: no guard could decide otherwise."""
    return type(workflow).may_proceed_without_hero and _no_preconditions(workflow, step_def)


def _no_preconditions(workflow: Workflow, step_def: StepDefinition) -> bool:
    """No cancel_if, skip_if or signal gate: nothing of the application's runs in phase 1."""
    return (
        not type(workflow)._cancel_conditions
        and step_def.skip_if is None
        and not step_def.waits_for_signal
    )


def _started_columns(now: datetime, options: RunOptions) -> dict[str, Any]:
    """An execution's columns as phase 1 leaves them when it starts the step."""
    columns: dict[str, Any] = {"state": ExecutionState.IN_PROGRESS, "started_at": now}
    # Written even without a lease: on a scheduled row the Celery dispatcher keeps its resend
    # time in lease_expires_at, which must not survive as the lease of a run that holds none.
    columns["lease_owner"] = options.worker_id
    columns["lease_expires_at"] = (
        None if options.worker_id is None else now + (options.lease or timedelta(seconds=30))
    )
    return columns


def _started_directly(
    workflow: Workflow, execution: StepExecution, step_def: StepDefinition
) -> Prepared:
    # Phase 1's event for a step whose preconditions had nothing to say.
    payload = events.execution_payload(workflow, execution)
    with events.instrument("precondition", payload):
        payload["outcome"] = "passed"
    return Prepared(workflow, execution, step_def, None)


def _start_chained(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition,
    options: RunOptions,
    config: Settings,
) -> Prepared | Aborted | None:
    """Phase 1 of the next step inside the transaction that completed its predecessor.

    Should anything fail unexpectedly here, only the next step's start is undone: the
    predecessor's outcome and its body's writes still commit, and the next step is left
    scheduled for an ordinary claim, whose phase 1 records the failure as it always does.
    The hero is read before anything is written for the next step; guards that run
    application code or a signal gate run in a savepoint.
    """
    now = config.clock.now()
    cls = type(workflow)
    # The guards read the hero and may query: let them find the rows as a claim's phase 1
    # would, with the predecessor's writes in place.
    session.flush()
    # Not the hero the predecessor saw (it may have deleted it), but the row as it is now.
    workflow.__dict__.pop("_gd_hero", None)
    if not cls.may_proceed_without_hero:
        try:
            workflow.hero  # noqa: B018 — loads and caches it for the guard
        except Exception as error:
            _leave_scheduled(session, workflow, execution, step_def, error)
            return None
    if _no_preconditions(workflow, step_def):
        return _guards_and_start(session, workflow, execution, options, config, now)
    try:
        with session.begin_nested():
            return _guards_and_start(session, workflow, execution, options, config, now)
    except Exception as error:
        # Instances may hold values the savepoint's rollback took back from the rows.
        session.expire(workflow)
        session.expire(execution)
        _leave_scheduled(session, workflow, execution, step_def, error)
        return None


def _leave_scheduled(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition,
    error: Exception,
) -> None:
    if queries.is_transient(error):
        raise error  # the whole transaction is lost: _finalize hands the predecessor back
    events.execution_logger(workflow, execution).warning(
        "could not start step %r right after its predecessor (%s: %s); "
        "leaving it scheduled for a worker to claim",
        step_def.name,
        type(error).__name__,
        error,
    )
    enqueue_after_commit(session, EnqueuedStep.for_execution(workflow, execution))


def _release_after_transient_error(
    session: Session, execution_id: int, error: Exception, config: Settings
) -> None:
    from .housekeeping import recover_execution

    try:
        with session.begin():
            recover_execution(session, execution_id, reason=f"transient database error: {error}")
    except Exception:
        config.logger.exception(
            "could not hand back execution %s after a database error; its lease will expire "
            "only when this worker stops",
            execution_id,
        )


def _apply(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition,
    result: Result,
    config: Settings,
) -> BaseException | None:
    now = config.clock.now()
    external = workflow.state  # paused or canceled by an operator while the step ran
    if external == WorkflowState.CANCELED:
        # The step's result is kept, but nothing follows a canceled workflow.
        _record_only(execution, step_def, result, now)
        return result.error if isinstance(result, Failed) else None
    if external == WorkflowState.PAUSED and isinstance(result, Interrupted):
        _end(execution, ExecutionState.COMPLETED, Outcome.WORKFLOW_PAUSED, now)
        return None
    paused_at = workflow.transitioned_at
    if external == WorkflowState.PAUSED:
        workflow.state = WorkflowState.PERFORMING  # decide as if running; the pause is restored
    if isinstance(result, Failed):
        _handle_failure(session, workflow, execution, step_def, result.error, config)
        error: BaseException | None = result.error
    else:
        _handle_success_or_flow(session, workflow, execution, step_def, result, now)
        error = None
    if external == WorkflowState.PAUSED and workflow.state == WorkflowState.READY:
        # Paused from outside mid-step: keep the pause; the next execution waits for resume().
        workflow.state = WorkflowState.PAUSED
        workflow.transitioned_at = paused_at
    return error


def _record_only(
    execution: StepExecution, step_def: StepDefinition, result: Result, now: datetime
) -> None:
    if isinstance(result, Failed):
        _store_error(execution, result.error)
        _end(execution, ExecutionState.FAILED, Outcome.CANCELED, now)
    elif isinstance(result, FlowControl) and result.action is Action.SKIP:
        _end(execution, ExecutionState.SKIPPED, Outcome.SKIPPED, now)
    elif isinstance(result, Interrupted) or (
        isinstance(result, FlowControl) and result.action in (Action.CANCEL, Action.PAUSE)
    ):
        # A resumable step that stopped at a checkpoint on a canceled workflow did not finish.
        _end(execution, ExecutionState.CANCELED, Outcome.CANCELED, now)
    else:
        _end(execution, ExecutionState.COMPLETED, Outcome.SUCCESS, now)


def _handle_success_or_flow(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition,
    result: Result,
    now: datetime,
) -> None:
    if isinstance(result, Completed):
        _end(execution, ExecutionState.COMPLETED, Outcome.SUCCESS, now)
        signals.record_clean_resolution(session, execution)
        scheduling.transition(workflow, WorkflowState.READY)
        scheduling.schedule_next_step(session, workflow)
        return
    if isinstance(result, Interrupted):
        _end(execution, ExecutionState.COMPLETED, Outcome.CONTINUED, now)
        scheduling.transition(workflow, WorkflowState.READY)
        scheduling.create_successor_execution(session, workflow, execution, wait=result.wait)
        return
    assert isinstance(result, FlowControl)
    action = result.action
    if action is Action.CANCEL:
        _end(execution, ExecutionState.CANCELED, Outcome.CANCELED, now)
        scheduling.transition(workflow, WorkflowState.CANCELED)
    elif action is Action.PAUSE:
        if step_def.resumable:
            _end(execution, ExecutionState.COMPLETED, Outcome.WORKFLOW_PAUSED, now)
        else:
            _end(execution, ExecutionState.CANCELED, Outcome.CANCELED, now)
        scheduling.transition(workflow, WorkflowState.PAUSED)
    elif action is Action.REATTEMPT:
        if step_def.resumable and result.rewind:
            execution.cursor = None
        execution.write_metadata("reattempt_reason", "flow_control")
        _end(execution, ExecutionState.COMPLETED, Outcome.REATTEMPTED, now)
        scheduling.transition(workflow, WorkflowState.READY)
        _reschedule(session, workflow, execution, step_def, result.wait, rewind=result.rewind)
    elif action is Action.SKIP:
        _end(execution, ExecutionState.SKIPPED, Outcome.SKIPPED, now)
        signals.record_clean_resolution(session, execution)
        scheduling.transition(workflow, WorkflowState.READY)
        scheduling.schedule_next_step(session, workflow)
    elif action is Action.FINISH:
        _end(execution, ExecutionState.COMPLETED, Outcome.SUCCESS, now)
        signals.record_clean_resolution(session, execution)
        scheduling.transition(workflow, WorkflowState.FINISHED)
        scheduling.finish_workflow(workflow)
    elif action is Action.SUSPEND:
        _end(execution, ExecutionState.COMPLETED, Outcome.CONTINUED, now)
        scheduling.transition(workflow, WorkflowState.READY)
        scheduling.create_successor_execution(session, workflow, execution, wait=result.wait)


def _handle_failure(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition,
    error: BaseException,
    config: Settings,
    *,
    reason: str = "exception_policy",
) -> None:
    now = config.clock.now()
    decision = _decide(session, workflow, execution, step_def, error, config)
    action = decision.action
    if action is Action.REATTEMPT:
        execution.write_metadata("reattempt_reason", reason)
        execution.write_metadata("exception", _exception_info(error))
        _end(execution, ExecutionState.COMPLETED, Outcome.REATTEMPTED, now)
        scheduling.transition(workflow, WorkflowState.READY)
        _reschedule(session, workflow, execution, step_def, decision.wait)
    elif action is Action.CANCEL:
        _store_error(execution, error)
        _end(execution, ExecutionState.FAILED, Outcome.CANCELED, now)
        scheduling.transition(workflow, WorkflowState.CANCELED)
    elif action is Action.SKIP:
        _end(execution, ExecutionState.SKIPPED, Outcome.SKIPPED, now)
        signals.record_clean_resolution(session, execution)
        scheduling.transition(workflow, WorkflowState.READY)
        workflow.next_step_name = execution.step_name
        scheduling.schedule_next_step(session, workflow)
    elif action is Action.FINISH:
        _end(execution, ExecutionState.COMPLETED, Outcome.SUCCESS, now)
        signals.record_clean_resolution(session, execution)
        scheduling.finish_workflow(workflow)
    else:
        _store_error(execution, error)
        _end(execution, ExecutionState.FAILED, Outcome.FAILED, now)
        scheduling.transition(workflow, WorkflowState.PAUSED)


def _decide(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition | None,
    error: BaseException,
    config: Settings,
) -> Decision:
    count = queries.consecutive_reattempt_count(session, workflow.id, execution.step_name)
    decision = resolve(
        error,
        step_policy=step_def.exception_policy if step_def is not None else None,
        class_policies=type(workflow)._exception_policies,
        reattempt_count=count,
        workflow=workflow,
    )
    if decision.should_report:
        context = {
            **events.workflow_context(workflow),
            "step_execution_id": execution.id,
            "step_name": execution.step_name,
            "action": str(decision.action),
            "terminal": decision.terminal,
        }
        try:
            config.error_reporter(error, {k: v for k, v in context.items() if v is not None})
        except Exception:
            config.logger.exception("the error reporter itself failed")
    return decision


def _reschedule(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition | None,
    wait: timedelta | None,
    *,
    rewind: bool = False,
) -> None:
    if workflow.next_step_name != execution.step_name:
        workflow.current_step_name = execution.step_name  # e.g. perform_step_inline
    if step_def is not None and step_def.resumable:
        scheduling.create_successor_execution(
            session, workflow, execution, wait=wait, rewind=rewind
        )
    else:
        scheduling.reschedule_current_step(session, workflow, wait=wait)


# -- small helpers ---------------------------------------------------------------------------

_STAMPS = {
    ExecutionState.COMPLETED: "completed_at",
    ExecutionState.FAILED: "failed_at",
    ExecutionState.CANCELED: "canceled_at",
    ExecutionState.SKIPPED: "skipped_at",
}


def _end(execution: StepExecution, state: ExecutionState, outcome: Outcome, now: datetime) -> None:
    check_step_transition(execution.state, state)
    execution.state = state
    execution.outcome = outcome
    setattr(execution, _STAMPS[state], now)
    execution.finished_at = now
    execution.lease_owner = None
    execution.lease_expires_at = None


def _exception_info(error: BaseException) -> dict[str, Any]:
    return {
        "class": _qualified(error),
        "message": str(error),
        "backtrace": traceback.format_exception(error)[-20:],
    }


def _store_error(execution: StepExecution, error: BaseException) -> None:
    execution.error_class_name = _qualified(error)
    execution.error_message = str(error)
    execution.error_backtrace = "".join(traceback.format_exception(error))
    execution.write_metadata("exception", _exception_info(error))


def _qualified(error: BaseException) -> str:
    cls = type(error)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"

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

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session

from geneva_drive.core import events
from geneva_drive.core.errors import StepNotDefinedError, UnitOfWorkError
from geneva_drive.core.settings import Settings, settings
from geneva_drive.core.states import ExecutionState, WorkflowState, check_step_transition
from geneva_drive.definition.flow import Action, FlowControl
from geneva_drive.definition.policy import Decision, resolve
from geneva_drive.definition.workflow import as_workflow
from geneva_drive.engine import outcomes, scheduling, signals, unit_of_work, writer
from geneva_drive.engine.body_results import Completed, Failed, Interrupted
from geneva_drive.engine.iteration import run_resumable
from geneva_drive.engine.recovery import recover_execution
from geneva_drive.engine.wakeups import enqueue_after_commit, enqueued_step
from geneva_drive.storage import queries, serialization
from geneva_drive.storage.db import session_factory
from geneva_drive.storage.models import StepExecution
from geneva_drive.storage.queries._sql import workflow_model
from geneva_drive.storage.queries.bypass import (
    begin_on_held_connection,
    connection_of,
    hold_connection,
    rollback_cause,
)
from geneva_drive.storage.queries.claims import EVERY_CLASS_ANY_QUEUE, ClaimScope

if TYPE_CHECKING:
    from geneva_drive.definition.steps import StepDefinition
    from geneva_drive.definition.workflow import Workflow
    from geneva_drive.storage.models import Signal


# What the application's code (a step body, its hooks, a precondition, a matcher) may raise
# that becomes the step's failure, recorded and resolved by the exception policies. With
# KeyboardInterrupt and SystemExit: raised *by step code* (``sys.exit()`` in a library, a
# re-raised interrupt) they are that step's error, not a request to stop the process — left to
# propagate, they killed the worker thread with the row in progress, and the next worker to
# recover it died the same way. A real SIGINT/SIGTERM reaches the database worker through its
# signal handlers, never as an exception in a step thread. Flow-control signals are caught
# before these (their own BaseException subclasses); GeneratorExit is the interpreter's.
STEP_ERRORS = (Exception, KeyboardInterrupt, SystemExit)


# -- results of phase 2 (the types live in body_results.py; iteration returns them too) ------


Result = Completed | Interrupted | FlowControl | Failed


def execution_payload(workflow: Workflow, execution: StepExecution) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "execution_id": execution.id,
        "workflow_id": workflow.id,
        "workflow_class": type(workflow).__name__,
        "step_name": execution.step_name,
    }
    step_def = type(workflow).steps.named(execution.step_name)
    if step_def is not None and step_def.resumable:
        payload["resumable"] = True
    return payload


@dataclass
class Prepared:
    """A started step. ``identity`` and ``log`` are read when it starts, before its body runs.

    Why: a body whose session breaks (a refused flush, a lost connection) leaves every loaded
    instance expired in a transaction that can no longer load anything, so reading
    ``workflow.id`` afterwards raises. Phase 3 must not need the instances to find its rows.
    """

    workflow: Workflow
    execution: StepExecution
    step_def: StepDefinition
    signal: Signal | None
    claimed: bool = False  # claimed by the transaction that finished another workflow
    identity: dict[str, Any] = field(init=False)
    log: events.ContextAdapter = field(init=False)

    def __post_init__(self) -> None:
        self.identity = execution_payload(self.workflow, self.execution)
        self.log = events.execution_logger(self.workflow, self.execution)

    @property
    def workflow_id(self) -> int:
        return int(self.identity["workflow_id"])

    @property
    def execution_id(self) -> int:
        return int(self.identity["execution_id"])


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
    # Told of every step started without a claim of its own: True when it is the next step
    # of the workflow that just ran (chaining), False when the transaction that finished a
    # workflow claimed it (see _claim_next).
    on_chained: Callable[[bool], None] | None = None
    # Told the id of every step this run starts (the first and each chained one), in the
    # running thread: what a heartbeat renews (leases.RunningExecutions.started).
    on_started: Callable[[int], None] | None = None
    # How many of the next handovers claim with every window of due rows rather than only the
    # first, and whether the last narrow one claimed nothing (see _hand_over). Shared by a
    # worker's threads: hints, whose races cost at most a handover's width.
    wide_handovers: int = 0
    narrow_handover_missed: bool = False


# After a handover whose narrow claim found nothing where the ordinary claim that followed
# found a row (the head of the queue full of rows it could not claim), this many handovers
# claim as widely as the ordinary claim, then a narrow one tries again: behind paused rows one
# narrow miss (one transaction more) per this many workflows.
WIDE_HANDOVERS = 64


@dataclass(frozen=True)
class NotClaimed:
    """The claim found nothing due."""


@dataclass(frozen=True)
class Ended:
    """Phase 1 ended the run without a body: a guard, a timer, a parked step, a duplicate.

    ``error``: what stopped it, raised to the caller after the outcome was committed.
    """

    error: BaseException | None = None


PhaseOne = NotClaimed | Ended | Prepared


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
    with _step_session(config) as session:
        started = _phase1(session, options, config, execution_id=execution_id)
        return _continue(session, started, options, config, reraise=reraise)


def claim_and_run(
    scope: ClaimScope | None,
    options: RunOptions,
    config: Settings | None = None,
    *,
    execution_id: int | None = None,
) -> bool:
    """Claim the next due execution (or, eagerly, the given one) and run it. False if none.

    ``scope`` says which queues and classes may be claimed (None: any row). The claim and
    phase 1 share one transaction (one commit): the claim query locks the workflow row with
    SKIP LOCKED, and phase 1 runs under that lock.
    """
    config = config or settings()
    scope = scope or EVERY_CLASS_ANY_QUEUE
    # Chaining goes on across workflows: the transaction that finishes one claims the next
    # (the same claim, within the same scope), saving a transaction per workflow.
    then_claim = scope if options.chain is not None else None
    with _step_session(config) as session:
        started = _phase1(session, options, config, scope=scope, claim_id=execution_id)
        _after_narrow_miss(options, claimed=not isinstance(started, NotClaimed))
        if isinstance(started, NotClaimed):
            return False
        _continue(session, started, options, config, reraise=False, then_claim=then_claim)
        return True


def _after_narrow_miss(options: RunOptions, *, claimed: bool) -> None:
    """After a narrow handover that claimed nothing, the ordinary claim that follows tells
    why: it found a row (the first due rows could not be claimed: widen the next handovers,
    see _hand_over), or none (nothing was due)."""
    if options.narrow_handover_missed:
        options.narrow_handover_missed = False
        if claimed:
            options.wide_handovers = WIDE_HANDOVERS


@contextmanager
def _step_session(config: Settings) -> Iterator[Session]:
    """The session of one run, holding one connection for all its transactions: the claim's
    and every chained step's (see ``queries.bypass.hold_connection``)."""
    factory = session_factory(config)
    # The factory's own bind, not a new engine_for_workers(): the session finds the held
    # connection under the engine it is bound to, which must be this very object.
    with factory.kw["bind"].connect() as connection, factory() as session:
        hold_connection(session, connection)
        yield session


def _continue(
    session: Session,
    started: PhaseOne,
    options: RunOptions,
    config: Settings,
    *,
    reraise: bool,
    then_claim: ClaimScope | None = None,
) -> StepExecution | None:
    """Phases 2 and 3 of a started step, then of each step chained after it.

    ``then_claim``: when a step finishes its workflow, claim the next execution in that
    scope in the same transaction, and run it here next.
    """
    if isinstance(started, Ended) and started.error is not None and reraise:
        raise started.error
    if not isinstance(started, Prepared):
        return None
    prepared = started
    while True:
        if options.on_started is not None:
            options.on_started(prepared.execution_id)
        result = _perform(session, prepared, options, config)
        error, chained = _finalize(session, prepared, result, config, options, then_claim)
        if error is not None and reraise:
            raise error
        if chained is None:
            return prepared.execution
        if options.on_chained is not None:
            options.on_chained(not chained.claimed)
        prepared = chained


# -- phase 1 ---------------------------------------------------------------------------------


def _phase1(
    session: Session,
    options: RunOptions,
    config: Settings,
    *,
    execution_id: int | None = None,
    scope: ClaimScope = EVERY_CLASS_ANY_QUEUE,
    claim_id: int | None = None,
) -> PhaseOne:
    """Claim (unless given an id), run the guards and start the step, in one transaction.

    An exception from the application's code in phase 1 (a precondition, a signal matcher,
    the hero's loading) or any other unexpected error rolls the transaction back; it is then
    recorded on the execution in a fresh one, through the exception policies exactly as an
    error from the body is (:func:`_record_phase1_error`).
    """
    try:
        with session.begin():
            connection_of(session)  # on the held connection, whichever query comes first
            workflow_id = None
            if execution_id is None:
                claimed = _claim(session, config, scope, claim_id)
                if claimed is None:
                    return NotClaimed()
                execution_id, workflow_id = claimed
            return _prepare(session, execution_id, options, config, workflow_id)
    except STEP_ERRORS as error:
        if queries.is_transient(error):
            # A deadlock or lock timeout rolled phase 1 back: the row is still scheduled and
            # will be claimed again. It is the database's trouble, not the step's.
            raise
        if execution_id is None:
            raise  # the claim itself failed: there is no execution to record anything on
        with session.begin():
            _record_phase1_error(session, execution_id, error, config)
        return Ended(error)


def _claim(
    session: Session, config: Settings, scope: ClaimScope, claim_id: int | None
) -> tuple[int, int] | None:
    now = config.clock.now()
    if claim_id is None:
        return queries.claim_due_execution(session, now, scope)
    return queries.claim_execution(session, claim_id, now, scope)


def _prepare(
    session: Session,
    execution_id: int,
    options: RunOptions,
    config: Settings,
    workflow_id: int | None = None,
) -> Ended | Prepared:
    """The guards that need no step definition, in the gem's order, then the step's own."""
    locked = _lock_both(session, execution_id, workflow_id, config)
    if locked is None:
        return Ended()
    workflow, execution = locked
    log = events.execution_logger(workflow, execution)
    now = config.clock.now()
    # 1. Idempotency: anything but "scheduled" means another run got here first.
    if execution.state != ExecutionState.SCHEDULED:
        log.info("already %s, skipping duplicate run", execution.state)
        return Ended()
    # 2. Workflow state. A paused workflow keeps its scheduled row for resume() (the gem
    #    destroyed it); a finished or canceled one can never run it.
    if workflow.state == WorkflowState.PAUSED:
        log.info("workflow is paused; execution kept for resume()")
        return Ended()
    if workflow.state not in (WorkflowState.READY, WorkflowState.PERFORMING):
        writer.apply(session, workflow, execution, outcomes.for_ended_workflow(), now)
        return Ended()
    # A signal timeout's timer row resolves its parked execution; it has no body to run.
    if execution.is_timer:
        signals.fire_timeout(session, workflow, execution, now)
        return Ended()
    return _guards_and_start(session, workflow, execution, options, now)


def _lock_both(
    session: Session, execution_id: int, workflow_id: int | None, config: Settings
) -> tuple[Workflow, StepExecution] | None:
    """Lock the workflow row, then the execution's (the lock order of ``queries``).

    Run by id (not claimed), the execution's row is locked only while it is scheduled: this
    may be a duplicate delivery while another run completes the step, and on PostgreSQL that
    completion is one statement which holds the execution's row ``FOR SHARE`` as it waits
    for the workflow row (``queries.complete_in_one_statement``). Holding the workflow row,
    a wait for the execution's would close the cycle — and when the database broke it by
    aborting the completion, the step's outcome was lost and the step ran again. A row that
    is no longer scheduled is left unlocked and skipped here: guard 1 of :func:`_prepare`,
    decided by the locking read (a plain re-read could see an older snapshot's state).
    """
    if workflow_id is not None:  # claimed: the claim holds the execution's row already
        workflow = as_workflow(queries.lock_workflow(session, workflow_id))
        execution = queries.lock_execution(session, execution_id)
        return None if workflow is None or execution is None else (workflow, execution)
    found = queries.get_execution(session, execution_id)
    if found is None:
        config.logger.warning("step execution %s not found; nothing to run", execution_id)
        return None
    workflow = as_workflow(queries.lock_workflow(session, found.workflow_id))
    if workflow is None:
        return None
    execution = queries.lock_execution(session, execution_id, only_if=ExecutionState.SCHEDULED)
    if execution is None:
        events.execution_logger(workflow, found).info("no longer scheduled, skipping duplicate run")
        return None
    return workflow, execution


def _guards_and_start(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    options: RunOptions,
    now: datetime,
) -> Ended | Prepared:
    """Guards 3 to 8 on a scheduled execution of a running workflow, then the start (9)."""
    step_def = type(workflow).steps.named(execution.step_name)
    plan, error = _guard_plan(workflow, execution, step_def)
    if plan is None and step_def is not None:
        plan = _precondition_plan(workflow, execution, step_def)
    if plan is not None:
        writer.apply(session, workflow, execution, plan, now, error=error)
        return Ended(error)
    assert step_def is not None  # _guard_plan decided on a missing one
    # 8. The signal gate: proceed with an attached signal, or park.
    signal = None
    if step_def.waits_for_signal:
        signal = signals.gate(session, workflow, execution, step_def)
        if signal is None:
            return Ended()
    # 9. Start, under the locks phase 1 holds.
    started = writer.lease_columns(now, options.worker_id, options.lease)
    writer.start(session, workflow, execution, step_def, now, started)
    return Prepared(workflow, execution, step_def, signal)


def _guard_plan(
    workflow: Workflow, execution: StepExecution, step_def: StepDefinition | None
) -> tuple[outcomes.Plan | None, StepNotDefinedError | None]:
    """Guards 3 to 5: the hero still exists, the step is defined and not removed."""
    cls = type(workflow)
    log = events.execution_logger(workflow, execution)
    if not cls.may_proceed_without_hero and workflow.hero is None:
        log.info("hero is gone; canceling the workflow")
        return outcomes.for_missing_hero(), None
    if step_def is None:
        message = f"Step {execution.step_name!r} is not defined in {cls.__name__}"
        error = StepNotDefinedError(message, step_execution=execution, workflow=workflow)
        return outcomes.for_undefined_step(), error
    if step_def.removed:
        log.info("step was removed from the code; skipping past it")
        return outcomes.for_removed_step(), None
    return None, None


def _precondition_plan(
    workflow: Workflow, execution: StepExecution, step_def: StepDefinition
) -> outcomes.Plan | None:
    """Guards 6 and 7: ``cancel_if`` conditions, then ``skip_if``. Their errors propagate."""
    payload = execution_payload(workflow, execution)
    with events.instrument("precondition", payload):
        try:
            if cancel_conditions_hold(workflow):
                payload["outcome"] = "canceled"
                return outcomes.for_cancel_condition()
            if step_def.should_skip(workflow):
                payload["outcome"] = "skipped"
                return outcomes.for_skip_condition()
        except STEP_ERRORS as error:
            payload["outcome"] = "exception"
            payload["exception"] = error
            raise
        payload["outcome"] = "passed"
    return None


def _record_phase1_error(
    session: Session, execution_id: int, error: BaseException, config: Settings
) -> None:
    """Record an error raised in phase 1 (rolled back) on the still scheduled execution.

    Resolved by the exception policies and counted towards the reattempt cap exactly like an
    error from the body, with ``reattempt_reason`` ``precondition``.
    """
    locked = _lock_both(session, execution_id, None, config)
    if locked is None or locked[1].state != ExecutionState.SCHEDULED:
        return
    workflow, execution = locked
    now = config.clock.now()
    step_def = type(workflow).steps.named(execution.step_name)
    plan = _error_plan(session, workflow, execution, step_def, error, config, "precondition")
    writer.apply(session, workflow, execution, plan, now, error=error)


def cancel_conditions_hold(workflow: Workflow) -> bool:
    return any(bool(condition(workflow)) for condition in type(workflow)._cancel_conditions)


# -- phase 2 ---------------------------------------------------------------------------------


def _perform(session: Session, prepared: Prepared, options: RunOptions, config: Settings) -> Result:
    workflow, execution, step_def = prepared.workflow, prepared.execution, prepared.step_def
    payload = dict(prepared.identity)
    begin_on_held_connection(session)  # the body's queries, then phase 3, on that connection
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
                    outcome: Result = run_resumable(
                        session, workflow, execution, step_def, options, config
                    )
                else:
                    step_def.run(workflow)
                    outcome = Completed()
            except FlowControl as flow:
                outcome = flow
            except STEP_ERRORS as error:
                outcome = Failed(error)
            payload["outcome"] = _describe(outcome)
            if isinstance(outcome, Failed):
                payload["exception"] = outcome.error
            return outcome

    try:
        # Payload references (mapped instances) load in the step's own session.
        with (
            workflow._in_step_context(),
            serialization.decoding_session(session),
            unit_of_work.guard(session, step_def, prepared.execution_id),  # commit() refused
        ):
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
            except STEP_ERRORS as error:
                result = Failed(error)
    finally:
        workflow.__dict__.pop("_gd_received_signal", None)
    if isinstance(result, Failed):
        prepared.log.warning("step raised %s: %s", type(result.error).__name__, result.error)
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
    session: Session,
    prepared: Prepared,
    result: Result,
    config: Settings,
    options: RunOptions,
    then_claim: ClaimScope | None = None,
) -> tuple[BaseException | None, Prepared | None]:
    """Record the outcome and schedule what comes next, with the body's writes.

    Returns the step's error, if any, and the next step when it was started in the same
    transaction (chaining, see :func:`_complete`).
    """
    # Not read from the instances: after a failed body they may be expired (see Prepared).
    workflow_id, execution_id = prepared.workflow_id, prepared.execution_id
    payload = dict(prepared.identity)
    if not isinstance(result, Failed):
        result = _save_body_writes(session, prepared, result, config)
    if isinstance(result, Failed):
        # The body's writes must not land with a failure. Also what makes a session the body
        # broke usable again; the locks below then reload the rows phase 3 needs.
        session.rollback()
    error = result.error if isinstance(result, Failed) else None
    with events.instrument("finalize", payload):
        try:
            if isinstance(result, Completed):
                completed, chained = _complete(
                    session, prepared, config, payload, options, then_claim
                )
                if completed:
                    return None, chained
            # Re-lock in the body's own transaction: its writes commit with the outcome.
            workflow = as_workflow(queries.lock_workflow(session, workflow_id))
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
            plan = _result_plan(session, workflow, execution, prepared.step_def, result, config)
            # An operator's pause holds whatever the plan: the move is theirs, not ours.
            guarded = workflow.state != WorkflowState.PAUSED
            now = config.clock.now()
            writer.apply(session, workflow, execution, plan, now, error=error, guarded=guarded)
            payload["workflow_state"] = workflow.state
            payload["step_state"] = execution.state
            session.commit()
        except BaseException as failure:
            session.rollback()
            if isinstance(failure, Exception) and queries.is_transient(failure):
                # The outcome and the body's writes were rolled back together. Hand the
                # execution back now rather than leave it in progress under our live lease
                # (the heartbeat would keep it from ever being recovered).
                _release_after_transient_error(session, execution_id, failure, config)
            raise
    prepared.workflow, prepared.execution = workflow, execution
    return error, None


def _result_plan(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition,
    result: Result,
    config: Settings,
) -> outcomes.Plan:
    """What the body's result means, given what an operator did to the workflow meanwhile."""
    canceled = workflow.state == WorkflowState.CANCELED
    resumable = step_def.resumable
    if isinstance(result, Completed):
        plan = outcomes.for_completion()
    elif isinstance(result, Interrupted):
        plan = outcomes.for_interruption(result.wait)
    elif isinstance(result, FlowControl):
        plan = outcomes.for_flow_control(
            result.action, resumable=resumable, wait=result.wait, rewind=result.rewind
        )
    elif canceled:  # nothing follows a canceled workflow: no policy to ask, nothing to report
        plan = outcomes.for_error(Action.PAUSE, resumable=resumable, wait=None, reason="")
    else:
        plan = _error_plan(
            session, workflow, execution, step_def, result.error, config, "exception_policy"
        )
    if canceled:
        return outcomes.while_canceled(plan)
    if workflow.state == WorkflowState.PAUSED:
        return outcomes.while_paused(plan, interrupted=isinstance(result, Interrupted))
    return plan


def _error_plan(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition | None,
    error: BaseException,
    config: Settings,
    reason: str,
) -> outcomes.Plan:
    """The exception policies' decision on ``error``, as a plan; the one path for every error."""
    decision = _decide(session, workflow, execution, step_def, error, config)
    resumable = step_def is not None and step_def.resumable
    return outcomes.for_error(
        decision.action, resumable=resumable, wait=decision.wait, reason=reason
    )


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
    if _broken(session):
        return _swallowed(session, prepared)
    try:
        session.flush()
    except Exception as error:
        session.rollback()
        if queries.is_transient(error):
            _release_after_transient_error(session, prepared.execution_id, error, config)
            raise
        prepared.log.warning(
            "the step's writes could not be saved: %s: %s", type(error).__name__, error
        )
        return Failed(error)
    return result


def _broken(session: Session) -> bool:
    """Whether the body's transaction is lost: a failed flush, or its connection died."""
    if not session.is_active:
        return True
    return session.in_transaction() and connection_of(session).invalidated


def _swallowed(session: Session, prepared: Prepared) -> Failed:
    """The body caught an error that lost its transaction, and returned normally.

    Its writes are lost with that transaction, so the step cannot have succeeded: it fails
    (the policies decide), with the error it swallowed as the cause.
    """
    cause = rollback_cause(session)
    what = f"({cause!r})" if cause is not None else "(its database connection was lost)"
    session.rollback()
    error = UnitOfWorkError(
        f"{prepared.step_def.label} (execution id={prepared.execution_id}) returned normally "
        f"after an error from self.session ended its transaction {what}, so none of its "
        "writes can be saved; let the error propagate, or run the statements that may fail "
        "in `with self.session.begin_nested():` and catch the error outside that block"
    )
    error.__cause__ = cause
    prepared.log.warning("%s", error)
    return Failed(error)


def _complete(
    session: Session,
    prepared: Prepared,
    config: Settings,
    payload: dict[str, Any],
    options: RunOptions,
    then_claim: ClaimScope | None = None,
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
    gate), it is inserted in progress at once — and when the body wrote nothing, the
    completion and that start are the transaction's one statement, which PostgreSQL runs
    as a transaction of its own (``queries.bypass.execute_alone``: one round trip, not
    three). When the step finishes its workflow and ``then_claim`` is given, the same
    transaction claims the next execution instead (:func:`_claim_next`).
    """
    workflow, execution = prepared.workflow, prepared.execution
    if session.is_modified(workflow, include_collections=False):
        return False, None
    now = config.clock.now()
    after = _after_completion(workflow, options, now)
    as_started = {
        "state": workflow.state,
        "current_step_name": workflow.current_step_name,
        "next_step_name": workflow.next_step_name,
        "transitioned_at": workflow.transitioned_at,
    }
    plan = outcomes.for_completion()
    check_step_transition(execution.state, plan.state)
    done = {**outcomes.ended_columns(plan, now), "updated_at": now}
    completer = writer.completer_for(session.get_bind().dialect)
    handover = None
    if after.step is None and then_claim is not None:
        handover = _hand_over(
            session, completer, prepared, after, as_started, done, then_claim, options, now
        )
    if handover is not None:
        wrote_workflow, wrote_execution = handover.wrote_workflow, handover.wrote_execution
        created = None
    else:
        # A step started directly is all that follows the completion in this transaction
        # (nothing of the application's runs for it, see _started_directly): the
        # completion may commit as it is written.
        wrote_workflow, wrote_execution, created = completer.complete(
            session,
            workflow,
            after.navigation,
            as_started,
            execution,
            done,
            after.row,
            alone=after.direct,
        )
    if not wrote_workflow:
        return False, None
    if not after.direct and handover is None:  # no lock left to remember if it ran alone
        queries.remember_workflow_lock(session, workflow.id, workflow)
    if not wrote_execution:
        # Someone took the row from us (lease recovery): our run is the duplicate.
        events.execution_logger(workflow, execution).warning(
            "execution is no longer in_progress; discarding this run's work"
        )
        session.rollback()
        return True, None
    signals.record_clean_resolution(session, execution)
    chained = None
    if created is not None and after.step is not None:
        chained = _hand_on(session, workflow, created, after, options, now)
    elif handover is not None:
        chained = _claimed_directly(handover)
        if chained is None and handover.claimed and not handover.committed:
            assert then_claim is not None  # a handover claims within it
            # It claimed a step it could not start, and this transaction still holds the
            # lock: the claim finds that row again first, and phase 1 runs on it here.
            chained = _claim_next(session, then_claim, options, config, now)
    elif after.step is None and then_claim is not None:
        chained = _claim_next(session, then_claim, options, config, now)
    payload["workflow_state"] = workflow.state
    payload["step_state"] = execution.state
    session.commit()
    return True, chained


@dataclass(frozen=True)
class _AfterCompletion:
    """What follows a completed step on the fast path, decided before anything is written.

    ``chain``: the next step starts in this transaction and runs on this thread. ``direct``:
    nothing can keep it from starting, so its row is inserted already in progress.
    """

    step: StepDefinition | None
    navigation: dict[str, Any]
    row: dict[str, Any] | None
    job_options: dict[str, Any]
    chain: bool = False
    direct: bool = False


def _after_completion(workflow: Workflow, options: RunOptions, now: datetime) -> _AfterCompletion:
    following = type(workflow).steps.next_after(workflow.current_step_name)
    if following is None:
        finished = {
            "state": WorkflowState.FINISHED,
            "transitioned_at": now,
            "current_step_name": None,
            "next_step_name": None,
            "updated_at": now,
        }
        return _AfterCompletion(None, finished, None, {})
    job_options = workflow.merged_job_options(following)
    queue = str(job_options.get("queue") or "default")
    chain = options.chain is not None and not following.wait_delta and options.chain(queue)
    direct = chain and _nothing_to_check(type(workflow), following)
    navigation = {
        "state": WorkflowState.PERFORMING if direct else WorkflowState.READY,
        "current_step_name": following.name if direct else None,
        "next_step_name": following.name,
        "updated_at": now,
    }
    started = writer.lease_columns(now, options.worker_id, options.lease) if direct else None
    row = scheduling.execution_values(
        workflow,
        following,
        now=now,
        wait=following.wait_delta,
        started=started,
        options=job_options,
    )
    return _AfterCompletion(following, navigation, row, job_options, chain, direct)


def _hand_on(
    session: Session,
    workflow: Workflow,
    created: StepExecution,
    after: _AfterCompletion,
    options: RunOptions,
    now: datetime,
) -> Prepared | None:
    """The next step, just inserted: run it here next (chaining), or wake a worker for it."""
    assert after.step is not None
    if after.direct:
        return _started_directly(workflow, created, after.step)
    if after.chain:
        return _start_chained(session, workflow, created, after.step, options, now)
    enqueue_after_commit(session, enqueued_step(workflow, created, after.job_options))
    return None


def _nothing_to_check(cls: type[Workflow], step_def: StepDefinition) -> bool:
    """Whether phase 1 of ``step_def`` is certain to start it: no guard could decide otherwise."""
    return cls.may_proceed_without_hero and _no_preconditions(cls, step_def)


def _no_preconditions(cls: type[Workflow], step_def: StepDefinition) -> bool:
    """No cancel_if, skip_if or signal gate: nothing of the application's runs in phase 1."""
    return not cls._cancel_conditions and step_def.skip_if is None and not step_def.waits_for_signal


def _started_directly(
    workflow: Workflow, execution: StepExecution, step_def: StepDefinition
) -> Prepared:
    # Phase 1's event for a step whose preconditions had nothing to say.
    payload = execution_payload(workflow, execution)
    with events.instrument("precondition", payload):
        payload["outcome"] = "passed"
    return Prepared(workflow, execution, step_def, None)


def _hand_over(
    session: Session,
    completer: writer.Completer,
    prepared: Prepared,
    after: _AfterCompletion,
    as_started: dict[str, Any],
    done: dict[str, Any],
    scope: ClaimScope,
    options: RunOptions,
    now: datetime,
) -> queries.Handover | None:
    """A workflow's last completion, the next claim and, when phase 1 is certain to start
    the claimed step, its start: one statement (``queries.handover``), where the completer
    can send it. None, having written nothing, otherwise: the caller completes, then
    :func:`_claim_next` claims in the same transaction.

    Only within a worker's scope (the classes it has loaded): the steps it may start so are
    worked out from those classes.

    Whether the statement runs as a transaction of its own is a guess at what it will
    claim. Alone, it costs one round trip instead of three — but the lock on a row it could
    not start goes with it, and an ordinary claim must take that row again in a transaction
    of its own. So it runs alone after a workflow whose own class starts directly: a backlog
    tends to hold many workflows of one class, and after one of them the next is likely
    such a step. After any other, the transaction goes on, and a row it claimed but could
    not start is run from there (the caller).

    Its claim tries only the first due rows, unless a recent narrow one claimed nothing
    where the ordinary claim after it found a row (``RunOptions.wide_handovers``,
    ``queries.handover``): a claim with every window costs the server 13 % more per step on
    a backlog, where the first rows always do.
    """
    if not (completer.hands_over and scope.loaded_only):
        return None
    if options.should_exit is not None and options.should_exit():
        return None
    direct = _direct_steps(scope)
    if not direct[0]:
        return None
    wide = options.wide_handovers > 0
    if wide:
        options.wide_handovers -= 1
    claim = queries.NextClaim(
        scope=scope,
        now=now,
        started=writer.lease_columns(now, options.worker_id, options.lease),
        direct=direct,
        alone=_starts_directly(type(prepared.workflow)),
        wide=wide,
    )
    handover = completer.finish_and_start_next(
        session, prepared.workflow, after.navigation, as_started, prepared.execution, done, claim
    )
    if handover is not None and not wide and not handover.claimed:
        options.narrow_handover_missed = True
    return handover


def _starts_directly(cls: type[Workflow]) -> bool:
    """Whether phase 1 is certain to start the first step of ``cls``."""
    runnable = cls.steps.runnable()
    return bool(runnable) and _nothing_to_check(cls, runnable[0])


def _claim_next(
    session: Session, scope: ClaimScope, options: RunOptions, config: Settings, now: datetime
) -> Prepared | None:
    """Claim the next due execution in the transaction that has just finished a workflow.

    A worker with a backlog would otherwise commit this transaction and at once open
    another for its next claim: one commit per workflow saved (four become three for a
    three-step workflow). The claim is the usual one — same scope, same SKIP LOCKED, same
    order — and its phase 1 runs as a chained step's does (:func:`_start_chained`), so an
    application error there never costs the finished workflow its outcome. Nothing is
    claimed once the worker is stopping. A timer row or a step the code does not define is
    left to an ordinary claim (declined: its lock goes with this commit), whose phase 1
    resolves it as always.
    """
    if options.should_exit is not None and options.should_exit():
        return None
    claimed = _claim(session, config, scope, None)
    if claimed is None:
        return None
    locked = _lock_both(session, claimed[0], claimed[1], config)
    assert locked is not None  # both rows were just claimed and locked
    workflow, execution = locked
    step_def = type(workflow).steps.named(execution.step_name)
    if step_def is None or execution.is_timer:
        return None
    started = _start_chained(session, workflow, execution, step_def, options, now)
    if started is not None:
        started.claimed = True
    return started


def _claimed_directly(handover: queries.Handover) -> Prepared | None:
    """The step :func:`_hand_over` claimed and started, to run here next."""
    if handover.started is None:
        return None
    row, execution = handover.started
    workflow = cast("Workflow", row)  # the query layer types it by its columns
    step_def = type(workflow).steps.named(execution.step_name)
    assert step_def is not None  # one of the direct steps of its class
    started = _started_directly(workflow, execution, step_def)
    started.claimed = True
    return started


def _direct_steps(scope: ClaimScope) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(workflow types, step names), pairwise: every step of a class in ``scope`` whose
    phase 1 is certain to start it (see :func:`_nothing_to_check`)."""
    classes = workflow_model().__mapper__.polymorphic_map
    return _direct_pairs(
        tuple((name, classes[name].class_) for name in scope.workflow_types if name in classes)
    )


@functools.lru_cache(maxsize=64)
def _direct_pairs(
    classes: tuple[tuple[str, type[Workflow]], ...],
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    pairs = [
        (name, str(step_def.name))
        for name, cls in classes
        for step_def in cls.steps.runnable()
        if _nothing_to_check(cls, step_def)
    ]
    return tuple(name for name, _ in pairs), tuple(step for _, step in pairs)


def _start_chained(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition,
    options: RunOptions,
    now: datetime,
) -> Prepared | None:
    """Phase 1 of a step inside the transaction that completed another one: its
    predecessor's, or (claimed there) the last step of another workflow.

    Should anything fail unexpectedly here, only this step's start is undone: the
    predecessor's outcome and its body's writes still commit, and the step is left
    scheduled for an ordinary claim, whose phase 1 records the failure as it always does.
    The hero is read before anything is written for the next step; guards that run
    application code or a signal gate run in a savepoint.
    """
    cls = type(workflow)
    # The guards read the hero and may query: let them find the rows as a claim's phase 1
    # would, with the predecessor's writes in place.
    session.flush()
    # Not the hero the predecessor saw (it may have deleted it), but the row as it is now.
    workflow.__dict__.pop("_gd_hero", None)
    if not cls.may_proceed_without_hero:
        try:
            workflow.hero  # noqa: B018 — loads and caches it for the guard
        except STEP_ERRORS as error:
            _leave_scheduled(session, workflow, execution, step_def, error)
            return None
    if _no_preconditions(cls, step_def):
        started = _guards_and_start(session, workflow, execution, options, now)
        return started if isinstance(started, Prepared) else None
    try:
        with session.begin_nested():
            started = _guards_and_start(session, workflow, execution, options, now)
        return started if isinstance(started, Prepared) else None
    except STEP_ERRORS as error:
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
    error: BaseException,
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
    enqueue_after_commit(session, enqueued_step(workflow, execution))


def _release_after_transient_error(
    session: Session, execution_id: int, error: Exception, config: Settings
) -> None:
    try:
        with session.begin():
            recover_execution(session, execution_id, reason=f"transient database error: {error}")
    except Exception:
        config.logger.exception(
            "could not hand back execution %s after a database error; it is recovered "
            "once its lease runs out",
            execution_id,
        )


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

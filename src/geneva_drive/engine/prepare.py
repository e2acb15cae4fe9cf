"""Phase 1 of a step execution: claim it, lock it, run the guards and start it.

One short transaction holding the workflow row lock: guards in a fixed order, preconditions,
the signal gate, then ``scheduled → in_progress`` and commit. What it hands phase 2 is a
:class:`Prepared`; what ends a run without a body is :class:`Ended` (or :class:`NotClaimed`).
The chaining module runs the same guards and start inside the transaction that completed
another step (``chaining``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from geneva_drive.core import events
from geneva_drive.core.awaiting import settle
from geneva_drive.core.errors import StepNotDefinedError
from geneva_drive.core.settings import Settings
from geneva_drive.core.states import ExecutionState, WorkflowState
from geneva_drive.definition.limits import limits_of
from geneva_drive.definition.workflow import as_workflow
from geneva_drive.engine import children, limits, outcomes, signals, tracing, writer
from geneva_drive.engine.fair_turns import FairTurns, turns_of
from geneva_drive.engine.run_options import RunOptions
from geneva_drive.engine.step_errors import STEP_ERRORS, error_plan
from geneva_drive.storage import queries
from geneva_drive.storage.models import StepExecution
from geneva_drive.storage.queries import fairness
from geneva_drive.storage.queries.bypass import connection_of
from geneva_drive.storage.queries.claims import EVERY_CLASS_ANY_QUEUE, ClaimScope

if TYPE_CHECKING:
    from geneva_drive.definition.steps import StepDefinition
    from geneva_drive.definition.workflow import Workflow
    from geneva_drive.storage.models import Signal


def execution_payload(workflow: Workflow, execution: StepExecution) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "execution_id": execution.id,
        "workflow_id": workflow.id,
        "workflow_class": type(workflow).__name__,
        "step_name": execution.step_name,
    }
    if events.active("step"):  # for the metrics' queue lag; read only when someone listens
        payload["queue"] = execution.queue
        payload["due_at"] = execution.scheduled_for
        payload["started_at"] = execution.started_at
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
    # The concurrency key whose slot the step holds (engine.limits); freed by phase 3.
    holds: str | None = None
    # What the body returned, encoded (phase 3 stores it on a successful completion).
    result: Any = field(default=None, init=False)
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


def phase1(
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
                claimed = claim(session, config, scope, claim_id, options)
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


def claim(
    session: Session,
    config: Settings,
    scope: ClaimScope,
    claim_id: int | None,
    options: RunOptions,
) -> tuple[int, int] | None:
    now = config.clock.now()
    with tracing.claim_span(config) as span:
        if claim_id is not None:
            claimed = queries.claim_execution(session, claim_id, now, scope)
        elif scope.takes_turns:
            claimed = _claim_in_turn(session, now, scope, turns_of(options))
        else:
            claimed = queries.claim_due_execution(session, now, scope)
        span.claimed(claimed)
    if claimed is not None and events.active("claim"):
        events.emit("claim", {})
    return claimed


def _claim_in_turn(
    session: Session, now: datetime, scope: ClaimScope, turns: FairTurns
) -> tuple[int, int] | None:
    """The ordinary claim or a key's turn, whichever is this thread's turn
    (``engine.fair_turns``); the other when that one finds nothing."""
    if not turns.keys_next:
        claimed = _ordinary_turn(session, now, scope, turns)
        return claimed if claimed is not None else _key_turn(session, now, scope, turns)
    claimed = _key_turn(session, now, scope, turns)
    return claimed if claimed is not None else _ordinary_turn(session, now, scope, turns)


def _ordinary_turn(
    session: Session, now: datetime, scope: ClaimScope, turns: FairTurns
) -> tuple[int, int] | None:
    claimed = queries.claim_due_execution(session, now, scope)
    turns.took_ordinary_turn(found=claimed is not None)
    return claimed


def _key_turn(
    session: Session, now: datetime, scope: ClaimScope, turns: FairTurns
) -> tuple[int, int] | None:
    turn = fairness.claim_fairly(session, now, scope, turns.shared)
    turns.took_key_turn(keys_due=turn.keys_due, shared=turn.shared)
    return turn.claimed


def _prepare(
    session: Session,
    execution_id: int,
    options: RunOptions,
    config: Settings,
    workflow_id: int | None = None,
) -> Ended | Prepared:
    """The guards that need no step definition, in the gem's order, then the step's own."""
    locked = lock_both(session, execution_id, workflow_id, config)
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
        if children.times_fan_in(workflow, execution):
            children.fire_timeout(session, workflow, execution, now)
        else:
            signals.fire_timeout(session, workflow, execution, now)
        return Ended()
    return guards_and_start(session, workflow, execution, options, now)


def lock_both(
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


def guards_and_start(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    options: RunOptions,
    now: datetime,
    *,
    chained: bool = False,
) -> Ended | Prepared:
    """Guards 3 to 8 on a scheduled execution of a running workflow, the limits (9), then
    the start (10). ``chained``: in a transaction that did other work (see ``limits.admit``)."""
    step_def = type(workflow).steps.named(execution.step_name)
    plan, error = _guard_plan(workflow, execution, step_def)
    if plan is None and step_def is not None:
        plan = _precondition_plan(workflow, execution, step_def)
    if plan is not None:
        writer.apply(session, workflow, execution, plan, now, error=error)
        return Ended(error)
    assert step_def is not None  # _guard_plan decided on a missing one
    # 7b. An absolute wait not reached yet (its callable decided after the step was
    #     scheduled, or the time moved): due then instead; its errors are the step's.
    if step_def.wait_until is not None:
        until = step_def.until_for(workflow, now)
        if until is not None and until > now:
            writer.defer(session, workflow, execution, until)
            return Ended()
    # 8. The signal gate: proceed with an attached signal, or park. The fan-in gate: run
    #    once enough children ended, raise ChildFailed if one was canceled, or park.
    signal = None
    if step_def.waits_for_signal:
        signal = signals.gate(session, workflow, execution, step_def)
        if signal is None:
            return Ended()
    if step_def.waits_for_children and not children.gate(session, workflow, execution, step_def):
        return Ended()
    # 9. Limits: a slot of its concurrency key, a start in its rate window — or the row is
    #    parked (or postponed) and this worker moves on (engine.limits).
    holds = None
    step_limits = limits_of(type(workflow), step_def)
    if step_limits is not None:
        admission = limits.admit(
            session, workflow, execution, step_def, step_limits, now, chained=chained
        )
        if not admission.started:
            return Ended()
        holds = admission.holds
    # 10. Start, under the locks phase 1 holds.
    started = writer.lease_columns(now, options.worker_id, options.lease)
    writer.start(session, workflow, execution, step_def, now, started)
    prepared = Prepared(workflow, execution, step_def, signal)
    prepared.holds = holds
    return prepared


def _guard_plan(
    workflow: Workflow, execution: StepExecution, step_def: StepDefinition | None
) -> tuple[outcomes.Plan | None, StepNotDefinedError | None]:
    """Guards 3 to 5: the hero still exists, the step is defined and not removed."""
    cls = type(workflow)
    log = events.execution_logger(workflow, execution)
    compensating = step_def is not None and step_def.compensation
    # A compensation runs without its hero too: canceling again would skip what it undoes.
    if not cls.may_proceed_without_hero and not compensating and workflow.hero is None:
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
            # Not before a compensation: the workflow is being canceled already.
            if not step_def.compensation and cancel_conditions_hold(workflow):
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
    locked = lock_both(session, execution_id, None, config)
    if locked is None or locked[1].state != ExecutionState.SCHEDULED:
        return
    workflow, execution = locked
    now = config.clock.now()
    step_def = type(workflow).steps.named(execution.step_name)
    plan = error_plan(session, workflow, execution, step_def, error, config, "precondition")
    writer.apply(session, workflow, execution, plan, now, error=error)


def cancel_conditions_hold(workflow: Workflow) -> bool:
    return any(bool(settle(condition(workflow))) for condition in type(workflow)._cancel_conditions)

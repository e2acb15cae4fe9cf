"""Phase 3 of a step execution: record its outcome and schedule what comes next.

Re-lock the workflow row *in the body's transaction*, record the outcome, create the next
execution and commit — one commit for the body's writes, the outcome and the next step
together. A failed body is rolled back first, so its writes never land. A completed step
whose workflow nobody touched meanwhile takes the fast path (:func:`_complete`), where the
next step may start in the same transaction (``chaining``).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from geneva_drive.core import events
from geneva_drive.core.errors import UnitOfWorkError
from geneva_drive.core.settings import Settings
from geneva_drive.core.states import (
    ExecutionState,
    Outcome,
    WorkflowState,
    check_step_transition,
)
from geneva_drive.definition.flow import Action, FlowControl
from geneva_drive.definition.until import delay_until
from geneva_drive.definition.workflow import as_workflow
from geneva_drive.engine import chaining, compensation, limits, outcomes, writer
from geneva_drive.engine.body_results import Completed, Failed, Interrupted
from geneva_drive.engine.prepare import Prepared
from geneva_drive.engine.recovery import recover_execution
from geneva_drive.engine.run_options import RunOptions
from geneva_drive.engine.step_errors import error_plan
from geneva_drive.storage import queries
from geneva_drive.storage.models import StepExecution
from geneva_drive.storage.queries.bypass import connection_of, rollback_cause
from geneva_drive.storage.queries.claims import ClaimScope

if TYPE_CHECKING:
    from geneva_drive.definition.steps import StepDefinition
    from geneva_drive.definition.workflow import Workflow


# What phase 2 hands phase 3 (the types live in body_results.py; iteration returns them too).
Result = Completed | Interrupted | FlowControl | Failed


def finalize(
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
    prepared.result = result.result if isinstance(result, Completed) else None
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
                _discard_duplicate(workflow, execution, f"{execution.state} ({execution.outcome})")
                session.rollback()
                return None, None
            now = config.clock.now()  # once: the plan's waits and the rows written
            plan = _result_plan(
                session, workflow, execution, prepared.step_def, result, config, now
            )
            # A cancel that waited for this step (engine.compensation): keep its result, then
            # compensate.
            pending = compensation.cancel_pending(workflow)
            if pending:
                plan = outcomes.while_canceled(plan)
            # An operator's pause holds whatever the plan: the move is theirs, not ours.
            guarded = workflow.state != WorkflowState.PAUSED
            if plan.outcome is Outcome.SUCCESS and prepared.result is not None:
                execution.result_json = prepared.result  # a success keeps what it returned
            writer.apply(session, workflow, execution, plan, now, error=error, guarded=guarded)
            if pending:
                writer.cancel(session, workflow, now, guarded=False)
            if workflow.state == WorkflowState.CANCELED:
                # Canceled while the body ran: children it started (or that its checkpoints
                # committed) after the cancel are canceled with it.
                writer.cancel_children(session, workflow, now)
            held = prepared.holds
            if held is not None:  # last: the key's lock is then held only until the commit
                limits.release(session, execution_id, held, now)
            payload["workflow_state"] = workflow.state
            payload["step_state"] = execution.state
            session.commit()
        except BaseException as failure:
            session.rollback()
            if isinstance(failure, Exception) and queries.is_transient(failure):
                # The outcome and the body's writes were rolled back together. Hand the
                # execution back now rather than leave it in progress under our live lease
                # (the heartbeat would keep it from ever being recovered). Its body runs
                # again: retrying only the outcome would lose the writes, and whether the
                # body wrote nothing is not known cheaply (its transaction is begun on the
                # held connection, and Core statements bypass the session's bookkeeping).
                # So the engine's own statements here avoid the cycles instead: freeing a
                # slot waits for no lock after it (engine.limits, "Deadlocks").
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
    now: datetime,
) -> outcomes.Plan:
    """What the body's result means, given what an operator did to the workflow meanwhile.

    A ``wait_until`` (reattempt, suspend, skip_to) becomes a wait from ``now``."""
    canceled = workflow.state == WorkflowState.CANCELED
    resumable = step_def.resumable
    if isinstance(result, Completed):
        plan = outcomes.for_completion()
    elif isinstance(result, Interrupted):
        plan = outcomes.for_interruption(result.wait or delay_until(result.until, now))
    elif isinstance(result, FlowControl):
        wait = result.wait or delay_until(result.until, now)
        plan = outcomes.for_flow_control(
            result.action, resumable=resumable, wait=wait, rewind=result.rewind
        )
    elif canceled:  # nothing follows a canceled workflow: no policy to ask, nothing to report
        plan = outcomes.for_error(Action.PAUSE, resumable=resumable, wait=None, reason="")
    else:
        plan = error_plan(
            session, workflow, execution, step_def, result.error, config, "exception_policy"
        )
    if canceled:
        return outcomes.while_canceled(plan)
    if workflow.state == WorkflowState.PAUSED:
        return outcomes.while_paused(plan, interrupted=isinstance(result, Interrupted))
    return plan


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
    transaction claims the next execution instead (:func:`chaining.claim_next`).
    """
    workflow, execution = prepared.workflow, prepared.execution
    if session.is_modified(workflow, include_collections=False):
        return False, None
    if prepared.step_def.compensation:  # what follows it is decided by engine.compensation
        return False, None
    if (
        workflow.parent_id is not None
        and workflow.steps.next_after(workflow.current_step_name) is None
    ):
        # A child's last step: its end must reach its parent in this transaction, which
        # the general path's writer does (writer.move); this path writes the end in SQL.
        return False, None
    now = config.clock.now()
    after = chaining.after_completion(workflow, options, now, prepared.holds)
    as_started = {
        "state": workflow.state,
        "current_step_name": workflow.current_step_name,
        "next_step_name": workflow.next_step_name,
        "transitioned_at": workflow.transitioned_at,
    }
    plan = outcomes.for_completion()
    check_step_transition(execution.state, plan.state)
    done = {**outcomes.ended_columns(plan, now), "updated_at": now}
    if prepared.result is not None:
        done["result_json"] = prepared.result  # written once, with the completion
    completer = writer.completer_for(session.get_bind().dialect)
    handover = None
    holds = prepared.holds  # a slot to free in this transaction: it must not commit early
    if after.step is None and then_claim is not None:
        handover = chaining.hand_over(
            session, completer, prepared, after, as_started, done, then_claim, options, config, now
        )
    if handover is not None:
        wrote_workflow, wrote_execution = handover.wrote_workflow, handover.wrote_execution
        created, passed = None, handover.passed  # passed on to the step it started
    else:
        # A step started directly is all that follows the completion in this transaction
        # (nothing of the application's runs for it, see chaining._started_directly): the
        # completion may commit as it is written — also when it passes the slot on in the
        # same statement (it frees none: nothing to wake).
        passes = holds is not None and after.inherits
        wrote_workflow, wrote_execution, created, passed = completer.complete(
            session,
            workflow,
            after.navigation,
            as_started,
            execution,
            done,
            after.row,
            alone=after.direct and (holds is None or passes),
            pass_slot=(workflow.id, now) if passes else None,
        )
    if not wrote_workflow:
        return False, None
    if not after.direct and handover is None:  # no lock left to remember if it ran alone
        queries.remember_workflow_lock(session, workflow.id, workflow)
    if not wrote_execution:
        # Someone took the row from us (lease recovery): our run is the duplicate.
        _discard_duplicate(workflow, execution, "no longer in progress under this run's lease")
        session.rollback()
        return True, None
    writer.record_clean_resolution(session, execution)
    if holds is not None and after.inherits and created is not None:
        if not passed:  # the completion could not pass it on in its own statement
            limits.pass_on(session, execution.id, created, workflow.id, now)
    elif holds is not None and not passed:
        limits.release(session, execution.id, holds, now)
    chained = None
    if created is not None and after.step is not None:
        chained = chaining.hand_on(session, workflow, created, after, options, now)
        if chained is not None and after.inherits:
            chained.holds = holds
    elif handover is not None:
        chained = chaining.claimed_directly(handover)
        if chained is None and handover.claimed and not handover.committed:
            assert then_claim is not None  # a handover claims within it
            # It claimed a step it could not start, and this transaction still holds the
            # lock: the claim finds that row again first, and phase 1 runs on it here.
            chained = chaining.claim_next(session, then_claim, options, config, now)
    elif after.step is None and then_claim is not None:
        chained = chaining.claim_next(session, then_claim, options, config, now)
    payload["workflow_state"] = workflow.state
    payload["step_state"] = execution.state
    session.commit()
    return True, chained


def _discard_duplicate(workflow: Workflow, execution: StepExecution, found: str) -> None:
    """The guarded writer refused this run's hand-back: the row is not ours any more."""
    events.execution_logger(workflow, execution).warning(
        "execution is %s: its lease ran out while this run was going on and another worker "
        "recovered it, so the step runs (or ran) again there — its body ran twice, once here "
        "and once there; discarding this run's work (its writes are rolled back). A lease "
        "that runs out under a live step means late heartbeats: see the worker's lease "
        "renewal warnings",
        found,
    )


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

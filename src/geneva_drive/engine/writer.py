"""The one writer of execution, workflow and signal state: it applies the plans of ``outcomes``.

Every change of an execution's, a workflow's or an attached signal's ``state`` goes through
here — ending an execution by a :class:`~geneva_drive.outcomes.Plan`, starting, parking and
waking one, moving a workflow, claiming and consuming a signal, disarming a timer — each
execution and workflow change checked against the transition tables in ``states``.
Callers hold the workflow row lock (see ``queries``); this module takes no locks of its own.

Two implementations sit behind the completion of a plain successful step, the hottest write
of all (:class:`Completer`): the portable one (two guarded UPDATEs and an INSERT) and
PostgreSQL's, which sends the same guarded writes as one statement. The dialect picks one
once (:func:`completer_for`); the executor never asks which database it is on.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy.orm import Session

from geneva_drive.core import text
from geneva_drive.core.errors import StepNotDefinedError
from geneva_drive.core.settings import settings_of
from geneva_drive.core.states import (
    ACTIVE_EXECUTION_STATES,
    TERMINAL_WORKFLOW_STATES,
    ExecutionState,
    Outcome,
    WorkflowState,
    check_step_transition,
    check_workflow_transition,
)
from geneva_drive.definition.workflow import Workflow, as_workflow
from geneva_drive.engine import compensation, scheduling, state_log
from geneva_drive.engine.outcomes import (
    ErrorRecord,
    Next,
    Plan,
    Settle,
    ended_columns,
    for_disarmed_timer,
    for_operator_cancel,
    moved_columns,
)
from geneva_drive.engine.wakeups import enqueue_after_commit, enqueued_step
from geneva_drive.storage import queries
from geneva_drive.storage.dialects import dialect_named
from geneva_drive.storage.limits import MAX_ERROR_CLASS
from geneva_drive.storage.models import Signal, StepExecution
from geneva_drive.storage.queries import children as children_q
from geneva_drive.storage.queries.signals import TIMER_KEY

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect

    from geneva_drive.definition.steps import StepDefinition


# -- executions ------------------------------------------------------------------------------


def end(
    execution: StepExecution,
    plan: Plan,
    now: datetime,
    *,
    error: BaseException | None = None,
) -> None:
    """End ``execution`` as ``plan`` says, on the loaded instance (flushed with the session)."""
    check_step_transition(execution.state, plan.state)
    for key, value in ended_columns(plan, now).items():
        setattr(execution, key, value)
    if plan.reason is not None:
        execution.write_metadata("reattempt_reason", plan.reason)
    if plan.rewind:
        execution.cursor = None
    if error is not None and plan.error is not ErrorRecord.NONE:
        info = exception_info(error)
        execution.write_metadata("exception", info)
        if plan.error is ErrorRecord.COLUMNS:
            execution.error_class_name = info["class"]
            execution.error_message = info["message"]
            execution.error_backtrace = text.sanitised("".join(traceback.format_exception(error)))


def start(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition,
    now: datetime,
    started: dict[str, Any],
) -> None:
    """``scheduled → in_progress`` and the workflow ``performing``, under phase 1's locks."""
    check_step_transition(execution.state, ExecutionState.IN_PROGRESS)
    check_workflow_transition(workflow.state, WorkflowState.PERFORMING)
    performing: dict[str, Any] = {
        **moved_columns(workflow.state, WorkflowState.PERFORMING, now, current_step=step_def.name),
        "updated_at": now,
    }
    if workflow.started_at is None:
        performing["started_at"] = now
    queries.start_both(session, execution, {**started, "updated_at": now}, workflow, performing)


def park(
    execution: StepExecution,
    now: datetime,
    *,
    awaiting: str | None = None,
    deadline: datetime | None = None,
) -> None:
    """``scheduled → waiting``: the step waits for signal ``awaiting``, until ``deadline``.

    The name and deadline are stored on the row so an operator can ask what waits for what
    (``geneva_drive.admin``) without the workflow's code.
    """
    check_step_transition(execution.state, ExecutionState.WAITING)
    execution.state = ExecutionState.WAITING
    execution.waiting_since = now
    execution.awaiting_signal = awaiting
    execution.wait_deadline = deadline


def wake(execution: StepExecution, signal_id: int, now: datetime) -> None:
    """``waiting → scheduled`` with the signal attached, due now.

    Due now rather than whenever: a lost wake-up is then an overdue row, which is recovered.
    """
    check_step_transition(execution.state, ExecutionState.SCHEDULED)
    for key, value in woken_columns(signal_id, now).items():
        setattr(execution, key, value)


def woken_columns(signal_id: int, now: datetime) -> dict[str, Any]:
    """What :func:`wake` writes (``queries.signals.delivery`` writes the same
    in SQL)."""
    return {
        "signal_id": signal_id,
        "state": ExecutionState.SCHEDULED,
        "scheduled_for": now,
        "waiting_since": None,
    }


# -- workflows -------------------------------------------------------------------------------


def move(workflow: Workflow, state: WorkflowState, now: datetime, *, guarded: bool = True) -> None:
    """Move the workflow to ``state``; paused, finished and canceled stamp ``transitioned_at``.

    ``guarded=False`` is for operator verbs, which check the state themselves and may act on
    a paused workflow; the executor's moves are held to the transition table. A workflow
    that ends tells its parent, and a canceled one cancels its children (:func:`_ended`).
    """
    if guarded:
        check_workflow_transition(workflow.state, state)
    ends = state in TERMINAL_WORKFLOW_STATES and workflow.state not in TERMINAL_WORKFLOW_STATES
    for key, value in moved_columns(workflow.state, state, now).items():
        setattr(workflow, key, value)
    if ends:
        _ended(workflow, state, now)


def cancel_now(
    session: Session, workflow: Workflow, now: datetime, *, by_operator: bool = False
) -> None:
    """Cancel an ongoing workflow (lock held), compensating first (:func:`cancel`): its
    scheduled or waiting execution ends canceled; an in-progress one belongs to its worker,
    whose phase 3 sees "canceled" — or, when the class has compensations, a pending cancel
    (the running step's result may add one; ``engine.compensation``). A workflow being
    canceled already is left to its compensations. ``by_operator``: a verb's cancel, logged
    as such when no plan logs it."""
    current = queries.current_execution(session, workflow.id)
    running = current is not None and current.state == ExecutionState.IN_PROGRESS
    if compensation.compensating(workflow) or (running and compensation.cancel_pending(workflow)):
        return  # it is being canceled already: its compensations run on, each once
    if current is not None and not running:
        apply(session, workflow, current, for_operator_cancel(), now, guarded=False)
        return
    if running and compensation.has_compensations(workflow):
        # Paused with the cancel pending: its phase 3 keeps the result and starts them.
        move(workflow, WorkflowState.PAUSED, now, guarded=False)
        compensation.set_pending(workflow, True)
    elif running:
        move(workflow, WorkflowState.CANCELED, now, guarded=False)
    else:
        cancel(session, workflow, now, guarded=False)
    if by_operator and workflow.state == WorkflowState.CANCELED:
        state_log.by_operator(session, workflow, WorkflowState.CANCELED)


def advance(
    session: Session, workflow: Workflow, after: str | None, now: datetime
) -> StepExecution | None:
    """Schedule the step after ``after`` in positional order, or finish the workflow.

    After a compensation (an operator skipped it), the next compensation, or canceled.
    """
    if compensation.is_compensation(workflow, after):
        compensation.mark_done(workflow)
        return cancel(session, workflow, now, guarded=False)
    following = type(workflow).steps.next_after(after)
    if following is None:
        move(workflow, WorkflowState.FINISHED, now, guarded=False)
        return None
    return scheduling.create_step_execution(
        session, workflow, following, now, wait=following.delay(now)
    )


def defer(session: Session, workflow: Workflow, execution: StepExecution, until: datetime) -> None:
    """Leave a scheduled ``execution`` scheduled, due at ``until`` (its ``wait_until``), and
    hand it to the backend again for then (a queue that delivered it now won't again)."""
    execution.scheduled_for = until
    session.flush()
    enqueue_after_commit(session, enqueued_step(workflow, execution))


def cancel(
    session: Session,
    workflow: Workflow,
    now: datetime,
    *,
    guarded: bool = True,
    keep_paused: bool = False,
) -> StepExecution | None:
    """Cancel the workflow, compensating first (``engine.compensation``): cancel its ongoing
    children and schedule the next compensation it owes — the workflow ``ready`` at it
    (``keep_paused``: left paused, for ``resume()``) — or, when none is owed, end it
    ``canceled`` (which cancels the children, :func:`_ended`)."""
    workflow.current_step_name = None
    if compensation.cancel_pending(workflow):
        compensation.set_pending(workflow, False)
    owed = compensation.next_owed(session, workflow)
    if owed is None:
        move(workflow, WorkflowState.CANCELED, now, guarded=guarded)
        return None
    # Its children first, as a cancel without compensations does (_ended): they were started
    # after what the compensations undo, and may run compensations of their own.
    cancel_children(session, workflow, now)
    step, definition = owed
    compensation.begin(workflow, step)
    if not (keep_paused and workflow.state == WorkflowState.PAUSED):
        move(workflow, WorkflowState.READY, now, guarded=guarded)
    execution = scheduling.create_step_execution(session, workflow, definition, now)
    compensation.label(execution, step)
    return execution


def _after_compensation(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    plan: Plan,
    now: datetime,
    guarded: bool,
) -> tuple[bool, StepExecution | None]:
    """(decided here, what was scheduled) after a compensation's execution; not decided
    here: what follows any step's (a reattempt, a failure, a pause)."""
    if plan.workflow is WorkflowState.CANCELED:  # canceled from within: abandon the rest
        compensation.abandon(workflow)
        workflow.current_step_name = None
        move(workflow, WorkflowState.CANCELED, now, guarded=guarded)
        return True, None
    if plan.next is Next.FOLLOWING or plan.workflow is WorkflowState.FINISHED:
        compensation.mark_done(workflow)
        paused = plan.workflow is None and workflow.state == WorkflowState.PAUSED
        return True, cancel(session, workflow, now, guarded=guarded, keep_paused=paused)
    return False, None


def begin(session: Session, workflow: Workflow, now: datetime) -> StepExecution | None:
    """Schedule a new workflow's first step in *positional* order (the gem's H-2), or finish."""
    return advance(session, workflow, None, now)


# -- applying a plan -------------------------------------------------------------------------


def apply(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    plan: Plan,
    now: datetime,
    *,
    error: BaseException | None = None,
    guarded: bool = True,
) -> StepExecution | None:
    """End ``execution`` and move the workflow on as ``plan`` says; returns what was scheduled.

    The workflow row lock is held by the caller. The execution ends first and is flushed
    before anything new is inserted, so the one-active index always admits the next row.
    """
    was = workflow.state
    if execution.state == ExecutionState.WAITING:
        cancel_timeout(session, execution, now)  # its timer goes with it
    end(execution, plan, now, error=error)
    if plan.settle is Settle.CONSUME:
        record_clean_resolution(session, execution)
    elif plan.settle is Settle.SKIPPED:
        settle_signal_for_skipped(session, execution)
    if compensation.is_compensation(workflow, execution.step_name):
        decided, scheduled = _after_compensation(session, workflow, execution, plan, now, guarded)
        if decided:
            state_log.planned(session, workflow, execution, plan, was, error)
            return scheduled
    elif plan.workflow is WorkflowState.CANCELED and compensation.has_compensations(workflow):
        scheduled = cancel(session, workflow, now, guarded=guarded)  # compensations first
        state_log.planned(session, workflow, execution, plan, was, error)
        return scheduled
    if plan.workflow is not None:
        move(workflow, plan.workflow, now, guarded=guarded)
    state_log.planned(session, workflow, execution, plan, was, error)
    workflow.current_step_name = None
    if plan.next is Next.NOTHING:
        return None
    return _schedule(session, workflow, execution, plan, now)


def _schedule(
    session: Session, workflow: Workflow, execution: StepExecution, plan: Plan, now: datetime
) -> StepExecution | None:
    steps = type(workflow).steps
    if plan.next is Next.SUCCESSOR:
        return scheduling.create_successor_execution(
            session, workflow, execution, now, wait=plan.wait, rewind=plan.rewind
        )
    if plan.next is Next.AGAIN:
        return scheduling.create_step_execution(
            session, workflow, _defined(workflow, execution.step_name), now, wait=plan.wait
        )
    target = steps.named(plan.goto) if plan.next is Next.GOTO else None
    if target is None or target.removed:
        if plan.next is Next.GOTO:  # validated at class definition: only a stale stored name
            workflow.logger.warning(
                "on_timeout step %r is gone; going to the step after %r instead",
                plan.goto,
                execution.step_name,
            )
        target = steps.next_after(execution.step_name)
    if target is None:
        move(workflow, WorkflowState.FINISHED, now, guarded=False)
        return None
    return scheduling.create_step_execution(session, workflow, target, now, wait=target.delay(now))


def _defined(workflow: Workflow, name: str) -> StepDefinition:
    step_def = type(workflow).steps.named(name)
    if step_def is None:
        raise StepNotDefinedError.for_step(workflow, name, doing="reattempt")
    return step_def


# -- the completion of a plain successful step (the hot path) --------------------------------


class Completer:
    """Writes a successful step's completion with the workflow's next navigation.

    ``navigation`` is written to the workflow only while it still holds ``as_started`` (nobody
    changed it since phase 1), ``done`` to the execution only while it is still in progress,
    and ``following`` (a new execution's row) is inserted only if both were written. Returns
    (workflow written, execution written, the inserted execution).

    ``alone``: the caller writes nothing more in this transaction, so the completion may be
    committed as it is written, where the database can do that atomically (PostgreSQL).

    ``hands_over``: whether :meth:`finish_and_start_next` can ever do its work here (the
    caller need not prepare its arguments otherwise).
    """

    hands_over: ClassVar[bool] = False

    def complete(
        self,
        session: Session,
        workflow: Workflow,
        navigation: dict[str, Any],
        as_started: dict[str, Any],
        execution: StepExecution,
        done: dict[str, Any],
        following: dict[str, Any] | None,
        *,
        alone: bool = False,
        pass_slot: tuple[int, datetime] | None = None,
    ) -> tuple[bool, bool, StepExecution | None, bool]:
        """(workflow written, execution written, the following execution inserted, the
        concurrency slot passed on to it). ``pass_slot``: (workflow id, now) when the slot
        ``execution`` holds may pass to ``following`` in the same write; where it is not
        (False), the caller passes it (``limits.pass_on``)."""
        wrote_workflow = queries.write_through(session, workflow, navigation, expect=as_started)
        wrote_execution = wrote_workflow and queries.write_through(
            session, execution, done, expect={"state": ExecutionState.IN_PROGRESS}
        )
        created = None
        if wrote_execution and following is not None:
            created = queries.insert_execution(session, following)
        return wrote_workflow, wrote_execution, created, False

    def finish_and_start_next(
        self,
        session: Session,
        workflow: Workflow,
        navigation: dict[str, Any],
        as_started: dict[str, Any],
        execution: StepExecution,
        done: dict[str, Any],
        claim: queries.NextClaim,
    ) -> queries.Handover | None:
        """The completion of a workflow's last step, the claim of the next due execution and,
        for a step of ``claim.direct``, its start, in one statement that may commit as it is
        written (``claim.alone``, ``queries.handover``). None, having written nothing, where
        that cannot be done (``hands_over`` is false): the caller completes and claims as
        usual."""
        return None


class OneStatementCompleter(Completer):
    """PostgreSQL: the same three guarded writes as one statement (data-modifying CTEs).

    Taken when nothing else must happen in between: no signal to settle, nothing pending on
    the execution, and the next row inserted already started or none at all (a scheduled
    next row needs a wake-up sent after commit, which the portable path arranges).
    """

    hands_over = True

    def complete(
        self,
        session: Session,
        workflow: Workflow,
        navigation: dict[str, Any],
        as_started: dict[str, Any],
        execution: StepExecution,
        done: dict[str, Any],
        following: dict[str, Any] | None,
        *,
        alone: bool = False,
        pass_slot: tuple[int, datetime] | None = None,
    ) -> tuple[bool, bool, StepExecution | None, bool]:
        started_or_none = following is None or following.get("state") == ExecutionState.IN_PROGRESS
        if (
            not started_or_none
            or execution.signal_id is not None
            or session.is_modified(execution, include_collections=False)
        ):
            return super().complete(
                session, workflow, navigation, as_started, execution, done, following
            )
        return queries.complete_in_one_statement(
            session,
            workflow,
            navigation,
            as_started,
            execution,
            done,
            following,
            alone=alone,
            pass_slot=pass_slot,
        )

    def finish_and_start_next(
        self,
        session: Session,
        workflow: Workflow,
        navigation: dict[str, Any],
        as_started: dict[str, Any],
        execution: StepExecution,
        done: dict[str, Any],
        claim: queries.NextClaim,
    ) -> queries.Handover | None:
        if execution.signal_id is not None or session.is_modified(
            execution, include_collections=False
        ):
            return None
        check_step_transition(ExecutionState.SCHEDULED, ExecutionState.IN_PROGRESS)
        check_workflow_transition(WorkflowState.READY, WorkflowState.PERFORMING)
        started = {**claim.started, "updated_at": claim.now}  # as start() writes it
        return queries.finish_and_start_next(
            session,
            workflow,
            navigation,
            as_started,
            execution,
            done,
            dataclasses.replace(claim, started=started),
        )


_ONE_STATEMENT, _PORTABLE = OneStatementCompleter(), Completer()


def completer_for(dialect: Dialect) -> Completer:
    """The completion strategy for SQLAlchemy's ``dialect``: one statement where the
    database combines writes (data-modifying CTEs), the portable path elsewhere."""
    return _ONE_STATEMENT if dialect_named(dialect.name).combined_writes else _PORTABLE


# -- signals: how an attached signal settles -------------------------------------------------

PENDING, CLAIMED, CONSUMED = "pending", "claimed", "consumed"


def claim_signal(signal: Signal, now: datetime) -> None:
    """One more execution attached; the first claim flips ``pending → claimed``."""
    signal.claimed = (signal.claimed or 0) + 1
    if signal.state == PENDING:
        signal.state = CLAIMED
        signal.claimed_at = now


def record_clean_resolution(
    session: Session, execution: StepExecution, resolved_step_names: Sequence[str] = ()
) -> None:
    """One attached chain ended cleanly; consume the signal once every chain has."""
    if execution.signal_id is None:
        return
    signal = session.get(Signal, execution.signal_id, populate_existing=True)
    if signal is None:
        return
    signal.consumed = (signal.consumed or 0) + 1
    if signal.state == CLAIMED and fully_resolved(session, signal, resolved_step_names):
        signal.state = CONSUMED
        signal.consumed_at = settings_of(session).clock.now()


def fully_resolved(
    session: Session, signal: Signal, resolved_step_names: Sequence[str] = ()
) -> bool:
    """Every chain attached to ``signal`` ended, and each step's newest row succeeded or skipped.

    Executions of ``resolved_step_names`` are ignored (a skip decision resolves its step). No
    attached execution at all counts as resolved.
    """
    session.flush()
    attached = queries.executions_attached_to(session, signal.id)
    newest: dict[str, StepExecution] = {}
    for execution in attached:
        if execution.step_name in resolved_step_names:
            continue
        if execution.state in ACTIVE_EXECUTION_STATES:
            return False
        newest[execution.step_name] = execution
    return all(e.outcome in (Outcome.SUCCESS, Outcome.SKIPPED) for e in newest.values())


def settle_signal_for_skipped(session: Session, execution: StepExecution) -> None:
    """A deliberately skipped execution settles its claimed signal (a skip is a decision).

    An execution that never attached settles nothing: buffered signals stay pending.
    """
    if execution.signal_id is None:
        return
    signal = session.get(Signal, execution.signal_id, populate_existing=True)
    if signal is not None and signal.state == CLAIMED:
        record_clean_resolution(session, execution, [execution.step_name])


def armed_timer_of(session: Session, parked: StepExecution) -> StepExecution | None:
    timer_id = parked.read_metadata(TIMER_KEY)
    if timer_id is None:
        return None
    timer = queries.lock_execution(session, int(timer_id))
    if timer is None or timer.state != ExecutionState.SCHEDULED:
        return None
    return timer


def cancel_timeout(session: Session, parked: StepExecution, now: datetime) -> None:
    """The parked execution is leaving ``waiting``: its timer will not be needed (lock held)."""
    timer = armed_timer_of(session, parked)
    if timer is not None:
        end(timer, for_disarmed_timer(), now)
        session.flush()


# -- children: an ending reaches the parent, a cancel the children ----------------------------


def _ended(workflow: Workflow, state: WorkflowState, now: datetime) -> None:
    """``workflow`` has just ended (its lock held): cancel its ongoing children if it was
    canceled, then count it on its parent and wake the parent's fan-in step if enough
    children have ended — in this transaction, so it happens exactly when the end commits."""
    if workflow.children_started == 0 and workflow.parent_id is None:
        return  # neither parent nor child: the usual case costs nothing
    session = workflow.session
    # Out before anything reads it back: a child's end re-reads its parent (this row).
    session.flush()
    if state == WorkflowState.CANCELED:
        cancel_children(session, workflow, now)
    if workflow.parent_id is not None:
        _count_on_parent(session, workflow, state, now)


def cancel_children(session: Session, parent: Workflow, now: datetime) -> None:
    """Cancel every ongoing child of a canceled parent, each under its own lock (unless its
    class says ``cancel_children = False``).

    Lock order: a child's end locks the child, then its parent; this locks the parent, then
    each child. Where both meet, the database breaks the deadlock and the loser runs again
    (a step's transient error). ``operations.cancel_workflow`` avoids it for the operator's
    cancel by locking the descendants before the parent.
    """
    if not type(parent).cancel_children or not parent.children_started:
        return
    for child_id in children_q.ongoing_child_ids(session, parent.id):
        child = as_workflow(queries.lock_workflow(session, child_id))
        if child is None or child.state in TERMINAL_WORKFLOW_STATES:
            continue
        child.logger.info("canceled with its parent %s id=%s", type(parent).__name__, parent.id)
        cancel_now(session, child, now)


def _count_on_parent(
    session: Session, child: Workflow, state: WorkflowState, now: datetime
) -> None:
    """One more child of the parent ended: one UPDATE of the parent's counters, whatever the
    number of children. Then, only if a fan-in step of the parent's class may now run (or
    this child was canceled), wake its parked step.

    The UPDATE holds the parent's row lock until commit, as the gate does while it reads the
    counters and parks: whichever comes second sees the other's write. A paused parent is
    counted but not woken; ``resume()`` looks again (``children.rendezvous``), as it does for
    a signal buffered while paused.
    """
    parent_id = child.parent_id
    assert parent_id is not None
    row = children_q.count_child_end(session, parent_id, failed=state == WorkflowState.CANCELED)
    if row is None or row.state not in (WorkflowState.READY, WorkflowState.PERFORMING):
        return  # the parent row is gone (housekeeping), or it is paused or ended
    mapper = Workflow.__mapper__.polymorphic_map.get(row.type)
    fan_ins = [d for d in mapper.class_.steps if d.waits_for_children] if mapper else []
    if not row.children_failed and not any(
        d.children_ready(row.children_started, row.children_ended) for d in fan_ins
    ):
        return  # nothing can run yet: the usual child end stops here
    parent = as_workflow(queries.lock_workflow(session, parent_id))
    if parent is not None:
        wake_fan_in(session, parent, now)


def wake_fan_in(session: Session, parent: Workflow, now: datetime) -> list[StepExecution]:
    """Wake the parent's parked fan-in step if its children allow it to run (lock held)."""
    woken = []
    for execution in queries.parked_executions(session, parent.id):
        step_def = type(parent).steps.named(execution.step_name)
        if step_def is None or not step_def.waits_for_children:
            continue
        failed = bool(parent.children_failed)
        if not failed and not step_def.children_ready(
            parent.children_started, parent.children_ended
        ):
            continue
        wake_parked(session, parent, execution, now)
        parent.logger.info(
            "step %r woken: %s of %s children ended%s (execution %s)",
            execution.step_name,
            parent.children_ended,
            parent.children_started,
            ", one canceled" if failed else "",
            execution.id,
        )
        woken.append(execution)
    return woken


def wake_parked(
    session: Session, workflow: Workflow, execution: StepExecution, now: datetime
) -> None:
    """``waiting → scheduled``, due now, for a parked row that no signal wakes (a fan-in step,
    or its ``children_timeout`` timer firing); its timer is disarmed first, so the one-active
    index admits it. Handed to a worker after commit."""
    cancel_timeout(session, execution, now)
    check_step_transition(execution.state, ExecutionState.SCHEDULED)
    execution.state = ExecutionState.SCHEDULED
    execution.scheduled_for = now
    execution.waiting_since = None
    session.flush()
    enqueue_after_commit(session, enqueued_step(workflow, execution))


# -- errors as stored ------------------------------------------------------------------------


def exception_info(error: BaseException) -> dict[str, Any]:
    """A step's error as stored: its class, message and last backtrace lines, each sanitised
    (``core.text``: a NUL or lone surrogate is escaped, never refused — the step must still
    end) and the class name cut to its column."""
    return {
        "class": text.sanitised(qualified_name(error), limit=MAX_ERROR_CLASS),
        "message": text.message_of(error),
        "backtrace": [text.sanitised(line) for line in traceback.format_exception(error)[-20:]],
    }


def qualified_name(error: BaseException) -> str:
    cls = type(error)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def lease_columns(now: datetime, worker_id: str | None, lease: timedelta | None) -> dict[str, Any]:
    """An execution's columns as phase 1 leaves them when it starts the step."""
    # Written even without a lease: on a scheduled row the Celery dispatcher keeps its resend
    # time in lease_expires_at, which must not survive as the lease of a run that holds none.
    return {
        "state": ExecutionState.IN_PROGRESS,
        "started_at": now,
        "lease_owner": worker_id,
        "lease_expires_at": None if worker_id is None else now + (lease or timedelta(seconds=30)),
    }

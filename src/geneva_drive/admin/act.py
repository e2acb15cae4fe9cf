"""Operator actions by id and in bulk: each through the engine's verbs, each recorded.

Every action runs in a savepoint of the caller's transaction: it takes the workflow row lock
(``queries.lock_workflow``, which also reloads the row, so the state checked is the state
under the lock), decides with :func:`refusal` whether the state allows it, acts through the
verbs of ``operations``/``signals`` or the writer, and appends an operator-action row. A
refusal raises :class:`AdminRefused` and rolls the savepoint back: the database is as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from geneva_drive.admin.filters import WorkflowFilter
from geneva_drive.admin.find import find
from geneva_drive.core import text
from geneva_drive.core.errors import (
    AdminInputError,
    AdminNotFound,
    AdminRefused,
    InvalidStateError,
    PayloadTooLargeError,
    SerializationError,
    StepNotDefinedError,
    UnstorableTextError,
    WorkflowNotOngoing,
)
from geneva_drive.core.settings import settings
from geneva_drive.core.states import ExecutionState, WorkflowState
from geneva_drive.definition.matchers import unknown_signal
from geneva_drive.definition.until import checked_until, delay_until
from geneva_drive.definition.workflow import Workflow, as_workflow
from geneva_drive.engine import compensation, operations, outcomes, scheduling, signals, writer
from geneva_drive.engine.outcomes import Next
from geneva_drive.engine.wakeups import enqueue_after_commit, enqueued_step
from geneva_drive.storage import queries
from geneva_drive.storage.models import StepExecution
from geneva_drive.storage.queries import admin as q

if TYPE_CHECKING:
    from geneva_drive.definition.workflow import Workflow

ACTIONS = ("pause", "resume", "skip", "cancel", "retry", "resume_at", "signal")
MAX_ACTOR = 255

_READY, _PERFORMING, _PAUSED = WorkflowState.READY, WorkflowState.PERFORMING, WorkflowState.PAUSED
_ENDED = frozenset({WorkflowState.FINISHED, WorkflowState.CANCELED})
# Which workflow states each action accepts, and how to say it.
ALLOWED: dict[str, tuple[frozenset[str], str]] = {
    "pause": (frozenset({_READY, _PERFORMING}), "ready or performing"),
    "resume": (frozenset({_PAUSED}), "paused"),
    "skip": (frozenset({_READY, _PAUSED}), "ready or paused (pause a performing one first)"),
    "cancel": (frozenset({_READY, _PERFORMING, _PAUSED}), "ready, performing or paused"),
    "retry": (frozenset({_READY, _PAUSED}), "ready with a scheduled step, or paused"),
    "resume_at": (frozenset({_READY, _PAUSED}), "ready or paused (pause a performing one first)"),
    "signal": (frozenset({_READY, _PERFORMING, _PAUSED}), "ongoing (ready, performing, paused)"),
}


def actions_for(states: Iterable[str]) -> tuple[str, ...]:
    """The actions that a workflow in one of ``states`` may accept, in :data:`ACTIONS` order
    (pure; what a page offers — :func:`refusal` still has the last word per workflow)."""
    wanted = set(states)
    return tuple(action for action in ACTIONS if ALLOWED[action][0] & wanted)


@dataclass(frozen=True)
class ActionResult:
    workflow_id: int
    action: str
    state_before: str
    state_after: str
    detail: str
    step_before: str | None = None  # the step it stood at: its current step, else its next
    step_after: str | None = None

    @property
    def change(self) -> str:
        """What the action changed, in words (see :func:`describe_change`)."""
        return describe_change(
            self.state_before, self.state_after, self.step_before, self.step_after
        )


def describe_change(
    state_before: str, state_after: str, step_before: str | None, step_after: str | None
) -> str:
    """``paused → ready``; ``at capture → at ship`` when only the step moved (a skip of a ready
    workflow); ``paused at charge → ready at ship`` when both did; ``ready`` when neither."""
    same_state = state_before == state_after
    if step_before == step_after:
        return state_before if same_state else f"{state_before} → {state_after}"

    def side(state: str, step: str | None) -> str:
        if same_state:
            return f"at {step}" if step else "at no step"
        return f"{state} at {step}" if step else state

    return f"{side(state_before, step_before)} → {side(state_after, step_after)}"


@dataclass(frozen=True)
class BulkResult:
    matched: int
    changed: tuple[int, ...]
    refused: tuple[tuple[int, str], ...]  # (workflow id, why)
    dry_run: bool = False
    # Finished or canceled workflows the filter matched: no action applies to them, so they
    # are counted and left alone, not refused one by one.
    skipped: int = 0


# -- the decision ----------------------------------------------------------------------------


def refusal(
    action: str,
    label: str,
    state: str,
    current: tuple[str, str | None] | None,
) -> str | None:
    """Why ``action`` cannot be done to this workflow, or None if it can (pure).

    ``label``: ``"<Class> id=<id>"``; ``current``: (state, awaited signal) of its scheduled,
    waiting or running execution, if it has one.
    """
    allowed, wording = ALLOWED[action]
    if state not in allowed:
        return (
            f"{label}: cannot {action} a {state} workflow; {action} needs it to be {wording}"
            f"{_HINTS.get((action, state), '')}"
        )
    if action == "retry" and state == _READY:
        if current is None or current[0] == ExecutionState.IN_PROGRESS:
            return f"{label}: cannot retry: no step is scheduled (nothing to make due)"
        if current[0] == ExecutionState.WAITING:
            awaited = f"signal {current[1]!r}" if current[1] else "a signal"
            return (
                f"{label}: cannot retry a step that waits for {awaited}; send it with "
                "signal, or skip the step"
            )
    return None


_HINTS: dict[tuple[str, str], str] = {
    ("pause", _PAUSED): " (it is paused already; resume it to continue)",
    ("resume", _READY): " (it is not paused; nothing to resume)",
    ("resume", _PERFORMING): " (a step is running; nothing to resume)",
    ("retry", _PERFORMING): " (its step is running right now)",
}


# -- by id -----------------------------------------------------------------------------------


def pause(
    session: Session, workflow_id: int, *, actor: str, reason: str | None = None
) -> ActionResult:
    return _act(session, workflow_id, "pause", actor, reason, _verb(operations.pause_workflow))


def resume(
    session: Session, workflow_id: int, *, actor: str, reason: str | None = None
) -> ActionResult:
    return _act(session, workflow_id, "resume", actor, reason, _resume)


def skip(
    session: Session, workflow_id: int, *, actor: str, reason: str | None = None
) -> ActionResult:
    return _act(session, workflow_id, "skip", actor, reason, _verb(operations.skip_workflow))


def cancel(
    session: Session, workflow_id: int, *, actor: str, reason: str | None = None
) -> ActionResult:
    return _act(session, workflow_id, "cancel", actor, reason, _verb(operations.cancel_workflow))


def retry(
    session: Session, workflow_id: int, *, actor: str, reason: str | None = None
) -> ActionResult:
    """Make the scheduled step (or a paused workflow's step) due now."""
    return _act(session, workflow_id, "retry", actor, reason, _retry)


def resume_at(
    session: Session,
    workflow_id: int,
    step: str,
    *,
    wait_until: datetime | None = None,
    actor: str,
    reason: str | None = None,
) -> ActionResult:
    """Continue a paused or ready workflow at the named step, due now (or at ``wait_until``,
    an aware datetime; a time already passed is due now, as ``skip_to(wait_until=)``'s).

    The step it stood at ends ``skipped`` (a waiting one's timer is disarmed); a paused
    workflow's claimed signal is settled as a skip settles it. The way out when a deploy
    removed or renamed the step a workflow stands at.
    """
    if not isinstance(step, str) or not step:
        raise AdminInputError(f"resume_at(step={step!r}): expected a step name")
    until = None
    if wait_until is not None:
        try:
            until = checked_until(
                wait_until, f"resume_at(workflow id={workflow_id}, step={step!r})"
            )
        except ValueError as error:
            raise AdminInputError(str(error)) from None

    def act(session: Session, workflow: Workflow, now: datetime) -> tuple[str, int | None]:
        return _resume_at(session, workflow, step, now, until)

    args: dict[str, Any] = {"step": step}
    if until is not None:
        args["wait_until"] = until.isoformat()
    return _act(session, workflow_id, "resume_at", actor, reason, act, args)


def signal(
    session: Session,
    workflow_id: int,
    name: str,
    *,
    payload: Any = None,
    key: str | None = None,
    allow_unknown: bool = False,
    actor: str,
    reason: str | None = None,
) -> ActionResult:
    """Deliver signal ``name`` as the application would (``Workflow.signal``): a name no step
    of the class waits for is refused (``AdminInputError``) unless ``allow_unknown``."""

    def act(session: Session, workflow: Workflow, now: datetime) -> tuple[str, int | None]:
        try:
            delivered = signals.deliver_signal(
                workflow, name, payload=payload, idempotency_key=key, allow_unknown=allow_unknown
            )
        except (ValueError, SerializationError, PayloadTooLargeError) as error:
            raise AdminInputError(str(error)) from None
        if delivered.duplicate_delivery:
            return f"duplicate of signal id={delivered.id} (key {key!r}); nothing changed", None
        current = queries.current_execution(session, workflow.id)
        woke = current is not None and current.signal_id == delivered.id
        return (
            f"signal {name!r} delivered (id={delivered.id}){'; woke its step' if woke else ''}",
            (current.id if woke and current is not None else None),
        )

    return _act(session, workflow_id, "signal", actor, reason, act, {"signal": name, "key": key})


Act = Callable[[Session, "Workflow", datetime], tuple[str, int | None]]


def _act(
    session: Session,
    workflow_id: int,
    action: str,
    actor: str,
    reason: str | None,
    act: Act,
    args: dict[str, Any] | None = None,
) -> ActionResult:
    _check_actor(actor, reason)
    with session.begin_nested():  # a refusal rolls back this action and nothing else
        workflow = as_workflow(queries.lock_workflow(session, workflow_id))
        if workflow is None:
            raise AdminNotFound(f"no workflow with id={workflow_id}; nothing to {action}")
        before, step_before = workflow.state, _standing_at(workflow)
        label = f"{workflow.type} id={workflow.id}"
        current = _current(session, workflow, action)
        why = refusal(action, label, before, current)
        if why is not None:
            raise AdminRefused(why)
        now = settings().clock.now()
        try:
            detail, execution_id = act(session, workflow, now)
        except (InvalidStateError, StepNotDefinedError, WorkflowNotOngoing) as error:
            # The verb re-checked under the lock and refused (or the step is gone).
            raise AdminRefused(f"{label}: {action} refused: {error}") from error
        session.flush()
        after, step_after = workflow.state, _standing_at(workflow)
        q.record_action(
            session,
            {
                "workflow_id": workflow.id,
                "execution_id": execution_id,
                "action": action,
                "actor": actor,
                "reason": reason,
                "at": now,
                "detail": {
                    "state_before": before,
                    "state_after": after,
                    "step_before": step_before,
                    "step_after": step_after,
                    "detail": detail,
                }
                | ({k: v for k, v in args.items() if v is not None} if args else {}),
            },
        )
    return ActionResult(workflow_id, action, before, after, detail, step_before, step_after)


def _standing_at(workflow: Workflow) -> str | None:
    return workflow.current_step_name or workflow.next_step_name


def _current(session: Session, workflow: Workflow, action: str) -> tuple[str, str | None] | None:
    if action != "retry":  # the only decision that looks at the execution
        return None
    current = queries.current_execution(session, workflow.id)
    return None if current is None else (current.state, current.awaiting_signal)


def _check_actor(actor: str, reason: str | None) -> None:
    if not isinstance(actor, str) or not actor.strip() or len(actor) > MAX_ACTOR:
        raise AdminInputError(
            f"actor={actor!r}: expected who acts, a non-blank str of at most {MAX_ACTOR} "
            "characters (the CLI uses the OS user)"
        )
    if reason is not None and not isinstance(reason, str):
        raise AdminInputError(f"reason={reason!r}: expected a str or None")
    for field, value in (("actor", actor), ("reason", reason)):
        try:
            text.check(value or "", field)
        except UnstorableTextError as error:
            raise AdminInputError(str(error)) from None


def _verb(verb: Callable[[Workflow], Any]) -> Act:
    def act(session: Session, workflow: Workflow, now: datetime) -> tuple[str, int | None]:
        verb(workflow)
        current = queries.current_execution(session, workflow.id)
        return "", None if current is None else current.id  # the result's change says it all

    return act


def _resume(session: Session, workflow: Workflow, now: datetime) -> tuple[str, int | None]:
    execution = operations.resume_workflow(workflow)
    return _continues(execution), None if execution is None else execution.id


def _continues(execution: StepExecution | None) -> str:
    if execution is None:
        return "resumed"
    if execution.state == ExecutionState.WAITING:
        return f"resumed; step {execution.step_name!r} waits for {execution.awaiting_signal!r}"
    return f"resumed at step {execution.step_name!r}"


def _retry(session: Session, workflow: Workflow, now: datetime) -> tuple[str, int | None]:
    if workflow.state == WorkflowState.PAUSED:
        execution = operations.resume_workflow(workflow)
    else:
        execution = queries.current_execution(session, workflow.id)
    if execution is None or execution.state != ExecutionState.SCHEDULED:
        return _continues(execution), None if execution is None else execution.id
    due = execution.scheduled_for
    q.make_due(session, execution, now)
    # Handed to the backend again: its first wake-up carried the old due time (Celery's eta),
    # or was lost (an overdue row). A duplicate wake-up is harmless.
    enqueue_after_commit(session, enqueued_step(workflow, execution))
    return f"step {execution.step_name!r} due now (was due {due.isoformat()})", execution.id


def _unknown_step(workflow: Workflow, step: str) -> str | None:
    """Why ``workflow`` cannot continue at ``step`` (no such step, or a removed one), or None."""
    step_def = type(workflow).steps.named(step)
    if step_def is not None and not step_def.removed:
        return None
    runnable = ", ".join(d.name for d in type(workflow).steps.runnable() if d.name)
    return (
        f"{workflow.type} id={workflow.id}: resume_at({step!r}): {type(workflow).__name__} has "
        f"no such step{' (it is a removed_step)' if step_def is not None else ''}; use one "
        f"of: {runnable or 'none (is the workflow class imported?)'}"
    )


def _resume_at(
    session: Session, workflow: Workflow, step: str, now: datetime, until: datetime | None
) -> tuple[str, int | None]:
    label = f"{workflow.type} id={workflow.id}"
    operations.require_class(workflow, f"resume_at({step!r})")
    if compensation.compensating(workflow):
        undoing = workflow.read_metadata(compensation.STATE)["step"]
        raise AdminRefused(
            f"{label}: cannot resume_at({step!r}): the workflow is being canceled and runs its "
            f"compensations (now the one of step {undoing!r}); resume or skip that compensation"
        )
    unknown = _unknown_step(workflow, step)
    if unknown is not None:
        raise AdminInputError(unknown)
    step_def = type(workflow).steps.named(step)
    assert step_def is not None  # _unknown_step found it
    current = queries.current_execution(session, workflow.id)
    wait = delay_until(until, now)
    if current is not None and current.step_name == step:
        if wait is not None and until is not None and current.state == ExecutionState.SCHEDULED:
            return _due_at(session, workflow, current, until)
        if workflow.state == WorkflowState.PAUSED:
            return _resume(session, workflow, now)
        if current.state == ExecutionState.SCHEDULED:
            return _retry(session, workflow, now)
        raise AdminRefused(
            f"{label}: cannot resume_at({step!r}): it already stands at that step, waiting "
            f"for {current.awaiting_signal!r}; send the signal, or skip the step"
        )
    if current is not None:
        # Ends as an operator's skip does, but nothing follows: the named step does.
        moved = replace(outcomes.for_operator_skip(), next=Next.NOTHING)
        writer.apply(session, workflow, current, moved, now, guarded=False)
    else:
        if workflow.state == WorkflowState.PAUSED:
            signals.settle_for_skipped_paused(session, workflow)
        writer.move(workflow, WorkflowState.READY, now, guarded=False)
        workflow.current_step_name = None
    execution = scheduling.create_step_execution(session, workflow, step_def, now, wait=wait)
    left = f"left step {current.step_name!r} (execution {current.id}); " if current else ""
    due = "now" if until is None or wait is None else f"at {until.isoformat()}"
    return f"{left}step {step!r} due {due}", execution.id


def _due_at(
    session: Session, workflow: Workflow, execution: StepExecution, until: datetime
) -> tuple[str, int | None]:
    """The workflow stands at the named step, scheduled: it is due at ``until`` instead (a
    paused workflow is resumed first, with its execution as it was)."""
    if workflow.state == WorkflowState.PAUSED:
        resumed = operations.resume_workflow(workflow)
        execution = resumed if resumed is not None else execution
    due = execution.scheduled_for
    q.make_due(session, execution, until)
    enqueue_after_commit(session, enqueued_step(workflow, execution))
    return (
        f"step {execution.step_name!r} due at {until.isoformat()} (was due {due.isoformat()})",
        execution.id,
    )


# -- in bulk ---------------------------------------------------------------------------------

_BY_ID: dict[str, Callable[..., ActionResult]] = {
    "pause": pause,
    "resume": resume,
    "skip": skip,
    "cancel": cancel,
    "retry": retry,
    "resume_at": resume_at,
    "signal": signal,
}
_ARGS = {
    "resume_at": ({"step"}, {"step", "wait_until"}),
    "signal": ({"name"}, {"name", "payload", "key", "allow_unknown"}),
}


def bulk(
    bind: Engine | sessionmaker[Session],
    action: str,
    where: WorkflowFilter,
    *,
    actor: str,
    reason: str | None = None,
    batch_size: int = 500,
    dry_run: bool = False,
    **action_args: Any,
) -> BulkResult:
    """Do ``action`` to every workflow ``where`` selects, oldest first, in batches.

    Each batch is its own transaction (its row locks are held until it commits, so keep
    batches small where workers are busy); a refused workflow is listed with the reason and
    the rest go on. Finished and canceled workflows are skipped and counted (no action
    applies to them: a filter such as ``type=X`` matches the history too). ``dry_run``:
    decide only, from the state read now, and write nothing.
    """
    _check_bulk(action, batch_size, action_args)
    _check_actor(actor, reason)
    make_session = bind if isinstance(bind, sessionmaker) else sessionmaker(bind)
    matched, skipped, changed, refused = 0, 0, [], []
    cursor = None
    while True:
        with make_session() as session:
            page = find(session, where, newest_first=False, limit=batch_size, after=cursor)
            for item in page.items:
                matched += 1
                if item.state in _ENDED:
                    skipped += 1
                    continue
                why = _one(session, action, item.id, actor, reason, dry_run, action_args)
                if why is None:
                    changed.append(item.id)
                else:
                    refused.append((item.id, why))
            if not dry_run:
                session.commit()
        cursor = page.next_cursor
        if cursor is None:
            return BulkResult(matched, tuple(changed), tuple(refused), dry_run, skipped)


def _one(
    session: Session,
    action: str,
    workflow_id: int,
    actor: str,
    reason: str | None,
    dry_run: bool,
    args: dict[str, Any],
) -> str | None:
    """None if the action was done (or would be), else why not."""
    if dry_run:
        return _would_refuse(session, action, workflow_id, args)
    try:
        _BY_ID[action](session, workflow_id, actor=actor, reason=reason, **args)
    except (AdminRefused, AdminNotFound, AdminInputError) as error:
        return str(error)
    return None


def _would_refuse(
    session: Session, action: str, workflow_id: int, args: dict[str, Any]
) -> str | None:
    workflow = session.get(_workflow_model(), workflow_id, populate_existing=True)
    if workflow is None:
        return f"no workflow with id={workflow_id} any more"
    label = f"{workflow.type} id={workflow.id}"
    why = refusal(action, label, workflow.state, _current(session, workflow, action))
    if why is None and action == "resume_at":  # the step is the class's to know, per row
        return _unknown_step(workflow, args["step"])
    if why is None and action == "signal" and not args.get("allow_unknown"):
        return unknown_signal(type(workflow), label, args["name"])  # so is the signal name
    return why


def _workflow_model() -> type[Workflow]:
    return Workflow


def _check_bulk(action: str, batch_size: int, args: dict[str, Any]) -> None:
    if action not in ACTIONS:
        raise AdminInputError(f"bulk({action!r}): unknown action; use one of {', '.join(ACTIONS)}")
    if not isinstance(batch_size, int) or not 1 <= batch_size <= 1000:
        raise AdminInputError(f"bulk(batch_size={batch_size!r}): expected an int from 1 to 1000")
    required, accepted = _ARGS.get(action, (set(), set()))
    if not required <= set(args) or not set(args) <= accepted:
        wanted = ", ".join(sorted(accepted)) or "no arguments"
        raise AdminInputError(
            f"bulk({action!r}): got arguments {sorted(args)}; {action} takes {wanted}"
            f"{' (' + ', '.join(sorted(required)) + ' required)' if required else ''}"
        )

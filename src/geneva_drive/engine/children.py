"""Child workflows: ``start_child`` (fan-out) and the ``wait_for_children`` gate (fan-in).

A child is started in its parent's step, in the step's unit of work: it exists only if the
step commits. Its identity is its parent and its key (unique index over ``(parent_id,
child_key)``), so a step that runs again — a reattempt, a resumed cursor, a duplicate run —
gets the child it started before instead of a second one.

The fan-in meets a child's end at two points, both under the parent's row lock, so the order
of events never matters (as a signal's gate and dispatch do, ``signals``):

- the *gate* (parent): a ``wait_for_children`` step about to run reads the parent's counters
  and runs, raises :class:`ChildFailed`, or parks in ``waiting``;
- the *count* (child): a child that ends adds one to its parent's counters in its own ending
  transaction and wakes the parked step when enough have ended (``writer.wake_fan_in``).

The counters make both O(1) in the number of children: one row update per child started
(with the step's writes) and per child ended; nothing scans the children on the way.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.orm import Session

from geneva_drive.core import text
from geneva_drive.core.errors import ChildFailed, InvalidStateError
from geneva_drive.core.settings import settings_of
from geneva_drive.core.states import ExecutionState
from geneva_drive.definition.workflow import CHILD_KEYS, Workflow, as_workflow
from geneva_drive.engine import outcomes, signals, starting, writer
from geneva_drive.engine.wakeups import enqueue_after_commit, enqueued_step
from geneva_drive.storage import queries
from geneva_drive.storage.limits import MAX_STEP_NAME
from geneva_drive.storage.models import TIMEOUT_FOR
from geneva_drive.storage.queries import children as children_q

if TYPE_CHECKING:
    from geneva_drive.definition.steps import StepDefinition
    from geneva_drive.storage.models import StepExecution

W = TypeVar("W", bound=Workflow)
MAX_CHILD_KEY = MAX_STEP_NAME  # the column is a VARCHAR(255) like a step name


# -- fan-out -----------------------------------------------------------------------------------


def start_child(
    parent: Workflow,
    cls: type[W],
    *,
    key: str,
    hero: Any,
    allow_multiple: bool,
    input: Any = None,
) -> W:
    """``Workflow.start_child``: everything checked first (the input as ``create(input=)``
    checks it, its errors naming the parent's class and step), then the child (or the one
    this key already names) — nothing written when it refuses."""
    where = _where(parent, cls, key)
    if not parent._in_step:
        raise InvalidStateError(
            f"{where}: start_child() can only be called inside a running step of "
            f"{type(parent).__name__}, whose unit of work the child joins; outside a step, "
            f"start a workflow with {getattr(cls, '__name__', cls)}.create(session, ...)"
        )
    if not isinstance(cls, type) or not issubclass(cls, Workflow) or cls is Workflow:
        raise TypeError(f"{where}: the child class must be a subclass of Workflow, got {cls!r}")
    _check_key(where, key)
    used: set[str] = parent.__dict__.setdefault(CHILD_KEYS, set())
    if key in used:
        raise ValueError(
            f"{where}: key {key!r} was already given to a child in this run of the step; a "
            "key names one child of this workflow — give each child its own key (e.g. "
            "f'parcel-{parcel.id}')"
        )
    session = parent.session
    # Inserted first, looked for only when the unique index refuses it (a step run again):
    # a new child costs its inserts and nothing else.
    found: list[W] = []

    def started_before() -> W | None:
        child = _existing(session, parent, cls, key, where)
        found.extend([child] if child is not None else [])
        return child

    child = starting.create(
        cls,
        session,
        hero=hero,
        allow_multiple=allow_multiple,
        step_job_options=None,
        parent=(parent.id, key),
        find_child=started_before,
        input=input,
        input_of=f"{where}, input=...",
    )
    if not found:
        # Only the parent's own steps write this counter, one at a time: no lost update.
        parent.children_started = (parent.children_started or 0) + 1
    used.add(key)
    return child


def _where(parent: Workflow, cls: Any, key: Any) -> str:
    step = parent.current_step_name
    at = f".step {step!r}" if step else ""
    name = getattr(cls, "__name__", repr(cls))
    return f"{type(parent).__name__} id={parent.id}{at}: start_child({name}, key={key!r})"


def _check_key(where: str, key: Any) -> None:
    if not isinstance(key, str) or not key.strip() or len(key) > MAX_CHILD_KEY:
        raise ValueError(
            f"{where}: key= must be a non-blank str of at most {MAX_CHILD_KEY} characters "
            "naming the child among this workflow's children (e.g. f'parcel-{parcel.id}')"
        )
    text.check(key, f"{where}: key")


def _existing(session: Session, parent: Workflow, cls: type[W], key: str, where: str) -> W | None:
    found = as_workflow(children_q.find_child(session, parent.id, key))
    if found is None:
        return None
    if not isinstance(found, cls):
        raise ValueError(
            f"{where}: key {key!r} already names child {type(found).__name__} id={found.id} "
            f"of this workflow, not a {cls.__name__}; give the new child its own key"
        )
    return found


# -- fan-in: the gate --------------------------------------------------------------------------


def gate(
    session: Session, workflow: Workflow, execution: StepExecution, step_def: StepDefinition
) -> bool:
    """Whether a ``wait_for_children`` step runs now (phase 1, workflow lock held): True to
    run, False after parking it; :class:`ChildFailed` when a child was canceled, or has been
    paused for longer than the class's ``children_timeout``."""
    if workflow.children_failed:
        raise child_failed(session, workflow, step_def)
    if step_def.children_ready(workflow.children_started, workflow.children_ended):
        return True
    now: datetime = settings_of(session).clock.now()
    timeout = type(workflow)._children_timeout
    due = None
    if timeout is not None:
        # One indexed look at the parent's paused children, only while the step cannot run.
        paused = as_workflow(children_q.oldest_paused_child(session, workflow.id))
        since = paused.transitioned_at if paused is not None else None
        if paused is not None and since is not None and since + timeout <= now:
            raise child_paused(workflow, step_def, paused, since, timeout)
        due = since + timeout if since is not None else now + timeout
    writer.park(execution, now, awaiting=step_def.awaiting_children)
    if due is not None:
        signals.arm_timer(session, workflow, execution, step_def, due)
    workflow.logger.info(
        "step %r parked until its children end (%s of %s ended; wait_for_children=%r, "
        "execution %s)",
        execution.step_name,
        workflow.children_ended,
        workflow.children_started,
        step_def.wait_for_children,
        execution.id,
    )
    return False


def times_fan_in(workflow: Workflow, timer: StepExecution) -> bool:
    """Whether ``timer`` is a ``children_timeout`` timer (its step waits for children)."""
    step_def = type(workflow).steps.named(timer.step_name)
    return step_def is not None and step_def.waits_for_children


def fire_timeout(session: Session, workflow: Workflow, timer: StepExecution, now: datetime) -> None:
    """A ``children_timeout`` timer came due (phase 1, lock held): wake its parked step, whose
    gate then decides again — raise :class:`ChildFailed` for a child paused too long, run, or
    park again with a new timer. A timer whose parked row left ``waiting`` is disarmed."""
    parked = queries.lock_execution(session, int(timer.read_metadata(TIMEOUT_FOR)))
    if parked is None or parked.state != ExecutionState.WAITING:
        writer.end(timer, outcomes.for_disarmed_timer(), now)
        return
    writer.end(timer, outcomes.for_fired_timer(), now)
    session.flush()  # the timer leaves the one-active index before its parked row enters it
    writer.wake_parked(session, workflow, parked, now)


def rendezvous(session: Session, workflow: Workflow, execution: StepExecution) -> None:
    """On ``resume()``: wake a parked fan-in step whose children ended while it was paused;
    else hand its timer, which may have come due meanwhile, to the backend again."""
    step_def = type(workflow).steps.named(execution.step_name)
    if step_def is None or not step_def.waits_for_children:
        return
    if writer.wake_fan_in(session, workflow, settings_of(session).clock.now()):
        return
    timer = writer.armed_timer_of(session, execution)
    if timer is not None:
        enqueue_after_commit(session, enqueued_step(workflow, timer))


def child_paused(
    workflow: Workflow,
    step_def: StepDefinition,
    child: Workflow,
    since: datetime,
    timeout: timedelta,
) -> ChildFailed:
    """The error of a fan-in step whose child stayed paused longer than ``children_timeout``."""
    return ChildFailed(
        f"{step_def.label} (workflow id={workflow.id}): child {child.type} id={child.id} "
        f"(key {child.child_key!r}) has been paused since {since.isoformat()}, longer than "
        f"{type(workflow).__name__}.children_timeout={timeout}; resume, skip or cancel the "
        "child, or let the exception policies of this step decide",
        child_id=child.id,
        child_class=child.type,
        child_key=child.child_key,
        child_error=f"paused since {since.isoformat()}",
    )


def child_failed(session: Session, workflow: Workflow, step_def: StepDefinition) -> ChildFailed:
    """The error a fan-in step raises when a child was canceled: it names the first such
    child, its class, key and the error that ended it (if one did)."""
    child = as_workflow(children_q.first_canceled_child(session, workflow.id))
    if child is None:  # counted, then deleted by housekeeping: say what the counter says
        return ChildFailed(
            f"{step_def.label} (workflow id={workflow.id}): {workflow.children_failed} "
            "child workflow(s) ended canceled; their rows are gone"
        )
    failed = children_q.last_error(session, child.id)
    error = None
    if failed is not None:
        error = f"{failed.error_class_name}: {failed.error_message}"
    because = f" after {error} in step {failed.step_name!r}" if failed is not None else ""
    return ChildFailed(
        f"{step_def.label} (workflow id={workflow.id}): child {child.type} id={child.id} "
        f"(key {child.child_key!r}) ended canceled{because}; this step waits for its children "
        f"(wait_for_children={step_def.wait_for_children!r}), so the exception policies of "
        f"{type(workflow).__name__} decide what happens next",
        child_id=child.id,
        child_class=child.type,
        child_key=child.child_key,
        child_error=error,
    )

"""Test helpers: drive workflows step by step, travel in time, assert on rows.

Every helper commits the session the workflow belongs to before running anything (the
executor works in its own session, like a worker would) and refreshes the workflow after.
What a helper opens on that session it also closes: it returns with no transaction open and
the workflow's attributes loaded, so the caller's next query sees other sessions' commits.

A step's exception is raised again once its outcome is committed — a body error, a raising
``skip_if`` / ``cancel_if`` / signal matcher, a step no longer defined — whatever the exception
policy made of it, with the workflow already refreshed (``paused``, ``canceled``, or ``ready``
with the reattempt or the next step scheduled), so a test can catch it and assert on the rows.
``raise_errors=False`` runs on quietly instead; that is the only difference it makes.

    wf = Onboarding.create(session, hero=user)
    speedrun(wf)                      # runs every step now, ignoring waits
    assert_workflow_state(wf, "finished")

Time travel runs only what is due, as a worker would: ``advance_and_run(wf, hours=2)``.
``crash_next_step(wf)`` runs a step whose outcome never commits (the process died), to test
recovery. The pytest plugin (``geneva_drive.pytest_plugin``) provides the database and clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from geneva_drive.core.clock import FrozenClock, to_timedelta
from geneva_drive.core.settings import settings_of
from geneva_drive.core.states import ExecutionState, WorkflowState
from geneva_drive.definition.workflow import Workflow
from geneva_drive.engine import scheduling
from geneva_drive.engine.executor import RunOptions, run_execution
from geneva_drive.runtime.configure import configured
from geneva_drive.storage import queries
from geneva_drive.storage.models import StepExecution

__all__ = [
    "FrozenClock",
    "SimulatedCrash",
    "advance_and_run",
    "assert_cursor",
    "assert_signal_state",
    "assert_step_executed",
    "assert_step_has_successor",
    "assert_waiting_for_signal",
    "assert_workflow_state",
    "configured",
    "crash_next_step",
    "history",
    "perform_next_step",
    "perform_step_inline",
    "reload",
    "run_due",
    "run_iterations",
    "run_schedules",
    "run_until_parked",
    "speedrun",
    "speedrun_current_step",
]

_STOP = (WorkflowState.FINISHED, WorkflowState.CANCELED, WorkflowState.PAUSED)


@contextmanager
def _callers_session(workflow: Workflow) -> Iterator[Session]:
    """Commit the caller's pending work, refresh ``workflow``; on the way out, end the helper's
    own transaction (whether the helper returns or raises)."""
    session = workflow.session
    if session.in_transaction():
        session.commit()  # the caller's work, with the caller's expire_on_commit
    try:
        session.refresh(workflow)
        yield session
    finally:
        _end_read_transaction(session)


def _end_read_transaction(session: Session) -> None:
    """Close the transaction the helper's reads opened, keeping what they loaded.

    Left open it pins a snapshot: on SQLite the caller keeps seeing rows other sessions have
    deleted since, and its next write fails with "database is locked" (SQLITE_BUSY_SNAPSHOT,
    which no busy timeout can wait out). The helper wrote nothing in it, so committing is
    only an end; expiring on that commit would make the caller's next ``wf.state`` open a
    transaction again, so the commit is told not to.
    """
    if not session.in_transaction():
        return
    if not session.is_active:  # a failed flush: nothing of it can be kept
        session.rollback()
        return
    expire_on_commit = session.expire_on_commit
    session.expire_on_commit = False
    try:
        session.commit()
    finally:
        session.expire_on_commit = expire_on_commit


def _current(workflow: Workflow) -> StepExecution | None:
    execution = queries.current_execution(workflow.session, workflow.id)
    if execution is not None and execution.state == ExecutionState.WAITING:
        step_def = workflow.steps.named(execution.step_name)
        names = step_def.signal_names if step_def else None
        name = names[0] if names else "<name>"
        raise AssertionError(
            f"{type(workflow).__name__} id={workflow.id}: cannot drive step "
            f"{execution.step_name!r}: its execution is parked waiting for "
            f"{execution.awaiting_signal!r}. Deliver the signal first, e.g. "
            f"workflow.signal({name!r}) and commit"
        )
    return execution


def _run(
    workflow: Workflow, execution: StepExecution, options: RunOptions, raise_errors: bool
) -> None:
    """Run ``execution`` in the executor's own session, then refresh it and ``workflow``.

    The refresh happens also when the step's error propagates: the executor raises it only
    after committing the outcome, so the caller can assert on the rows after catching it.
    """
    execution_id, session = execution.id, workflow.session
    # A fresh snapshot for the refresh below (SQLite's would predate the executor's commit).
    _end_read_transaction(session)
    try:
        run_execution(execution_id, reraise=raise_errors, options=options)
    finally:
        session.refresh(workflow)
        session.refresh(execution)


def speedrun(workflow: Workflow, *, max_steps: int = 100, raise_errors: bool = True) -> Workflow:
    """Run the workflow's executions now, one after another, until it stops or parks.

    A step's error is raised after its outcome is committed (the first failure of a step
    that reattempts, too); with ``raise_errors=False`` the run goes on, through reattempts,
    until the workflow finishes, pauses, is canceled or parks.
    """
    with _callers_session(workflow):
        for _ in range(max_steps):
            if workflow.state in _STOP:
                return workflow
            execution = _current(workflow)
            if execution is None:
                return workflow
            _run(workflow, execution, RunOptions(interruptible=False), raise_errors)
        if workflow.state in _STOP or _current(workflow) is None:
            return workflow
        raise AssertionError(
            f"{type(workflow).__name__} id={workflow.id}: speedrun exceeded "
            f"max_steps={max_steps}; is a step reattempting forever?"
        )


def perform_next_step(workflow: Workflow, *, raise_errors: bool = True) -> StepExecution | None:
    """Run the current execution once (even if it is not due yet); returns it, refreshed."""
    with _callers_session(workflow):
        execution = _current(workflow)
        if execution is None:
            return None
        _run(workflow, execution, RunOptions(), raise_errors)
        return execution


def perform_step_inline(
    workflow: Workflow, step_name: str | None = None, *, raise_errors: bool = True
) -> StepExecution:
    """Run ``step_name`` (default: the next step) right now in a fresh execution."""
    with _callers_session(workflow) as session:
        name = step_name or workflow.next_step_name
        step_def = workflow.steps.named(name)
        if step_def is None:
            raise ValueError(
                f"Step {name!r} is not defined in {type(workflow).__name__}. Available steps: "
                f"{', '.join(workflow.steps.names)}"
            )
        keep_next = workflow.next_step_name
        try:
            execution = scheduling.create_step_execution(
                session, workflow, step_def, settings_of(session).clock.now()
            )
            workflow.next_step_name = keep_next
            session.commit()
        except Exception:
            session.rollback()  # not half of it: _callers_session would commit it on exit
            raise
        _run(workflow, execution, RunOptions(interruptible=False), raise_errors)
        return execution


def speedrun_current_step(
    workflow: Workflow, *, max_executions: int = 100, raise_errors: bool = True
) -> StepExecution | None:
    """Run only the current step to its end, following resumable successors.

    A step's error is raised after its outcome is committed; with ``raise_errors=False`` the
    failed (or reattempted) execution is returned instead.
    """
    with _callers_session(workflow) as session:
        execution = _current(workflow)
        if execution is None:
            return None
        for _ in range(max_executions):
            _run(workflow, execution, RunOptions(interruptible=False), raise_errors)
            successor = queries.successor_of(session, execution.id)
            if successor is None or successor.state != ExecutionState.SCHEDULED:
                return execution
            execution = successor
        raise AssertionError(
            f"{type(workflow).__name__} id={workflow.id}: speedrun_current_step exceeded "
            f"max_executions={max_executions}"
        )


def run_iterations(workflow: Workflow, count: int, *, raise_errors: bool = True) -> StepExecution:
    """Run the current execution for at most ``count`` checkpoints.

    A step's error is raised after its outcome is committed; ``raise_errors=False`` returns
    the failed execution instead.
    """
    with _callers_session(workflow):
        execution = _current(workflow)
        if execution is None:
            raise AssertionError(
                f"{type(workflow).__name__} id={workflow.id}: no current step execution to run"
            )
        _run(workflow, execution, RunOptions(max_iterations=count), raise_errors)
        return execution


def run_until_parked(
    workflow: Workflow, *, max_steps: int = 100, raise_errors: bool = True
) -> Workflow:
    """Like :func:`speedrun` (every step now, waits ignored), but a step that parks for a
    signal ends the run instead of failing it: the workflow is returned waiting."""
    with _callers_session(workflow) as session:
        for _ in range(max_steps):
            if workflow.state in _STOP:
                return workflow
            execution = queries.current_execution(session, workflow.id)
            if execution is None or execution.state == ExecutionState.WAITING:
                return workflow
            _run(workflow, execution, RunOptions(interruptible=False), raise_errors)
        raise AssertionError(
            f"{type(workflow).__name__} id={workflow.id}: run_until_parked exceeded "
            f"max_steps={max_steps}; is a step reattempting forever?"
        )


def run_due(workflow: Workflow, *, max_runs: int = 100, raise_errors: bool = True) -> int:
    """Run what of ``workflow`` is due by geneva-drive's clock, as a worker would; returns how
    many executions ran.

    Its next step once its ``wait`` has passed, a signal's timeout (the timer of a parked
    step), a reattempt whose wait is over — and whatever those schedule that is due at once —
    until nothing of it is due, it parks, or it finishes, pauses or is canceled. A step that
    is not due yet is left alone (unlike :func:`speedrun`).
    """
    ran = 0
    with _callers_session(workflow) as session:
        while workflow.state not in _STOP:
            due = _next_due(session, workflow)
            if due is None:
                return ran
            if ran == max_runs:
                raise AssertionError(
                    f"{type(workflow).__name__} id={workflow.id}: run_due exceeded "
                    f"max_runs={max_runs}; is a step reattempting without a wait?"
                )
            _run(workflow, due, RunOptions(), raise_errors)
            ran += 1
    return ran


def _next_due(session: Session, workflow: Workflow) -> StepExecution | None:
    now = settings_of(session).clock.now()
    due = [
        execution
        for execution in queries.execution_history(session, workflow.id)
        if execution.state == ExecutionState.SCHEDULED and execution.scheduled_for <= now
    ]
    return min(due, key=lambda e: (e.scheduled_for, e.id)) if due else None


def advance_and_run(
    workflow: Workflow,
    delta: timedelta | float | None = None,
    *,
    raise_errors: bool = True,
    **duration: float,
) -> int:
    """Move the frozen clock forward — by ``delta`` (a timedelta or seconds) or timedelta
    keywords (``hours=2``) — then :func:`run_due`; returns how many executions ran."""
    clock = settings_of(workflow.session).clock
    if not isinstance(clock, FrozenClock):
        raise TypeError(
            f"advance_and_run({type(workflow).__name__} id={workflow.id}): geneva-drive's "
            f"clock is {clock!r}, which cannot be moved; install a FrozenClock first (the "
            "frozen_clock or geneva_drive_session fixture, or configured(clock=FrozenClock()))"
        )
    clock.advance(delta, **duration)
    return run_due(workflow, raise_errors=raise_errors)


def run_schedules(*classes: type[Workflow]) -> list[Workflow]:
    """One schedule pass at geneva-drive's clock, as each worker runs at every heartbeat: the
    workflows it created for due ticks of ``classes`` (every scheduled class defined, when
    none is given). They come from the pass's own session, committed: load one in yours with
    ``session.get(cls, workflow.id)`` to run it."""
    from geneva_drive.core.settings import settings
    from geneva_drive.engine.schedules import run_due_schedules

    return run_due_schedules(settings(), classes or None)


class SimulatedCrash(BaseException):
    """What :func:`crash_next_step` stops a run with: the process died before the hand-back.

    A ``BaseException``, like a kill: no exception policy sees it, so nothing is recorded.
    """


def crash_next_step(
    workflow: Workflow, *, worker_id: str | None = None, lease: timedelta | float = 30
) -> StepExecution:
    """Run the current execution's body, then die before its outcome is handed back.

    What a worker killed mid-step leaves: the execution ``in_progress`` (phase 1 committed),
    the body's writes rolled back — a resumable step's since its last checkpoint, which
    committed as it went — and no next step. With ``worker_id`` the dead worker held a
    lease that expires ``lease`` (seconds or a timedelta) after the clock's now — recovered
    by ``geneva_drive.housekeeping.run()`` (or any worker) once the clock passes it; without,
    it held none (an external backend such as Celery) and housekeeping recovers it after
    ``stuck_in_progress_threshold``. Returns the execution, refreshed.
    """
    cls = type(workflow)
    own = cls.__dict__.get("around_step_execution")
    around = cls.around_step_execution

    def dies_after_the_body(self: Workflow, execution: StepExecution, proceed: Any) -> Any:
        around(self, execution, proceed)
        raise SimulatedCrash(f"{cls.__name__} id={self.id}: crash_next_step")

    with _callers_session(workflow) as session:
        execution = _current(workflow)
        if execution is None or execution.state != ExecutionState.SCHEDULED:
            raise AssertionError(
                f"{cls.__name__} id={workflow.id}: crash_next_step needs a scheduled "
                f"execution to run, found {execution!r}"
            )
        options = RunOptions(worker_id=worker_id, lease=to_timedelta(lease), interruptible=False)
        _end_read_transaction(session)
        # The executor loads its own instance of the class: the hook is swapped on the class,
        # for this one synchronous run.
        cls.around_step_execution = dies_after_the_body  # type: ignore[method-assign]
        try:
            run_execution(execution.id, options=options)
        except SimulatedCrash:
            pass
        else:
            raise AssertionError(
                f"{cls.__name__} id={workflow.id}: execution {execution.id} of step "
                f"{execution.step_name!r} did not reach its body (a guard ended it first)"
            )
        finally:
            if own is None:
                del cls.around_step_execution
            else:
                cls.around_step_execution = own  # type: ignore[method-assign]
            session.refresh(workflow)
            session.refresh(execution)
        return execution


def history(workflow: Workflow) -> list[tuple[str, str, str | None]]:
    """``(step_name, state, outcome)`` of each of the workflow's executions, oldest first,
    read fresh from the database (timers included)."""
    with _callers_session(workflow) as session:
        return [
            (e.step_name, str(e.state), e.outcome)
            for e in queries.execution_history(session, workflow.id)
        ]


def reload(workflow: Workflow) -> Workflow:
    """Commit the session's pending work and read ``workflow`` (and everything else the
    session holds) fresh: what a worker or another session committed becomes visible."""
    session = workflow.session
    if session.in_transaction():
        session.commit()
    session.expire_all()
    with _callers_session(workflow):
        return workflow


def assert_workflow_state(workflow: Workflow, state: str) -> None:
    with _callers_session(workflow):
        assert workflow.state == str(state), (
            f"{type(workflow).__name__} id={workflow.id}: expected state {state!r}, "
            f"got {workflow.state!r}"
        )


def assert_step_executed(workflow: Workflow, step_name: str, *, state: str = "completed") -> None:
    """Some run of ``step_name`` ended in ``state``; a signal-timeout timer is not a run."""
    with _callers_session(workflow) as session:
        rows = [
            r for r in queries.executions_of_step(session, workflow.id, step_name) if not r.is_timer
        ]
        assert any(r.state == state for r in rows), (
            f"{type(workflow).__name__} id={workflow.id}: no {state!r} execution of step "
            f"{step_name!r}; executions: {[(r.step_name, r.state, r.outcome) for r in rows]}"
        )


def assert_cursor(workflow: Workflow, expected: Any) -> None:
    with _callers_session(workflow) as session:
        current = queries.current_execution(session, workflow.id)
        actual = current.cursor_value if current is not None else None
        assert actual == expected, (
            f"{type(workflow).__name__} id={workflow.id}: expected cursor {expected!r}, got "
            f"{actual!r} on {current!r}"
        )


def assert_step_has_successor(workflow: Workflow, step_name: str) -> None:
    with _callers_session(workflow) as session:
        completed = queries.executions_of_step(session, workflow.id, step_name, state="completed")
        for row in completed:
            successor = queries.successor_of(session, row.id)
            if successor is not None and successor.state == ExecutionState.SCHEDULED:
                return
        raise AssertionError(
            f"{type(workflow).__name__} id={workflow.id}: step {step_name!r} has no completed "
            "execution with a scheduled successor"
        )


def assert_waiting_for_signal(workflow: Workflow, signal_name: str | None = None) -> None:
    with _callers_session(workflow) as session:
        current = queries.current_execution(session, workflow.id)
        assert current is not None and current.state == ExecutionState.WAITING, (
            f"{type(workflow).__name__} id={workflow.id}: no execution is waiting for a signal"
        )
        if signal_name is not None:
            # The names its matcher accepts (None: any, see definition.matchers).
            step_def = workflow.steps.named(current.step_name)
            names = step_def.signal_names if step_def else ()
            assert names is None or signal_name in names, (
                f"waiting for {current.awaiting_signal!r}, not {signal_name!r}"
            )


def assert_signal_state(workflow: Workflow, signal_name: str, state: str) -> None:
    with _callers_session(workflow) as session:
        signal = queries.newest_signal_named(session, workflow.id, signal_name)
        assert signal is not None, f"no signal {signal_name!r} for workflow {workflow.id}"
        assert signal.state == state, f"signal {signal_name!r} is {signal.state!r}, not {state!r}"

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
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.orm import Session

from geneva_drive.core.clock import FrozenClock
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
    "assert_cursor",
    "assert_signal_state",
    "assert_step_executed",
    "assert_step_has_successor",
    "assert_waiting_for_signal",
    "assert_workflow_state",
    "configured",
    "perform_next_step",
    "perform_step_inline",
    "run_iterations",
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

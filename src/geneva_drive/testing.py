"""Test helpers: drive workflows step by step, travel in time, assert on rows.

Every helper commits the session the workflow belongs to before running anything (the
executor works in its own session, like a worker would) and refreshes the workflow after.

    wf = Onboarding.create(session, hero=user)
    speedrun(wf)                      # runs every step now, ignoring waits
    assert_workflow_state(wf, "finished")
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from . import queries
from .clock import FrozenClock
from .config import configured, settings
from .executor import RunOptions, run_execution
from .models import Signal, StepExecution
from .states import ExecutionState, WorkflowState
from .workflow import Workflow

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


def _sync(workflow: Workflow) -> None:
    session = workflow.session
    if session.in_transaction():
        session.commit()
    session.refresh(workflow)


def _current(workflow: Workflow) -> StepExecution | None:
    execution = queries.current_execution(workflow.session, workflow.id)
    if execution is not None and execution.state == ExecutionState.WAITING:
        step_def = workflow.steps.named(execution.step_name)
        matcher = step_def.signal_matcher if step_def else None
        name = getattr(matcher, "name", matcher)
        raise AssertionError(
            f"{type(workflow).__name__} id={workflow.id}: cannot drive step "
            f"{execution.step_name!r}: its execution is parked waiting for {matcher!r}. Deliver "
            f"the signal first, e.g. workflow.signal({name!r}) and commit"
        )
    return execution


def _run(
    workflow: Workflow, execution: StepExecution, options: RunOptions, raise_errors: bool
) -> None:
    execution_id = execution.id  # read before commit: the object may expire
    session = workflow.session
    if session.in_transaction():
        session.commit()
    run_execution(execution_id, reraise=raise_errors, options=options)


def speedrun(workflow: Workflow, *, max_steps: int = 100, raise_errors: bool = False) -> Workflow:
    """Run the workflow's executions now, one after another, until it stops or parks."""
    for _ in range(max_steps):
        _sync(workflow)
        if workflow.state in _STOP:
            return workflow
        execution = _current(workflow)
        if execution is None:
            return workflow
        _run(workflow, execution, RunOptions(interruptible=False), raise_errors)
    _sync(workflow)
    if workflow.state in _STOP or _current(workflow) is None:
        return workflow
    raise AssertionError(
        f"{type(workflow).__name__} id={workflow.id}: speedrun exceeded max_steps={max_steps}; "
        "is a step reattempting forever?"
    )


def perform_next_step(workflow: Workflow, *, raise_errors: bool = False) -> StepExecution | None:
    """Run the current execution once (even if it is not due yet); returns it, refreshed."""
    _sync(workflow)
    execution = _current(workflow)
    if execution is None:
        return None
    _run(workflow, execution, RunOptions(), raise_errors)
    _sync(workflow)
    workflow.session.refresh(execution)
    return execution


def perform_step_inline(
    workflow: Workflow, step_name: str | None = None, *, raise_errors: bool = False
) -> StepExecution:
    """Run ``step_name`` (default: the next step) right now in a fresh execution."""
    _sync(workflow)
    name = step_name or workflow.next_step_name
    step_def = workflow.steps.named(name)
    if step_def is None:
        raise ValueError(
            f"Step {name!r} is not defined in {type(workflow).__name__}. Available steps: "
            f"{', '.join(workflow.steps.names)}"
        )
    from . import scheduling

    session = workflow.session
    keep_next = workflow.next_step_name
    now = settings().clock.now()
    execution = scheduling.create_step_execution(session, workflow, step_def, now)
    workflow.next_step_name = keep_next
    execution_id = execution.id
    session.commit()
    run_execution(execution_id, reraise=raise_errors, options=RunOptions(interruptible=False))
    _sync(workflow)
    session.refresh(execution)
    return execution


def speedrun_current_step(workflow: Workflow, *, max_executions: int = 100) -> StepExecution | None:
    """Run only the current step to its end, following resumable successors."""
    _sync(workflow)
    execution = _current(workflow)
    if execution is None:
        return None
    for _ in range(max_executions):
        _run(workflow, execution, RunOptions(interruptible=False), False)
        _sync(workflow)
        workflow.session.refresh(execution)
        successor = workflow.session.execute(
            select(StepExecution).where(StepExecution.continues_from_id == execution.id)
        ).scalar_one_or_none()
        if successor is None or successor.state != ExecutionState.SCHEDULED:
            return execution
        execution = successor
    raise AssertionError(f"speedrun_current_step exceeded max_executions={max_executions}")


def run_iterations(workflow: Workflow, count: int) -> StepExecution:
    """Run the current execution for at most ``count`` checkpoints."""
    _sync(workflow)
    execution = _current(workflow)
    if execution is None:
        raise AssertionError("No current step execution to run")
    _run(workflow, execution, RunOptions(max_iterations=count), False)
    _sync(workflow)
    workflow.session.refresh(execution)
    return execution


def assert_workflow_state(workflow: Workflow, state: str) -> None:
    _sync(workflow)
    assert workflow.state == str(state), (
        f"{type(workflow).__name__} id={workflow.id}: expected state {state!r}, "
        f"got {workflow.state!r}"
    )


def assert_step_executed(workflow: Workflow, step_name: str, *, state: str = "completed") -> None:
    _sync(workflow)
    rows = queries.executions_of_step(workflow.session, workflow.id, step_name)
    assert any(r.state == state for r in rows), (
        f"{type(workflow).__name__} id={workflow.id}: no {state!r} execution of step "
        f"{step_name!r}; executions: {[(r.step_name, r.state, r.outcome) for r in rows]}"
    )


def assert_cursor(workflow: Workflow, expected: Any) -> None:
    _sync(workflow)
    current = queries.current_execution(workflow.session, workflow.id)
    actual = current.cursor_value if current is not None else None
    assert actual == expected, (
        f"{type(workflow).__name__} id={workflow.id}: expected cursor {expected!r}, got "
        f"{actual!r} on {current!r}"
    )


def assert_step_has_successor(workflow: Workflow, step_name: str) -> None:
    _sync(workflow)
    session = workflow.session
    for row in queries.executions_of_step(session, workflow.id, step_name, state="completed"):
        successor = session.execute(
            select(StepExecution).where(StepExecution.continues_from_id == row.id)
        ).scalar_one_or_none()
        if successor is not None and successor.state == ExecutionState.SCHEDULED:
            return
    raise AssertionError(
        f"{type(workflow).__name__} id={workflow.id}: step {step_name!r} has no completed "
        "execution with a scheduled successor"
    )


def assert_waiting_for_signal(workflow: Workflow, signal_name: str | None = None) -> None:
    _sync(workflow)
    current = queries.current_execution(workflow.session, workflow.id)
    assert current is not None and current.state == ExecutionState.WAITING, (
        f"{type(workflow).__name__} id={workflow.id}: no execution is waiting for a signal"
    )
    if signal_name is not None:
        step_def = workflow.steps.named(current.step_name)
        name = getattr(step_def.signal_matcher if step_def else None, "name", None)
        assert name == signal_name, f"waiting for {name!r}, not {signal_name!r}"


def assert_signal_state(workflow: Workflow, signal_name: str, state: str) -> None:
    _sync(workflow)
    signal = workflow.session.execute(
        select(Signal)
        .where(Signal.workflow_id == workflow.id, Signal.name == signal_name)
        .order_by(Signal.created_at.desc(), Signal.id.desc())
        .limit(1)
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()
    assert signal is not None, f"no signal {signal_name!r} for workflow {workflow.id}"
    assert signal.state == state, f"signal {signal_name!r} is {signal.state!r}, not {state!r}"

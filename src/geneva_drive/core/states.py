"""Workflow and step-execution states, outcomes, and the executor's transition tables."""

from __future__ import annotations

from enum import StrEnum

from geneva_drive.core.errors import InvalidStateTransition


class WorkflowState(StrEnum):
    READY = "ready"
    PERFORMING = "performing"
    FINISHED = "finished"
    CANCELED = "canceled"
    PAUSED = "paused"


class ExecutionState(StrEnum):
    SCHEDULED = "scheduled"
    WAITING = "waiting"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"
    SKIPPED = "skipped"


class Outcome(StrEnum):
    SUCCESS = "success"
    CONTINUED = "continued"
    REATTEMPTED = "reattempted"
    SKIPPED = "skipped"
    CANCELED = "canceled"
    FAILED = "failed"
    RECOVERED = "recovered"
    WORKFLOW_PAUSED = "workflow_paused"
    TIMED_OUT = "timed_out"  # a signal wait ran out (the parked row), or the timer that ended it


TERMINAL_WORKFLOW_STATES = frozenset({WorkflowState.FINISHED, WorkflowState.CANCELED})
ONGOING_WORKFLOW_STATES = frozenset(set(WorkflowState) - TERMINAL_WORKFLOW_STATES)
ACTIVE_EXECUTION_STATES = frozenset(
    {ExecutionState.SCHEDULED, ExecutionState.WAITING, ExecutionState.IN_PROGRESS}
)
# States that stamp ``transitioned_at`` when a workflow enters them.
STAMPED_WORKFLOW_STATES = frozenset(
    {WorkflowState.FINISHED, WorkflowState.CANCELED, WorkflowState.PAUSED}
)

_WORKFLOW_TRANSITIONS: dict[str, frozenset[str]] = {
    WorkflowState.READY: frozenset(WorkflowState),
    WorkflowState.PERFORMING: frozenset(WorkflowState),
}
_STEP_TRANSITIONS: dict[str, frozenset[str]] = {
    ExecutionState.SCHEDULED: frozenset(
        {
            ExecutionState.SCHEDULED,
            ExecutionState.WAITING,
            ExecutionState.IN_PROGRESS,
            ExecutionState.CANCELED,
            ExecutionState.SKIPPED,
            ExecutionState.FAILED,
            ExecutionState.COMPLETED,
        }
    ),
    ExecutionState.WAITING: frozenset(
        {ExecutionState.SCHEDULED, ExecutionState.CANCELED, ExecutionState.SKIPPED}
    ),
    ExecutionState.IN_PROGRESS: frozenset(
        {
            ExecutionState.IN_PROGRESS,
            ExecutionState.COMPLETED,
            ExecutionState.FAILED,
            ExecutionState.CANCELED,
            ExecutionState.SKIPPED,
        }
    ),
}


def check_workflow_transition(current: str, target: str) -> None:
    """The executor may move a workflow only out of ``ready`` or ``performing``."""
    if current == target:
        return
    if target not in _WORKFLOW_TRANSITIONS.get(current, frozenset()):
        raise InvalidStateTransition(f"workflow cannot move from {current!r} to {target!r}")


def check_step_transition(current: str, target: str) -> None:
    if target not in _STEP_TRANSITIONS.get(current, frozenset()):
        raise InvalidStateTransition(f"step execution cannot move from {current!r} to {target!r}")

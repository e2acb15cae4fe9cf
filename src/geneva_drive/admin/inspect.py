"""One workflow's timeline: executions, signals, operator actions, what it waits for."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from .find import WorkflowSummary


@dataclass(frozen=True)
class ExecutionEntry:
    id: int
    step_name: str
    state: str
    outcome: str | None
    is_timer: bool
    attempt: int  # nth run of this step in this workflow (a timer: the run it times out)
    scheduled_for: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duration_seconds: float | None
    error_class: str | None
    error_message: str | None
    error_backtrace: str | None
    cursor: Any
    iterations: int | None  # resumable steps
    queue: str
    lease_owner: str | None
    lease_expires_at: datetime | None
    metadata: dict[str, Any]
    awaiting_signal: str | None = None
    wait_deadline: datetime | None = None


@dataclass(frozen=True)
class SignalEntry:
    id: int
    name: str
    state: str
    idempotency_key: str | None
    payload_preview: str  # at most 200 characters
    created_at: datetime
    claimed_at: datetime | None
    consumed_at: datetime | None
    claimed_by: int | None  # execution ids
    consumed_by: int | None


@dataclass(frozen=True)
class ActionEntry:
    """An operator action: who did what, and why."""

    at: datetime
    action: str
    actor: str
    reason: str | None
    execution_id: int | None
    detail: dict[str, Any] | None = None


@dataclass(frozen=True)
class Timeline:
    workflow: WorkflowSummary
    metadata: dict[str, Any]
    steps: tuple[str, ...]  # the class's step names in order (empty if the class is unknown)
    executions: tuple[ExecutionEntry, ...]
    signals: tuple[SignalEntry, ...]
    actions: tuple[ActionEntry, ...]
    awaiting_signal: str | None
    wait_deadline: datetime | None
    truncated: bool = False  # only the newest ``max_executions`` executions are listed


def show(session: Session, workflow_id: int, *, max_executions: int = 1000) -> Timeline:
    raise NotImplementedError

"""One workflow's timeline: executions, signals, operator actions, what it waits for, and
its parent and children (``family``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from geneva_drive.admin.family import Family, family
from geneva_drive.admin.find import WorkflowSummary, summaries
from geneva_drive.core.errors import AdminInputError, AdminNotFound
from geneva_drive.core.states import ExecutionState, Outcome
from geneva_drive.core.traceparent import trace_id
from geneva_drive.storage import serialization
from geneva_drive.storage.models import TIMEOUT_FOR
from geneva_drive.storage.queries import admin as q
from geneva_drive.storage.queries import defined_workflow_model

PREVIEW = 200  # characters of a signal payload shown in a timeline


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
    waiting_since: datetime | None = None  # while (and since when) the row waits
    result: Any = None  # what the step returned, on a successful execution (decoded)


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
    family: Family | None = None  # its parent and children, if it has either
    # The OpenTelemetry trace its steps' spans belong to (32 hex digits): that of the request
    # that created it, when one was being traced (``engine.tracing``); else None.
    trace_id: str | None = None
    input: Any = None  # the value passed as create(input=...), decoded
    # While a canceled workflow runs its compensations: the step being undone (its metadata
    # ``compensation``, docs/compensation.md); None otherwise.
    compensating: str | None = None


def show(session: Session, workflow_id: int, *, max_executions: int = 1000) -> Timeline:
    """Everything about one workflow, oldest first; only its newest ``max_executions``
    executions (and as many signals and actions), so one endless resumable run stays cheap."""
    if not isinstance(max_executions, int) or max_executions < 1:
        raise AdminInputError(f"show(max_executions={max_executions!r}): expected a positive int")
    row = q.workflow_row(session, workflow_id)
    if row is None:
        raise AdminNotFound(
            f"no workflow with id={workflow_id}; `geneva-drive list` (or the dashboard's "
            "Workflows page) shows the ids there are"
        )
    (summary,) = summaries(session, [row])
    rows = q.timeline_executions(session, workflow_id, max_executions + 1)
    truncated = len(rows) > max_executions
    rows = list(reversed(rows[:max_executions]))
    executions = _entries(rows)
    signals = tuple(
        _signal_entry(s, rows)
        for s in reversed(q.timeline_signals(session, workflow_id, max_executions))
    )
    actions = tuple(
        ActionEntry(
            at=a.at,
            action=a.action,
            actor=a.actor,
            reason=a.reason,
            execution_id=a.execution_id,
            detail=a.detail,
        )
        for a in reversed(q.timeline_actions(session, workflow_id, max_executions))
    )
    return Timeline(
        workflow=summary,
        metadata=_decoded(row.metadata),
        steps=_step_names(row.type),
        executions=executions,
        signals=signals,
        actions=actions,
        awaiting_signal=summary.awaiting_signal,
        wait_deadline=summary.wait_deadline,
        truncated=truncated,
        family=family(session, workflow_id),
        trace_id=trace_id(row.trace_context),
        input=_decoded({"input": row.input})["input"],
        compensating=_compensating(row.metadata),
    )


def _compensating(metadata: Any) -> str | None:
    state = _decoded(metadata).get("compensation")
    step = state.get("step") if isinstance(state, dict) else None
    return step if isinstance(step, str) else None


def _step_names(workflow_type: str) -> tuple[str, ...]:
    """The steps of ``workflow_type``'s class, if this process defines it (none without
    the DSL imported: ``show`` without ``--app`` reads the rows only)."""
    root = defined_workflow_model()
    if root is None:
        return ()
    mapper = root.__mapper__.polymorphic_map.get(workflow_type)
    cls: Any = mapper.class_ if mapper is not None else root
    return tuple(d.name for d in cls.steps if d.name)


def _entries(rows: list[Any]) -> tuple[ExecutionEntry, ...]:
    """Executions oldest first, each with its attempt number (timers: their parked row's)."""
    runs: dict[str, int] = {}
    attempt_of: dict[int, int] = {}
    entries = []
    for row in rows:
        metadata = row.metadata or {}
        parked = metadata.get(TIMEOUT_FOR)
        if parked is None:
            runs[row.step_name] = runs.get(row.step_name, 0) + 1
            attempt_of[row.id] = runs[row.step_name]
        attempt = attempt_of.get(int(parked), runs.get(row.step_name, 1)) if parked else None
        entries.append(_entry(row, metadata, attempt or attempt_of[row.id], parked is not None))
    return tuple(entries)


def _entry(row: Any, metadata: dict[str, Any], attempt: int, timer: bool) -> ExecutionEntry:
    duration = None
    if row.started_at is not None and row.finished_at is not None:
        duration = (row.finished_at - row.started_at).total_seconds()
    iterations = metadata.get("iterations")
    decoded = _decoded(metadata)
    error_class, error_message, error_backtrace = _error_of(row, decoded)
    return ExecutionEntry(
        id=row.id,
        step_name=row.step_name,
        state=row.state,
        outcome=row.outcome,
        is_timer=timer,
        attempt=attempt,
        scheduled_for=row.scheduled_for,
        started_at=row.started_at,
        finished_at=row.finished_at,
        duration_seconds=duration,
        error_class=error_class,
        error_message=error_message,
        error_backtrace=error_backtrace,
        cursor=_decoded({"cursor": row.cursor})["cursor"],
        iterations=iterations if isinstance(iterations, int) else None,
        queue=row.queue,
        lease_owner=row.lease_owner,
        lease_expires_at=row.lease_expires_at,
        metadata=decoded,
        awaiting_signal=row.awaiting_signal,
        wait_deadline=row.wait_deadline,
        waiting_since=row.waiting_since,
        result=_decoded({"result": row.result})["result"],
    )


def _error_of(row: Any, metadata: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    """(class, message, backtrace) of the error an execution ended with.

    A failure keeps it in its error columns; an error that was reattempted, or skipped or
    finished past by its policy, only in its metadata (``"exception"``) — shown the same way.
    """
    if row.error_class_name is not None:
        return row.error_class_name, row.error_message, row.error_backtrace
    info = metadata.get("exception")
    if not isinstance(info, dict) or not isinstance(info.get("class"), str):
        return None, None, None
    message = info.get("message")
    lines = info.get("backtrace")
    backtrace = "".join(str(line) for line in lines) if isinstance(lines, list) else None
    return info["class"], message if isinstance(message, str) else None, backtrace or None


def _signal_entry(signal: Any, executions: list[Any]) -> SignalEntry:
    attached = [e for e in executions if e.signal_id == signal.id]
    consumed_by = None
    if signal.consumed_at is not None:
        clean = [
            e
            for e in attached
            if e.state in (ExecutionState.COMPLETED, ExecutionState.SKIPPED)
            and e.outcome in (Outcome.SUCCESS, Outcome.SKIPPED)
        ]
        consumed_by = clean[-1].id if clean else None
    return SignalEntry(
        id=signal.id,
        name=signal.name,
        state=signal.state,
        idempotency_key=signal.idempotency_key,
        payload_preview=_preview(signal.payload),
        created_at=signal.created_at,
        claimed_at=signal.claimed_at,
        consumed_at=signal.consumed_at,
        claimed_by=attached[0].id if attached else None,
        consumed_by=consumed_by,
    )


def _preview(payload: Any) -> str:
    if payload is None:
        return ""
    text = json.dumps(payload, sort_keys=True, default=str)
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


def _decoded(data: Any) -> dict[str, Any]:
    """Stored metadata as plain values; a value the codec cannot read is shown as stored."""
    if not isinstance(data, dict):
        return {}
    decoded = {}
    for key, value in data.items():
        try:
            decoded[str(key)] = serialization.decode(value)
        except Exception:  # a reference to a class this process lacks: show it as stored
            decoded[str(key)] = value
    return decoded

"""Operator actions by id and in bulk: each through the engine's verbs, each recorded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from .filters import WorkflowFilter

ACTIONS = ("pause", "resume", "skip", "cancel", "retry", "resume_at", "signal")


@dataclass(frozen=True)
class ActionResult:
    workflow_id: int
    action: str
    state_before: str
    state_after: str
    detail: str


@dataclass(frozen=True)
class BulkResult:
    matched: int
    changed: tuple[int, ...]
    refused: tuple[tuple[int, str], ...]  # (workflow id, why)
    dry_run: bool = False


def pause(
    session: Session, workflow_id: int, *, actor: str, reason: str | None = None
) -> ActionResult:
    raise NotImplementedError


def resume(
    session: Session, workflow_id: int, *, actor: str, reason: str | None = None
) -> ActionResult:
    raise NotImplementedError


def skip(
    session: Session, workflow_id: int, *, actor: str, reason: str | None = None
) -> ActionResult:
    raise NotImplementedError


def cancel(
    session: Session, workflow_id: int, *, actor: str, reason: str | None = None
) -> ActionResult:
    raise NotImplementedError


def retry(
    session: Session, workflow_id: int, *, actor: str, reason: str | None = None
) -> ActionResult:
    """Make the scheduled step (or a paused workflow's step) due now."""
    raise NotImplementedError


def resume_at(
    session: Session, workflow_id: int, step: str, *, actor: str, reason: str | None = None
) -> ActionResult:
    """Continue a paused or ready workflow at the named step."""
    raise NotImplementedError


def signal(
    session: Session,
    workflow_id: int,
    name: str,
    *,
    payload: Any = None,
    key: str | None = None,
    actor: str,
    reason: str | None = None,
) -> ActionResult:
    raise NotImplementedError


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
    raise NotImplementedError

"""Finding workflows: filtered, keyset-paginated, bounded."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from .filters import WorkflowFilter

if TYPE_CHECKING:
    from ..workflow import Workflow


@dataclass(frozen=True)
class WorkflowSummary:
    id: int
    workflow_type: str
    state: str
    hero_type: str | None
    hero_id: str | None
    current_step: str | None
    next_step: str | None
    created_at: datetime
    transitioned_at: datetime | None
    updated_at: datetime
    awaiting_signal: str | None
    wait_deadline: datetime | None
    last_error_class: str | None


@dataclass(frozen=True)
class Page:
    items: tuple[WorkflowSummary, ...]
    next_cursor: str | None  # opaque keyset cursor (never OFFSET); None at the end


@dataclass(frozen=True)
class BoundedCount:
    value: int
    exact: bool  # False: at least ``value`` (the count stopped at its cap)

    def __str__(self) -> str:
        return f"{self.value:,}" if self.exact else f"{self.value:,}+"


def find(
    session: Session,
    where: WorkflowFilter = WorkflowFilter(),
    *,
    newest_first: bool = True,
    limit: int = 50,
    after: str | None = None,
) -> Page:
    raise NotImplementedError


def count(
    session: Session, where: WorkflowFilter = WorkflowFilter(), *, cap: int = 10_000
) -> BoundedCount:
    raise NotImplementedError


def for_hero(session: Session, hero: Any, *, ongoing_only: bool = False) -> list[Workflow]:
    raise NotImplementedError


def ongoing_for(cls: type[Workflow], hero: Any, session: Session | None = None) -> list[Workflow]:
    """``Workflow.ongoing_for(hero)``: ongoing workflows of ``cls`` (and its subclasses)."""
    raise NotImplementedError

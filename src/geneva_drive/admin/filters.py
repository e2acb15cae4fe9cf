"""Which workflows an admin query is about: :class:`WorkflowFilter`, and its parsing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from .errors import AdminInputError


@dataclass(frozen=True)
class WorkflowFilter:
    """Every field narrows the selection; None means any. A tuple: any of its values."""

    workflow_type: str | tuple[str, ...] | None = None  # the stored ``type`` (class name)
    state: str | tuple[str, ...] | None = None  # WorkflowState values
    hero_type: str | None = None
    hero_id: str | None = None
    current_step: str | None = None  # the step it stands at (current or next step name)
    error_class: str | None = None  # error_class_name of its latest failed execution
    awaiting_signal: str | None = None  # the signal its waiting execution waits for
    created_after: datetime | None = None
    created_before: datetime | None = None
    transitioned_after: datetime | None = None
    transitioned_before: datetime | None = None
    has_failed_execution: bool | None = None
    ids: tuple[int, ...] | None = None

    @classmethod
    def parse(cls, items: Sequence[str]) -> WorkflowFilter:
        """``["state=paused", "type=Onboarding", "created_after=2026-12-01T00:00"]``."""
        raise NotImplementedError


__all__ = ["AdminInputError", "WorkflowFilter"]

"""A hero's workflows: every workflow, of any class, about one domain record.

Its own module, not ``find``'s: it goes through the engine's hero lookup, which a page of
workflows (the CLI's ``list``, the dashboard) has no need to import.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from geneva_drive.definition.workflow import Workflow
from geneva_drive.engine.verbs import workflows_of_hero


def for_hero(session: Session, hero: Any, *, ongoing_only: bool = False) -> list[Workflow]:
    """Every workflow (of any class) about ``hero``, oldest first."""
    return workflows_of_hero(Workflow, hero, session, ongoing_only=ongoing_only)

"""Workflow-row look-ups."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import (
    select,
)
from sqlalchemy.orm import Session

from geneva_drive.core.states import WorkflowState
from geneva_drive.storage.queries._sql import workflow_model

if TYPE_CHECKING:
    pass


def find_ongoing_duplicate(
    session: Session, type_: str, hero_type: str | None, hero_id: str | None
) -> int | None:
    """Id of an ongoing, single-instance workflow of ``type_`` for this hero, if any."""
    wf = workflow_model()
    stmt = select(wf.id).where(
        wf.type == type_,
        wf.hero_type == hero_type if hero_type is not None else wf.hero_type.is_(None),
        wf.hero_id == hero_id if hero_id is not None else wf.hero_id.is_(None),
        wf.state.notin_((WorkflowState.FINISHED, WorkflowState.CANCELED)),
        wf.allow_multiple.is_(False),
    )
    return session.execute(stmt.limit(1)).scalar_one_or_none()

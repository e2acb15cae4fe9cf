"""Helpers shared by the child-workflow tests (the workflow classes live per file)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive import Workflow
from tests.engine._support import reload
from tests.signals._support import run_due


def children_of(session: Session, parent: Workflow) -> list[Workflow]:
    """The parent's children by key, freshly read."""
    if session.in_transaction():
        session.commit()
    session.expire_all()
    rows = session.execute(
        select(Workflow).where(Workflow.parent_id == parent.id).order_by(Workflow.child_key)
    ).scalars()
    return list(rows)


def counters(session: Session, parent: Workflow) -> tuple[int, int, int]:
    """(started, ended, failed) on the parent row, freshly read."""
    reload(session, parent)
    return parent.children_started, parent.children_ended, parent.children_failed


__all__ = ["children_of", "counters", "reload", "run_due"]

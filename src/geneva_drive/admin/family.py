"""A workflow's family for ``show``: its parent, and its children by state with links.

Read by one row for the workflow (its parent joined) and, for a parent, one grouped count
and one page of children by key: a parent of 10,000 children costs its count's index range
and the page, not 10,000 rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from geneva_drive.storage.queries import children as q

CHILDREN_LISTED = 50  # children linked from show(); the counts cover all of them


@dataclass(frozen=True)
class Relative:
    """A parent or a child, as linked from ``show``."""

    id: int
    workflow_type: str
    state: str
    key: str | None  # a child's key among its parent's children


@dataclass(frozen=True)
class Family:
    parent: Relative | None  # the workflow that started this one, if any
    key: str | None  # this workflow's key among its parent's children
    children_started: int
    children_ended: int
    children_failed: int  # ended canceled
    children_by_state: dict[str, int]
    children: tuple[Relative, ...]  # the first CHILDREN_LISTED by key

    @property
    def has_children(self) -> bool:
        return self.children_started > 0 or bool(self.children_by_state)


def family(session: Session, workflow_id: int) -> Family | None:
    """The family of one workflow; None when it has neither parent nor children."""
    row = q.family_of(session, workflow_id)
    if row is None or (row.parent_id is None and not row.children_started):
        return None
    parent = None
    if row.parent_id is not None:
        parent = Relative(row.parent_id, row.parent_type or "?", row.parent_state or "gone", None)
    by_state: dict[str, int] = {}
    children: tuple[Relative, ...] = ()
    if row.children_started:
        by_state = q.counts_by_state(session, workflow_id)
        children = tuple(
            Relative(c.id, c.type, c.state, c.child_key)
            for c in q.children_page(session, workflow_id, limit=CHILDREN_LISTED)
        )
    return Family(
        parent=parent,
        key=row.child_key,
        children_started=row.children_started,
        children_ended=row.children_ended,
        children_failed=row.children_failed,
        children_by_state=by_state,
        children=children,
    )

"""Finding workflows: filtered, keyset-paginated, bounded."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from geneva_drive.admin import MAX_PAGE
from geneva_drive.admin.filters import WorkflowFilter
from geneva_drive.core.errors import AdminInputError
from geneva_drive.storage.queries import admin as q


@dataclass(frozen=True)
class WorkflowSummary:
    id: int
    workflow_type: str
    state: str
    hero_type: str | None
    hero_id: str | None
    # The step it stands at: the one it performs, will run (ready, waiting) or stopped at
    # (paused, canceled); None once finished. What the ``current_step`` filter matches.
    current_step: str | None
    next_step: str | None  # the stored next_step_name column, as it is; read current_step
    created_at: datetime
    transitioned_at: datetime | None
    updated_at: datetime
    awaiting_signal: str | None
    wait_deadline: datetime | None
    last_error_class: str | None
    waiting_since: datetime | None = None  # when its waiting execution parked


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
    """One page of the workflows ``where`` selects, by creation time; ``after`` a page's
    ``next_cursor`` for the next one."""
    if not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise AdminInputError(f"find(limit={limit!r}): expected an int from 1 to {MAX_PAGE}")
    key = None if after is None else decode_cursor(after, newest_first)
    rows = q.workflow_page(session, where, newest_first=newest_first, limit=limit + 1, after=key)
    more, rows = len(rows) > limit, rows[:limit]
    items = summaries(session, rows)
    last = items[-1] if more else None
    cursor = None if last is None else encode_cursor(last.created_at, last.id, newest_first)
    return Page(items=items, next_cursor=cursor)


def summaries(session: Session, rows: Any) -> tuple[WorkflowSummary, ...]:
    """Summaries of workflow rows, with their waits and last errors (two queries a page)."""
    ids = [row.id for row in rows]
    waits = q.waits_of(session, ids)
    errors = q.last_errors_of(session, ids)
    no_wait = (None, None, None)
    return tuple(_summary(row, waits.get(row.id, no_wait), errors.get(row.id)) for row in rows)


def _summary(row: Any, wait: tuple[Any, Any, Any], error: str | None) -> WorkflowSummary:
    return WorkflowSummary(
        id=row.id,
        workflow_type=row.type,
        state=row.state,
        hero_type=row.hero_type,
        hero_id=row.hero_id,
        current_step=row.current_step_name or row.next_step_name,
        next_step=row.next_step_name,
        created_at=row.created_at,
        transitioned_at=row.transitioned_at,
        updated_at=row.updated_at,
        awaiting_signal=wait[0],
        wait_deadline=wait[1],
        last_error_class=error,
        waiting_since=wait[2],
    )


def count(
    session: Session, where: WorkflowFilter = WorkflowFilter(), *, cap: int = 10_000
) -> BoundedCount:
    """How many workflows ``where`` selects, up to ``cap`` (then ``exact`` is False)."""
    if not isinstance(cap, int) or cap < 1:
        raise AdminInputError(f"count(cap={cap!r}): expected a positive int")
    value = q.capped_count(session, where, cap)
    return BoundedCount(value=min(value, cap), exact=value <= cap)


# -- the cursor: opaque to callers, a keyset to us -------------------------------------------


def encode_cursor(created_at: datetime, workflow_id: int, newest_first: bool) -> str:
    data = {"t": created_at.isoformat(), "i": workflow_id, "d": "desc" if newest_first else "asc"}
    raw = json.dumps(data, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, newest_first: bool) -> tuple[datetime, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
        key = (datetime.fromisoformat(data["t"]), int(data["i"]))
        direction = data["d"]
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise AdminInputError(
            f"find(after={cursor!r}): not a cursor this API gave out; pass a page's "
            "next_cursor unchanged, or None for the first page"
        ) from None
    if direction != ("desc" if newest_first else "asc"):
        raise AdminInputError(
            f"find(after=...): this cursor pages {direction}ending, but newest_first="
            f"{newest_first}; keep the order the first page was asked for"
        )
    return key

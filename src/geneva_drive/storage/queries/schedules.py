"""Schedule rows: read them, insert a class's, move one on to its next tick, pause, resume.

The guarded update :func:`advance_schedule` is what makes one worker the creator of a tick's
workflow: it moves ``next_tick`` on only if it still holds the tick the caller read. Racing
workers all run it; the first takes the row lock and commits, the others then find
``next_tick`` changed — PostgreSQL re-checks the condition on the committed row (READ
COMMITTED), InnoDB's UPDATE reads the latest committed version whatever the isolation level,
and SQLite has one writer — so they update nothing and create nothing. The unique index on
``(type, scheduled_tick)`` of workflows stays the last word behind it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import CursorResult, exists, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from geneva_drive.storage.models import ScheduleRow
from geneva_drive.storage.queries._sql import workflow_model


def schedule_rows(
    session: Session, workflow_types: Iterable[str] | None = None
) -> list[ScheduleRow]:
    """The schedule rows of these classes (all of them when None), by class name."""
    stmt = select(ScheduleRow).order_by(ScheduleRow.workflow_type)
    if workflow_types is not None:
        stmt = stmt.where(ScheduleRow.workflow_type.in_(list(workflow_types)))
    return list(session.execute(stmt).scalars())


def insert_schedule(session: Session, values: dict[str, Any]) -> bool:
    """Insert a class's schedule row unless another worker just did; True if this one did.

    In a savepoint, so that a lost race (the primary key refuses the row) leaves the rest of
    the caller's transaction alone — the same on every database.
    """
    try:
        with session.begin_nested():
            session.add(ScheduleRow(**values))
    except IntegrityError:
        return False
    return True


def advance_schedule(
    session: Session,
    workflow_type: str,
    *,
    expected_next: datetime | None,
    values: dict[str, Any],
    unless_paused: bool = True,
) -> bool:
    """Set ``values`` on the row if its ``next_tick`` is still ``expected_next`` (and it is
    not paused); True if it was (this transaction now owns that tick)."""
    row = ScheduleRow
    guard = row.next_tick.is_(None) if expected_next is None else row.next_tick == expected_next
    stmt = update(row).where(row.workflow_type == workflow_type, guard)
    if unless_paused:
        stmt = stmt.where(row.paused.is_(False))
    result: CursorResult[Any] = session.execute(  # type: ignore[assignment]
        stmt.values(values).execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


def set_paused(session: Session, workflow_type: str, paused: bool) -> bool:
    """Pause or resume a schedule; False if the class has no schedule row (SQLAlchemy's MySQL
    dialects count matched rows, not changed ones, so pausing a paused one is True too)."""
    stmt = (
        update(ScheduleRow)
        .where(ScheduleRow.workflow_type == workflow_type)
        .values(paused=paused)
        .execution_options(synchronize_session=False)
    )
    result: CursorResult[Any] = session.execute(stmt)  # type: ignore[assignment]
    return result.rowcount == 1


def tick_has_workflow(session: Session, workflow_type: str, tick: datetime) -> bool:
    """Whether a workflow of ``workflow_type`` was already created for ``tick``."""
    wf = workflow_model()
    stmt = select(exists().where(wf.type == workflow_type, wf.scheduled_tick == tick))
    return bool(session.execute(stmt).scalar())


def scheduled_types(session: Session) -> Sequence[str]:
    """The classes that have a schedule row."""
    return list(session.execute(select(ScheduleRow.workflow_type)).scalars())

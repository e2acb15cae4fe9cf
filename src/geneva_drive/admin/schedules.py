"""Schedules in the admin API: list them, pause one, resume one.

Plain functions over the caller's ``Session`` (nothing here commits), like the rest of the
admin API. A class is named by the class itself or by its workflow type (what the CLI and the
dashboard pass); the database's rows are listed whether or not this process defines the class.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from geneva_drive.core.errors import AdminNotFound
from geneva_drive.definition.workflow import Workflow, scheduled_classes
from geneva_drive.engine import schedules as engine
from geneva_drive.storage.queries import schedules as queries


@dataclass(frozen=True)
class ScheduleInfo:
    """One scheduled class. ``cron``/``timezone``: what its ticks are computed from (the
    class's own when this process defines it, else the row's); ``missed`` is known only from
    the class. ``next_tick`` is None for a class no worker has seen yet."""

    workflow_type: str
    cron: str
    timezone: str
    missed: str | None
    next_tick: datetime | None
    last_tick: datetime | None
    last_workflow_id: int | None
    paused: bool
    defined_here: bool


def schedules(session: Session) -> list[ScheduleInfo]:
    """Every schedule: the database's rows and the scheduled classes this process defines."""
    classes = {engine.identity_of(c): c for c in scheduled_classes()}
    rows = {row.workflow_type: row for row in queries.schedule_rows(session)}
    found = []
    for workflow_type in sorted({*classes, *rows}):
        cls, row = classes.get(workflow_type), rows.get(workflow_type)
        schedule = cls._schedule if cls is not None else None
        found.append(
            ScheduleInfo(
                workflow_type=workflow_type,
                cron=schedule.cron if schedule else row.cron if row else "",
                timezone=schedule.timezone if schedule else row.timezone if row else "",
                missed=schedule.missed if schedule else None,
                next_tick=row.next_tick if row else None,
                last_tick=row.last_tick if row else None,
                last_workflow_id=row.last_workflow_id if row else None,
                paused=row.paused if row else False,
                defined_here=cls is not None,
            )
        )
    return found


def pause_schedule(session: Session, workflow_class: type[Workflow] | str) -> ScheduleInfo:
    """Stop creating workflows for the class's ticks until :func:`resume_schedule`."""
    return _set_paused(session, workflow_class, True)


def resume_schedule(session: Session, workflow_class: type[Workflow] | str) -> ScheduleInfo:
    """Create workflows again; ticks that passed while paused follow the class's ``missed=``
    (``run_once``: one workflow for the newest; ``skip``: none)."""
    return _set_paused(session, workflow_class, False)


def _set_paused(
    session: Session, workflow_class: type[Workflow] | str, paused: bool
) -> ScheduleInfo:
    workflow_type, cls = _identify(workflow_class)
    if not engine.set_paused(session, workflow_type, paused, cls):
        known = ", ".join(s.workflow_type for s in schedules(session)) or "none"
        raise AdminNotFound(
            f"{'pause' if paused else 'resume'}_schedule({workflow_type!r}): no schedule of "
            f"that workflow type (schedules: {known}); a class gets one with "
            "schedule = Schedule(...), and its row when a worker that loads it first runs"
        )
    return next(s for s in schedules(session) if s.workflow_type == workflow_type)


def _identify(workflow_class: type[Workflow] | str) -> tuple[str, type[Workflow] | None]:
    if isinstance(workflow_class, type) and issubclass(workflow_class, Workflow):
        return engine.identity_of(workflow_class), workflow_class
    name = str(workflow_class)
    for cls in scheduled_classes():
        if engine.identity_of(cls) == name:
            return name, cls
    return name, None

"""Cron schedules: exactly one workflow per tick, however many workers run.

Every worker runs :func:`run_due_schedules` from its maintenance thread (each heartbeat), for
the scheduled classes it loads; there is no leader to lose. Per class, a pass:

1. inserts the class's schedule row if it has none (the first tick after now);
2. reads it; a paused row, or one whose next tick is still ahead, costs nothing more;
3. decides with :func:`plan_tick` (pure) which tick to run, if any, and the next tick;
4. moves the row on with a guarded update that holds only while ``next_tick`` is the one it
   read (``queries.schedules.advance_schedule``) — the one worker whose update matched creates
   the tick's workflow in the same transaction, the others do nothing;
5. the tick's workflow carries ``scheduled_tick``, unique per class in the database, so even
   a schedule row deleted and recreated by hand cannot make a tick run twice.

A class with no ``schedule`` costs no query: the pass only looks at classes that have one.
How late a tick runs: up to one heartbeat interval (``lease / 3``) after its time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from geneva_drive.core.settings import settings_of
from geneva_drive.definition.schedule import ON_TIME, Schedule
from geneva_drive.definition.workflow import Workflow, scheduled_classes
from geneva_drive.engine import starting
from geneva_drive.storage.db import session_factory
from geneva_drive.storage.models import ScheduleRow
from geneva_drive.storage.queries import schedules as queries

if TYPE_CHECKING:
    from geneva_drive.core.settings import Settings

log = logging.getLogger("geneva_drive.schedules")


@dataclass(frozen=True)
class TickPlan:
    """What a due schedule row becomes: the tick to create a workflow for (None: none) and
    the row's next tick (None: the expression matches nothing more)."""

    run: datetime | None
    next_tick: datetime | None


def plan_tick(
    schedule: Schedule, next_tick: datetime, last_tick: datetime | None, now: datetime
) -> TickPlan:
    """For a row due at ``next_tick`` (≤ ``now``): run the newest tick at or before now if it
    is on time (within ``ON_TIME``), or if it was missed and ``missed="run_once"``; never a
    tick at or before ``last_tick``. The next tick is the first one after now."""
    following = schedule.next_after(now)
    newest = schedule.latest_at_or_before(now)
    if newest is None or newest < next_tick or (last_tick is not None and newest <= last_tick):
        return TickPlan(None, following)
    on_time = now - newest <= ON_TIME
    if on_time or schedule.missed == "run_once":
        return TickPlan(newest, following)
    return TickPlan(None, following)  # missed="skip": only future ticks run


def identity_of(cls: type[Workflow]) -> str:
    return str(cls.__mapper_args__["polymorphic_identity"])


def run_due_schedules(
    config: Settings, classes: Iterable[type[Workflow]] | None = None
) -> list[Workflow]:
    """Create the workflows of the due ticks of ``classes`` (every scheduled class defined
    when None); the workflows this call created (others' ticks are left to them)."""
    scheduled = {identity_of(c): c for c in (scheduled_classes() if classes is None else classes)}
    scheduled = {k: c for k, c in scheduled.items() if c._schedule is not None}
    if not scheduled:
        return []
    factory = session_factory(config)
    now = config.clock.now()
    with factory() as session, session.begin():
        rows = {r.workflow_type: r for r in queries.schedule_rows(session, scheduled)}
        missing = [t for t in scheduled if t not in rows]
        for workflow_type in missing:
            queries.insert_schedule(session, _new_row(scheduled[workflow_type], now))
    created: list[Workflow] = []
    for workflow_type, row in rows.items():
        cls = scheduled[workflow_type]
        schedule = cls._schedule
        assert schedule is not None  # filtered above
        if (row.cron, row.timezone) != (schedule.cron, schedule.timezone):
            _follow_new_expression(factory(), cls, row, now)
        elif not row.paused and row.next_tick is not None and row.next_tick <= now:
            workflow = _run_tick(factory(), cls, row, now)
            if workflow is not None:
                created.append(workflow)
    return created


def _new_row(cls: type[Workflow], now: datetime) -> dict[str, object]:
    schedule = cls._schedule
    assert schedule is not None
    return {
        "workflow_type": identity_of(cls),
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "next_tick": schedule.next_after(now),
        "paused": False,
        "updated_at": now,
    }


def _run_tick(
    session: Session, cls: type[Workflow], row: ScheduleRow, now: datetime
) -> Workflow | None:
    schedule = cls._schedule
    assert schedule is not None and row.next_tick is not None
    plan = plan_tick(schedule, row.next_tick, row.last_tick, now)
    workflow_type = identity_of(cls)
    values: dict[str, object] = {"next_tick": plan.next_tick, "updated_at": now}
    if plan.run is not None:
        values["last_tick"] = plan.run
    with session, session.begin():
        if not queries.advance_schedule(
            session, workflow_type, expected_next=row.next_tick, values=values
        ):
            return None  # another worker moved it on (and created the tick's workflow)
        if plan.run is None:
            log.info(
                "%s: skipped missed tick(s) up to %s (missed='skip'); next tick %s",
                workflow_type,
                row.next_tick.isoformat(),
                plan.next_tick.isoformat() if plan.next_tick else "none",
            )
            return None
        if queries.tick_has_workflow(session, workflow_type, plan.run):
            return None  # the schedule row was recreated by hand: the tick already ran
        workflow = starting.create(
            cls,
            session,
            hero=None,
            allow_multiple=True,
            step_job_options=None,
            scheduled_tick=plan.run,
        )
        queries.advance_schedule(
            session,
            workflow_type,
            expected_next=plan.next_tick,
            values={"last_workflow_id": workflow.id},
            unless_paused=False,
        )
    log.info("%s: created workflow id=%s for tick %s", workflow_type, workflow.id, plan.run)
    return workflow


def _follow_new_expression(
    session: Session, cls: type[Workflow], row: ScheduleRow, now: datetime
) -> None:
    """A deploy changed the class's cron or time zone: ticks follow it from now on."""
    new = _new_row(cls, now)
    del new["workflow_type"], new["paused"]
    with session, session.begin():
        if queries.advance_schedule(
            session,
            row.workflow_type,
            expected_next=row.next_tick,
            values=new,
            unless_paused=False,
        ):
            log.info(
                "%s: schedule changed from %r (%s) to %r (%s); next tick %s",
                row.workflow_type,
                row.cron,
                row.timezone,
                new["cron"],
                new["timezone"],
                new["next_tick"],
            )


def set_paused(
    session: Session, workflow_type: str, paused: bool, cls: type[Workflow] | None
) -> bool:
    """Pause or resume ``workflow_type``'s schedule in ``session``'s transaction; False if it
    has no schedule row and ``cls`` (the class, when this process defines it) has no schedule.

    A class no worker has seen yet gets its row now, so that it can be paused before its first
    tick. Resuming changes nothing else: the next pass finds the ticks that passed meanwhile
    and treats them as missed ones (``missed=``).
    """
    if queries.set_paused(session, workflow_type, paused):
        return True
    if cls is None or cls._schedule is None:
        return False
    now = settings_of(session).clock.now()
    queries.insert_schedule(session, {**_new_row(cls, now), "paused": paused})
    return queries.set_paused(session, workflow_type, paused)

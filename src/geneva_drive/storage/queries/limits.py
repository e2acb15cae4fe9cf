"""Concurrency slots, their waiters, and the rate limits' start log (``engine.limits``).

Every statement here runs under the lock of its key's row (:func:`lock_key`), taken in the
transaction that then reads and writes the key's slots, waiters or starts. Lock order: the
workflow row first (the claim's), then the key rows in sorted order (``engine.limits``), then
nothing else: a holder of a key's lock waits for no other lock, so it commits promptly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from geneva_drive.core.states import ExecutionState
from geneva_drive.storage.dialects import dialect_of
from geneva_drive.storage.models import (
    LimitKey,
    LimitSlot,
    LimitWaiter,
    RateStart,
    StepExecution,
)
from geneva_drive.storage.queries._sql import in_state, workflow_model


def lock_key(session: Session, kind: str, key: str, now: datetime) -> None:
    """Create the key's row if it is new, and lock it until the transaction ends.

    ``FOR UPDATE`` (not SKIP LOCKED): the holder of a key's lock only ever commits a few
    statements later, and every taker and releaser of the key must go one after the other —
    a taker that skipped a locked key row could park while a releaser frees a slot, and
    neither would wake it. SQLite renders no ``FOR UPDATE``: geneva-drive's transactions hold
    its one write lock already (``BEGIN IMMEDIATE``).
    """
    table: Any = LimitKey.__table__
    locking = select(table.c.kind).where(table.c.kind == kind, table.c.key == key).with_for_update()
    if session.execute(locking).first() is not None:
        return
    row = {"kind": kind, "key": key, "created_at": now}
    dialect = dialect_of(session)
    if dialect.skips_conflicting_inserts:
        # A concurrent insert of the same key waits for the first to commit, then skips.
        session.execute(dialect.insert_skipping_conflicts(table).values(row))
    else:
        try:
            # MySQL/MariaDB: the duplicate is an error; a savepoint keeps the transaction.
            with session.begin_nested():
                session.execute(table.insert().values(row))
        except IntegrityError:
            pass  # inserted by another transaction meanwhile: lock that row
    session.execute(locking).first()


@dataclass(frozen=True)
class Holder:
    slot: int
    execution_id: int
    live: bool  # its execution is still in progress (else the slot is stale)


def holders(session: Session, key: str) -> list[Holder]:
    """The slots of ``key`` and whether each holder still runs. A slot whose execution
    ended (or was deleted) without releasing it is stale; the caller frees it."""
    live = in_state(StepExecution.state, ExecutionState.IN_PROGRESS)
    stmt = (
        select(LimitSlot.slot, LimitSlot.execution_id, StepExecution.id.is_not(None) & live)
        .outerjoin(StepExecution, StepExecution.id == LimitSlot.execution_id)
        .where(LimitSlot.key == key)
        .order_by(LimitSlot.slot)
    )
    return [Holder(int(s), int(e), bool(alive)) for s, e, alive in session.execute(stmt)]


def free_slots(session: Session, key: str, slots: Sequence[int]) -> None:
    if slots:
        session.execute(delete(LimitSlot).where(LimitSlot.key == key, LimitSlot.slot.in_(slots)))


def take_slot(
    session: Session, key: str, slot: int, execution_id: int, workflow_id: int, now: datetime
) -> None:
    """The unique (key, slot) primary key refuses a second holder of one slot, whatever a
    bug elsewhere might do; the key's lock means it is never refused in practice."""
    session.execute(
        insert(LimitSlot).values(
            key=key, slot=slot, execution_id=execution_id, workflow_id=workflow_id, taken_at=now
        )
    )


def release_slot(session: Session, execution_id: int) -> bool:
    """Free the slot ``execution_id`` holds; whether it held one."""
    result = session.execute(delete(LimitSlot).where(LimitSlot.execution_id == execution_id))
    return bool(getattr(result, "rowcount", 0))


def add_waiter(session: Session, execution_id: int, key: str, priority: int, now: datetime) -> None:
    drop_waiter(session, execution_id)
    session.execute(
        insert(LimitWaiter).values(execution_id=execution_id, key=key, priority=priority, since=now)
    )


def drop_waiter(session: Session, execution_id: int) -> None:
    session.execute(delete(LimitWaiter).where(LimitWaiter.execution_id == execution_id))


@dataclass(frozen=True)
class Woken:
    execution_id: int
    workflow_id: int
    step_name: str
    queue: str


def wake_waiters(
    session: Session, key: str, count: int, parked_until: datetime, now: datetime
) -> list[Woken]:
    """Make the first ``count`` waiters of ``key`` due now (priority, then the longest
    waiting), dropping waiters whose execution is no longer parked on the way."""
    woken: list[Woken] = []
    while len(woken) < count:
        batch = session.execute(
            select(
                LimitWaiter.execution_id,
                StepExecution.workflow_id,
                StepExecution.step_name,
                StepExecution.queue,
                StepExecution.scheduled_for,
                in_state(StepExecution.state, ExecutionState.SCHEDULED),
            )
            .outerjoin(StepExecution, StepExecution.id == LimitWaiter.execution_id)
            .where(LimitWaiter.key == key)
            .order_by(LimitWaiter.priority, LimitWaiter.since, LimitWaiter.execution_id)
            .limit(count - len(woken))
        ).all()
        if not batch:
            break
        ids = [row[0] for row in batch]
        session.execute(delete(LimitWaiter).where(LimitWaiter.execution_id.in_(ids)))
        parked = [row for row in batch if row[5] and row[4] == parked_until]
        if parked:
            session.execute(
                update(StepExecution)
                .where(StepExecution.id.in_([row[0] for row in parked]))
                .values(scheduled_for=now, updated_at=now)
                .execution_options(synchronize_session=False)
            )
        woken += [Woken(int(r[0]), int(r[1]), str(r[2]), str(r[3])) for r in parked]
    return woken


def rate_starts(session: Session, key: str, since: datetime) -> list[datetime]:
    """The starts of ``key`` after ``since``, oldest first (the sliding window)."""
    stmt = (
        select(RateStart.started_at)
        .where(RateStart.key == key, RateStart.started_at > since)
        .order_by(RateStart.started_at)
    )
    return list(session.scalars(stmt))


def record_start(
    session: Session, key: str, execution_id: int, now: datetime, before: datetime
) -> None:
    """Log a start of ``key``, and forget its starts at or before ``before`` (out of every
    window from now on): the log holds at most a window's worth per key."""
    session.execute(delete(RateStart).where(RateStart.key == key, RateStart.started_at <= before))
    session.execute(insert(RateStart).values(key=key, started_at=now, execution_id=execution_id))


# -- what an operator sees (admin.limits) ---------------------------------------------------


@dataclass(frozen=True)
class KeyUse:
    """One concurrency key: its holders (execution and workflow ids), its waiters' count."""

    key: str
    holders: tuple[tuple[int, int, datetime], ...]  # (execution id, workflow id, since)
    waiters: int
    workflow_types: tuple[str, ...]


def concurrency_use(session: Session) -> list[KeyUse]:
    """Every concurrency key with a holder or a waiter, by key. Stale slots (their execution
    no longer in progress) are not shown: the next taker of the key frees them."""
    wf = workflow_model()
    live = in_state(StepExecution.state, ExecutionState.IN_PROGRESS)
    held = session.execute(
        select(
            LimitSlot.key,
            LimitSlot.execution_id,
            LimitSlot.workflow_id,
            LimitSlot.taken_at,
            wf.type,
        )
        .join(StepExecution, StepExecution.id == LimitSlot.execution_id)
        .join(wf, wf.id == LimitSlot.workflow_id)
        .where(live)
        .order_by(LimitSlot.key, LimitSlot.taken_at)
    ).all()
    waiting = session.execute(
        select(LimitWaiter.key, func.count(), func.min(wf.type))
        .join(StepExecution, StepExecution.id == LimitWaiter.execution_id)
        .join(wf, wf.id == StepExecution.workflow_id)
        .where(in_state(StepExecution.state, ExecutionState.SCHEDULED))
        .group_by(LimitWaiter.key)
    ).all()
    keys: dict[str, dict[str, Any]] = {}
    for key, execution_id, workflow_id, since, type_ in held:
        entry = keys.setdefault(key, {"holders": [], "waiters": 0, "types": set()})
        entry["holders"].append((int(execution_id), int(workflow_id), since))
        entry["types"].add(type_)
    for key, count, type_ in waiting:
        entry = keys.setdefault(key, {"holders": [], "waiters": 0, "types": set()})
        entry["waiters"] = int(count)
        entry["types"].add(type_)
    return [
        KeyUse(key, tuple(e["holders"]), e["waiters"], tuple(sorted(e["types"])))
        for key, e in sorted(keys.items())
    ]


def rate_use(session: Session, since: datetime) -> list[tuple[str, int, datetime | None]]:
    """(key, starts after ``since``, the last start) per rate-limit key."""
    rows = session.execute(
        select(RateStart.key, func.count(), func.max(RateStart.started_at))
        .where(RateStart.started_at > since)
        .group_by(RateStart.key)
        .order_by(RateStart.key)
    )
    return [(str(k), int(n), last) for k, n, last in rows]

"""Concurrency slots, their waiters, and the rate limits' start log (``engine.limits``).

Slots: a key's ``n`` rows ``(key, slot)``, each free or naming the in-progress execution that
holds it. A step takes a free one ``FOR UPDATE SKIP LOCKED`` (:func:`take_free_slot`): takers
never wait for each other, and two of them never take one slot. Only when none is free does a
taker lock *every* slot row of the key, waiting this time (:func:`lock_slots`), before it
parks — and a release locks the slot row it frees before it looks for a waiter. So a release
either commits before the parker reads the slots (the parker sees the free slot and takes it)
or waits for the parker's commit (and then sees its waiter): never a waiter left behind.

Lock order: the workflow row (the claim's), then slot rows in slot order, or one rate key's
row (:func:`lock_key`). A transaction that frees a slot waits for no other lock after it:
waiter rows and their executions are taken ``SKIP LOCKED`` (:func:`wake_waiters`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, bindparam, delete, func, insert, select, update
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

# Where an execution keeps its keys (its metadata: ``{KEYS: {CONCURRENCY: …, "rate": …}}``),
# and the mark of one that parked (``engine.limits``); read in SQL by ``queries.handover``.
KEYS, CONCURRENCY, PARKED = "limit_keys", "concurrency", "limit_parked"


def _create_rows(session: Session, table: Any, rows: list[dict[str, Any]]) -> None:
    """Insert ``rows``, keeping those a concurrent transaction inserted first (it waits for
    that one to commit), in one statement and in the order given (slot order: two creators
    wait for each other's rows in the same order, never in a cycle).

    No savepoint: InnoDB undoes the whole transaction on a deadlock, savepoints included, so
    a savepoint around the insert turned a deadlock into "SAVEPOINT … does not exist". A
    deadlock here is now what it is: a transient error that abandons the claim (phase 1 is
    rolled back, nothing recorded, and the row is claimed again).
    """
    session.execute(dialect_of(session).insert_keeping_existing(table), rows)


def lock_key(session: Session, kind: str, key: str, now: datetime) -> None:
    """Create a rate key's row if it is new, and lock it until the transaction ends.

    ``FOR UPDATE``, waiting: counting the window and logging a start must happen one worker
    after another, and the holder commits a few statements later. SQLite renders no ``FOR
    UPDATE``: geneva-drive's transactions hold its one write lock already.
    """
    table: Any = LimitKey.__table__
    locking = select(table.c.kind).where(table.c.kind == kind, table.c.key == key).with_for_update()
    if session.execute(locking).first() is not None:
        return
    _create_rows(session, table, [{"kind": kind, "key": key, "created_at": now}])
    session.execute(locking).first()


def take_free_slot(
    session: Session, key: str, n: int, execution_id: int, workflow_id: int, now: datetime
) -> bool:
    """Take the first free slot below ``n`` that no other transaction is taking or freeing
    right now (``SKIP LOCKED``: never waits); whether one was taken.

    Where an UPDATE may read its own table in a sub-query (not MySQL/MariaDB), one
    statement: the sub-query locks the free row it picks, and the UPDATE takes it."""
    if dialect_of(session).combined_writes:
        from geneva_drive.storage.queries.bypass import connection_of, execute_direct

        params = {
            "p_key": key,
            "p_n": n,
            "p_execution_id": execution_id,
            "p_workflow_id": workflow_id,
            "p_taken_at": now,
        }
        return execute_direct(connection_of(session), _take_stmt(), params) is not None
    free = (
        select(LimitSlot.slot)
        .where(LimitSlot.key == key, LimitSlot.slot < n, LimitSlot.execution_id.is_(None))
        .order_by(LimitSlot.slot)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    slot = session.execute(free).scalar()
    if slot is None:
        return False
    _hold(session, key, [int(slot)], execution_id, workflow_id, now)
    return True


@functools.cache
def _take_stmt() -> Any:
    table: Any = LimitSlot.__table__
    free = (
        select(table.c.slot)
        .where(
            table.c.key == bindparam("p_key"),
            table.c.slot < bindparam("p_n"),
            table.c.execution_id.is_(None),
        )
        .order_by(table.c.slot)
        .limit(1)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    return (
        update(table)
        .where(table.c.key == bindparam("p_key"), table.c.slot == free)
        .values(
            execution_id=bindparam("p_execution_id"),
            workflow_id=bindparam("p_workflow_id"),
            taken_at=bindparam("p_taken_at"),
        )
        .returning(table.c.slot)
    )


def _hold(
    session: Session,
    key: str,
    slots: Sequence[int],
    execution_id: int | None,
    workflow_id: int | None,
    now: datetime | None,
) -> None:
    session.execute(
        update(LimitSlot)
        .where(LimitSlot.key == key, LimitSlot.slot.in_(list(slots)))
        .values(execution_id=execution_id, workflow_id=workflow_id, taken_at=now)
        .execution_options(synchronize_session=False)
    )


@dataclass(frozen=True)
class Holder:
    slot: int
    execution_id: int | None
    live: bool  # it names an execution still in progress (one that ended left it stale)


def lock_slots(session: Session, key: str, n: int, now: datetime) -> list[Holder]:
    """Every slot row of ``key`` below ``n``, created if missing, locked — waiting for the
    transactions taking or freeing one of them — and whether each holder still runs.

    The rows are locked alone, in slot order, and the holders' states read after, without
    locks: locking an execution in progress would wait for its phase 3, which waits for a
    slot row.
    """
    table: Any = LimitSlot.__table__
    rows = session.execute(
        select(table.c.slot, table.c.execution_id)
        .where(table.c.key == key, table.c.slot < n)
        .order_by(table.c.slot)
        .with_for_update()
    ).all()
    if len(rows) < n:
        have = {int(r[0]) for r in rows}
        missing = [{"key": key, "slot": s} for s in range(n) if s not in have]
        _create_rows(session, table, missing)
        rows = session.execute(
            select(table.c.slot, table.c.execution_id)
            .where(table.c.key == key, table.c.slot < n)
            .order_by(table.c.slot)
            .with_for_update()
        ).all()
    ids = [int(r[1]) for r in rows if r[1] is not None]
    running = set()
    if ids:
        running = set(
            session.scalars(
                select(StepExecution.id).where(
                    StepExecution.id.in_(ids),
                    in_state(StepExecution.state, ExecutionState.IN_PROGRESS),
                )
            )
        )
    return [
        Holder(int(s), None if e is None else int(e), e is not None and int(e) in running)
        for s, e in rows
    ]


def hold(
    session: Session, key: str, slot: int, execution_id: int, workflow_id: int, now: datetime
) -> None:
    """Take ``slot`` (locked by :func:`lock_slots`)."""
    _hold(session, key, [slot], execution_id, workflow_id, now)


def free_slots(session: Session, key: str, slots: Sequence[int]) -> None:
    """Free ``slots`` (locked by :func:`lock_slots`): stale ones."""
    if slots:
        _hold(session, key, slots, None, None, None)


def release_slot(session: Session, execution_id: int, key: str) -> int | None:
    """Free the slot ``execution_id`` holds (locking that row), then look for the first
    waiter of ``key`` no other release is waking (``SKIP LOCKED``, locking it): its execution
    id, or None. One round trip where the driver pipelines (psycopg): the server still runs
    the lookup after the UPDATE, lock wait included, with a snapshot of its own — so a
    waiter whose parker held the slot row is seen (see the module's docstring)."""
    # Imported here: the ORM bypass is the engine's; ``admin.limits`` reads this module too
    # and needs none of it (issue 42's start-up budget).
    from geneva_drive.storage.queries.bypass import connection_of, execute_pipelined

    session.flush()  # the ORM's pending writes first, as a session.execute() would
    _, waiter = execute_pipelined(
        connection_of(session),
        (_release_stmt(), {"p_execution_id": execution_id}),
        (_first_waiter_stmt(), {"p_key": key}),
    )
    return None if waiter is None else int(waiter[0])


@functools.cache
def _release_stmt() -> Any:
    table: Any = LimitSlot.__table__
    return (
        update(table)
        .where(table.c.execution_id == bindparam("p_execution_id"))
        .values(execution_id=None, workflow_id=None, taken_at=None)
    )


@functools.cache
def _first_waiter_stmt() -> Any:
    table: Any = LimitWaiter.__table__
    return (
        select(table.c.execution_id)
        .where(table.c.key == bindparam("p_key"))
        .order_by(table.c.priority, table.c.since, table.c.execution_id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )


def pass_slot(session: Session, from_id: int, to_id: int, workflow_id: int, now: datetime) -> bool:
    """Move the slot ``from_id`` holds to ``to_id`` (one statement, locking that row);
    whether it held one."""
    result = session.execute(
        update(LimitSlot)
        .where(LimitSlot.execution_id == from_id)
        .values(execution_id=to_id, workflow_id=workflow_id, taken_at=now)
        .execution_options(synchronize_session=False)
    )
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
    waiting), dropping waiters whose execution is no longer parked on the way.

    Nothing here waits for a lock: it runs after a slot row was freed (or taken), whose lock
    others wait for. The waiter rows are taken ``FOR UPDATE SKIP LOCKED``: one another
    release is waking at this moment is left to it (waking it twice would wake one waiter
    fewer). Their executions are locked ``SKIP LOCKED`` too, before anything is written:
    a parked execution another transaction holds is being claimed (an operator made it due:
    that claim drops its waiter row and takes the freed slot itself, or parks again) or
    moved by an operator. Waiting for it closed a cycle — the claim, holding the execution,
    waits for the waiter row this transaction holds (phase 3 then deadlocked, and its step
    ran again; tests/limits/test_deadlocks.py) — so it is left to that transaction, waiter
    row and all, and the next waiter is woken instead.
    """
    woken: list[Woken] = []
    busy: list[int] = []  # parked, held by another transaction: left to it
    while len(woken) < count:
        waiting = select(LimitWaiter.execution_id).where(LimitWaiter.key == key)
        if busy:
            waiting = waiting.where(LimitWaiter.execution_id.not_in(busy))
        batch = session.execute(
            waiting.order_by(LimitWaiter.priority, LimitWaiter.since, LimitWaiter.execution_id)
            .limit(count - len(woken))
            .with_for_update(skip_locked=True)
        ).all()
        if not batch:
            break
        ids = [int(row[0]) for row in batch]
        parked = and_(
            StepExecution.id.in_(ids),
            in_state(StepExecution.state, ExecutionState.SCHEDULED),
            StepExecution.scheduled_for == parked_until,
        )
        columns = (
            StepExecution.id,
            StepExecution.workflow_id,
            StepExecution.step_name,
            StepExecution.queue,
        )
        rows = session.execute(
            select(*columns).where(parked).with_for_update(skip_locked=True)
        ).all()
        if len(rows) < len(ids):  # some are no longer parked, or held: a read tells which
            held = set(session.scalars(select(StepExecution.id).where(parked)))
            busy += sorted(held - {int(r[0]) for r in rows})
        dropped = [i for i in ids if i not in busy]
        if dropped:
            session.execute(delete(LimitWaiter).where(LimitWaiter.execution_id.in_(dropped)))
        if not rows:
            continue
        session.execute(
            update(StepExecution)
            .where(StepExecution.id.in_([int(r[0]) for r in rows]))
            .values(scheduled_for=now, updated_at=now)
            .execution_options(synchronize_session=False)
        )
        woken += [Woken(int(r[0]), int(r[1]), str(r[2]), str(r[3])) for r in rows]
    return woken


def keys_with_room(session: Session) -> list[tuple[str, int]]:
    """Keys someone waits for that have slots free or stale (held by an execution no longer
    in progress, or gone), with how many: waiters no release will wake (housekeeping's).

    A plain read: the wake-up that follows locks what it writes, and a waiter woken when a
    slot is taken meanwhile only parks again."""
    live = and_(
        StepExecution.id == LimitSlot.execution_id,
        in_state(StepExecution.state, ExecutionState.IN_PROGRESS),
    )
    waited_for = select(LimitWaiter.key).distinct()
    rows = session.execute(
        select(LimitSlot.key, func.count())
        .outerjoin(StepExecution, live)
        .where(LimitSlot.key.in_(waited_for), StepExecution.id.is_(None))
        .group_by(LimitSlot.key)
        .order_by(LimitSlot.key)
    ).all()
    return [(str(key), int(count)) for key, count in rows]


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
        entry["holders"].append((int(execution_id or 0), int(workflow_id or 0), since))
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

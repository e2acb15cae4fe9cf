"""Fair claims: a key's turn takes the due row of the key served least recently.

A class with ``fairness_key`` stores each workflow's key on it and on each of its executions
(``fair_key``), and every key has a row in ``geneva_drive_fair_keys`` saying when a key's
turn last served it (a new key: never, :data:`NEVER`). A row with a key is claimed only by a
key's turn; the ordinary claim (``claims.claim_due_execution``, PostgreSQL's handover) takes
only rows without one, through partial indexes that hold only those (migration 0016). A
worker thread that loads a keyed class alternates the two kinds of turn while keys have due
rows (``engine.fair_turns``), so a class without a key is claimed and handed over with the
statements of a worker that loads none, and a keyed burst is never walked to find its rows.

A key's turn (:func:`claim_fairly`):

1. the key served least recently that has a due row, its row locked ``FOR UPDATE SKIP
   LOCKED``;
2. its oldest due row, claimed as the ordinary claim claims one (same conditions and order,
   same ``SKIP LOCKED``), through ``ix_geneva_drive_step_executions_fair``;
3. the key stamped served now, in the claim's transaction.

On PostgreSQL the three are one statement (:func:`_turn_stmt`, data-modifying CTEs), two
round trips fewer per keyed step, and after a workflow finishes they are part of the
handover's statement (``queries.handover``, :func:`least_recently_served_key`); MySQL/MariaDB
and SQLite send them one by one.

A key whose due rows this worker cannot claim (other workers hold them at this moment;
paused workflows; classes it has not loaded) gives nothing; the next key is tried, up to
:data:`KEYS_PER_CLAIM`. When every key with due rows is locked by other claims (more step
threads than keys), the turn is *shared*: it serves a key without its lock or stamp, each
thread starting one key further along the served order at each shared turn, so that the
claims in flight spread over the keys rather than all taking the first at once.

**The bound.** A key that gets a due row either is new (never served: it sorts first) or was
last served before every key served since. Each key that sorts before it is served at most
once before it (being served stamps it after it), so a key's first due step waits for at
most one key's turn per other key with due rows, plus the claims already in progress on
other workers; each thread takes an ordinary turn between two key turns. B's first step
behind A's 20,000: two claims. Under concurrent claims each of B's later steps waits for one
of A's as well: with 3 worker processes x 4 threads racing on A's 60 and B's 5, B's last
step starts among the first 2 x 5 + 2 x 12 (tests/fairness/test_worker_processes.py; the
places come from start times, which the 12 claims in flight may reorder by as many again).
(A thread whose last key's turn found no key due takes up to
``fair_turns.IDLE_ORDINARY_TURNS`` ordinary turns first, when rows without a key are due;
one whose last ordinary turn found nothing as many key turns.)

**Locks.** The key row lock is why two workers do not serve the same key at once: the second
skips it (``SKIP LOCKED``) and serves the next key, so concurrent claims spread over the
keys as one worker's successive claims do. It is taken before the claim's workflow and
execution locks, which are ``SKIP LOCKED`` too, and held to the claim's commit; the stamp
writes only that locked row. Nothing else locks a key row but housekeeping's pruning, which
skips locked rows too; a start inserts a new key's row (a plain read first, so an existing
row, perhaps locked, is never waited for). So a claim never waits. MySQL/MariaDB read the
candidate keys without locks, then lock them one by one by primary key, as their ordinary
claim does: a locking read there would lock the rows its ``EXISTS`` read too. SQLite renders
no ``FOR UPDATE``: the claim's ``BEGIN IMMEDIATE`` already holds the one write lock.

A worker that has loaded no keyed class never reaches this module: its claims are the
ordinary ones (``ClaimScope.fair``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    Integer,
    String,
    and_,
    bindparam,
    delete,
    exists,
    func,
    literal_column,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.orm import Session

from geneva_drive.core.states import ONGOING_WORKFLOW_STATES, ExecutionState
from geneva_drive.storage.dialects import dialect_of
from geneva_drive.storage.models import FairKey, StepExecution
from geneva_drive.storage.queries._sql import in_state, workflow_model
from geneva_drive.storage.queries.bypass import connection_of, execute_direct
from geneva_drive.storage.queries.claims import (
    ClaimScope,
    Shape,
    _claim_locked,
    _claim_stmt,
    _core_claim,
    _mysql_lock_first_claimable,
    first_in_order,
    load_claimed,
)

# When a key that no fair claim has served yet was served: before any that was.
NEVER = datetime(1970, 1, 1, tzinfo=UTC)
# How many keys one turn tries (each other worker may hold one) before it gives up its lock.
KEYS_PER_CLAIM = 8


def register_keys(session: Session, keys: Sequence[str]) -> None:
    """Give each of ``keys`` a row, never served, if it has none.

    A plain read first: an existing row is left alone, never waited for (a claim may hold
    it). A new one is inserted, keeping one a concurrent start inserted first (it waits for
    that start's commit) — with no savepoint: on MariaDB a deadlock undoes the whole
    transaction, savepoints included, and the caller's create() would fail with "SAVEPOINT
    does not exist" instead (the slots' rows are created the same way, ``queries.limits``).
    """
    table: Any = FairKey.__table__
    wanted = sorted(set(keys))
    found = set(session.scalars(select(table.c.key).where(table.c.key.in_(wanted))))
    missing = [{"key": key, "served_at": NEVER} for key in wanted if key not in found]
    if missing:
        session.execute(dialect_of(session).insert_keeping_existing(table), missing)


class KeyTurn(NamedTuple):
    """What a key's turn did: the row it claimed (execution id, workflow id), if any;
    whether some key had a due row (``keys_due``: false, the keys are idle); and whether it
    found every key locked by other claims (``shared``, see :func:`claim_fairly`)."""

    claimed: tuple[int, int] | None
    keys_due: bool
    shared: bool = False


def claim_fairly(
    session: Session, now: datetime, scope: ClaimScope, shared_turns: int = 0
) -> KeyTurn:
    """A key's turn: claim as :func:`claims.claim_due_execution` does, from the rows of the
    key served least recently that has a due row (see the module docstring).

    ``shared_turns``: how many turns of this caller found every key locked (``shared``)
    before: such a turn starts at that key of the served order, modulo their number."""
    tried: list[str] = []
    in_one_statement = dialect_of(session).windowed_claim
    for _ in range(KEYS_PER_CLAIM):
        if in_one_statement:
            found, claimed = _turn_in_one_statement(session, now, scope, tried)
            if found is None:
                break
            tried.append(found)
            if claimed is not None:
                return KeyTurn(claimed, keys_due=True)
            continue
        key = _lock_least_recently_served(session, now, scope, tried)
        if key is None:
            break
        tried.append(key)
        claimed = _claim_of_key(session, now, scope, key)
        if claimed is not None:
            # The row this claim locked: no wait.
            session.execute(_stamp_stmt(), {"served_key": key, "served_now": now})
            return KeyTurn(claimed, keys_due=True)
    # Every key left is being served by another claim at this moment (its row locked). With
    # more step threads than keys, that is most claims: they serve the keys anyway, without
    # the lock and the stamp — each thread its next key of the served order, not the first:
    # the stamps of the claims in flight are not committed yet, so taking the first, every
    # such claim took the same key at once (with 3 workers x 4 threads and two tenants, b's
    # last step came at place 36 of 65 in one run of nine, at most 15 spread so).
    params = {**_params(now, scope), "tried": tried}
    unlocked = list(session.scalars(_keys_stmt(queued=bool(scope.queues), locked=False), params))
    if unlocked:
        start = shared_turns % len(unlocked)
        unlocked = unlocked[start:] + unlocked[:start]
    for key in unlocked:
        claimed = _claim_of_key(session, now, scope, str(key))
        if claimed is not None:
            return KeyTurn(claimed, keys_due=True, shared=True)
    return KeyTurn(None, keys_due=bool(tried or unlocked), shared=bool(unlocked))


def _turn_in_one_statement(
    session: Session, now: datetime, scope: ClaimScope, tried: list[str]
) -> tuple[str | None, tuple[int, int] | None]:
    """PostgreSQL: the three steps of a key's turn in one statement (:func:`_turn_stmt`): the
    key it locked (None: no key with a due row is free) and the rows it claimed, if any."""
    params = {**_params(now, scope), "tried": tried}
    stmt = _turn_stmt(bool(scope.queues), scope.shape)
    row = execute_direct(connection_of(session), stmt, params)
    if row is None:
        return None, None
    values = dict(zip(_turn_labels(stmt), row, strict=True))
    if values["e_id"] is None:
        return str(values["f_key"]), None
    return str(values["f_key"]), load_claimed(session, values)


@functools.lru_cache(maxsize=8)
def _turn_stmt(queued: bool, shape: Shape) -> Any:
    """A key's turn as one statement, its steps as data-modifying CTEs: ``k``, the key
    :func:`_keys_stmt` locks; ``c``, the claim of its rows (:func:`_windowed_key_claim`'s,
    the key read from ``k`` instead of a parameter); ``t``, the key's stamp, written only if
    ``c`` claimed a row. One row (the key, whether it was stamped, the claimed rows' columns
    or NULLs) if a key was locked, none otherwise. Every CTE runs with the statement's
    snapshot; ``t`` writes the row ``k`` locked, and the claim's locks are ``SKIP LOCKED``
    as in three statements, so it waits for no lock either. It saves two of the three round
    trips of each keyed step's claim."""
    keys: Any = FairKey.__table__
    k = _keys_stmt(queued=queued, locked=True).cte("k")
    key = select(k.c.key).scalar_subquery()

    def claim_of(row: Any) -> Any:
        claim = _claim_stmt(
            by_id=False, queued=queued, candidates_first=False, shape=shape, row=row
        )
        return _core_claim(claim)

    c = first_in_order(claim_of, queued=queued, due=True, keyed=True, key=key).cte("c")
    stamp = (
        update(keys)
        .where(keys.c.key == key, select(c.c.e_id).exists())
        .values(served_at=bindparam("now"))
        .returning(keys.c.key)
        .cte("t")
    )
    stamped = select(func.count()).select_from(stamp).scalar_subquery().label("f_stamped")
    return select(k.c.key.label("f_key"), stamped, *c.c).select_from(k.outerjoin(c, true()))


@functools.lru_cache(maxsize=8)
def _turn_labels(stmt: Any) -> tuple[str, ...]:
    return tuple(stmt.selected_columns.keys())


def _lock_least_recently_served(
    session: Session, now: datetime, scope: ClaimScope, tried: list[str]
) -> str | None:
    params = _params(now, scope)
    params["tried"] = tried
    queued = bool(scope.queues)
    if not dialect_of(session).claims_candidates_then_locks:
        stmt = _keys_stmt(queued=queued, locked=True)
        found: str | None = session.execute(stmt, params).scalar_one_or_none()
        return found
    # MySQL/MariaDB: the candidates without locks, then each key's row alone (see module doc).
    candidates = session.scalars(_keys_stmt(queued=queued, locked=False), params)
    for key in list(candidates):
        if session.execute(_lock_key_stmt(), {"key": key}).first() is not None:
            return str(key)
    return None


def _claim_of_key(
    session: Session, now: datetime, scope: ClaimScope, key: str
) -> tuple[int, int] | None:
    params = _params(now, scope)
    params["fair_key"] = key
    queued = bool(scope.queues)
    dialect = dialect_of(session)
    if dialect.windowed_claim:
        return _claim_locked(session, _windowed_key_claim(queued, scope.shape), params)
    if dialect.claims_candidates_then_locks:
        stmt = _key_claim_stmt(queued=queued, shape=scope.shape, candidates_first=True)
        candidates = session.execute(stmt, params).all()
        return _mysql_lock_first_claimable(session, candidates, now, scope.queues)
    stmt = _key_claim_stmt(queued=queued, shape=scope.shape, candidates_first=False)
    return _claim_locked(session, _core_claim(stmt), params)


def _params(now: datetime, scope: ClaimScope) -> dict[str, Any]:
    params: dict[str, Any] = {"now": now, **scope.params}
    if scope.queues:
        params["queues"] = list(scope.queues)
    return params


@functools.lru_cache(maxsize=16)
def _key_claim_stmt(*, queued: bool, shape: Shape, candidates_first: bool) -> Any:
    """The ordinary claim (``claims._claim_stmt``) of the rows of one key (``fair_key``).

    MySQL/MariaDB: the key and the state equal, the rest in the index's order. SQLite: the
    key as a range and first in the ORDER BY, for the reason given at
    ``claims._scheduled_rows`` (with ``key = k`` SQLite read the due rows' index, past the
    other keys' rows).
    """
    stmt = _claim_stmt(
        by_id=False, queued=queued, candidates_first=candidates_first, shape=shape, keyed=True
    )
    key = bindparam("fair_key", type_=String)
    if candidates_first:
        return stmt.where(StepExecution.fair_key == key)
    return (
        stmt.where(StepExecution.fair_key >= key, StepExecution.fair_key <= key)
        .order_by(None)
        .order_by(StepExecution.fair_key, StepExecution.priority, StepExecution.scheduled_for)
    )


@functools.lru_cache(maxsize=8)
def _windowed_key_claim(queued: bool, shape: Shape) -> Any:
    """PostgreSQL: the key's due rows in claim order, each tried by primary key
    (``claims.first_in_order``), for the reason given there: joined, on analysed tables, the
    planner read every ready workflow for each claim (608 buffers at 300 due rows, 9,055 at
    3,000)."""

    def claim_of(row: Any) -> Any:
        claim = _claim_stmt(
            by_id=False, queued=queued, candidates_first=False, shape=shape, row=row
        )
        return _core_claim(claim)

    return first_in_order(claim_of, queued=queued, due=True, keyed=True)


def least_recently_served_key(queued: bool) -> Any:
    """The key a turn serves, locked ``FOR UPDATE SKIP LOCKED`` (PostgreSQL's handover takes
    a key's turn in its statement with it: ``queries.handover``)."""
    return _keys_stmt(queued=queued, locked=True, excluding=False)


def shared_key(queued: bool) -> Any:
    """The key a shared turn serves (see :func:`claim_fairly`), as a scalar subquery: of the
    first keys with a due row, the one at ``shared`` modulo their number, without a lock.
    PostgreSQL's handover serves it when it could lock no key (``queries.handover``)."""
    keys: Any = FairKey.__table__
    few = (
        _keys_stmt(queued=queued, locked=False, excluding=False)
        .add_columns(func.row_number().over(order_by=(keys.c.served_at, keys.c.key)).label("place"))
        .subquery("few")
    )
    count = select(func.count()).select_from(few).scalar_subquery()
    place = bindparam("shared", type_=Integer) % func.greatest(count, 1) + 1
    return select(few.c.key).where(few.c.place == place).scalar_subquery()


@functools.lru_cache(maxsize=16)
def _keys_stmt(*, queued: bool, locked: bool, excluding: bool = True) -> Any:
    """Keys in the order they were served that have a due row, leaving out those this turn
    ``tried`` (``excluding``); the first, locked ``SKIP LOCKED`` (``locked``), or the first
    few, unlocked.

    The due row is probed in the key's index alone, its workflow not read: joined to the
    workflows, the planner drove the probe from a read of every workflow. So a key whose due
    rows this worker cannot claim (paused workflows, classes it has not loaded, rows other
    workers hold) is found, its claim gives nothing, and the next key is tried. ``OFFSET
    0``: PostgreSQL would otherwise turn the probe into one hashed read of every keyed due
    row, per claim.
    """
    keys: Any = FairKey.__table__
    due = (
        select(StepExecution.id)
        .where(
            StepExecution.fair_key == keys.c.key,
            in_state(StepExecution.state, ExecutionState.SCHEDULED),
            StepExecution.scheduled_for <= bindparam("now"),
        )
        .offset(literal_column("0", Integer))
    )
    if queued:
        due = due.where(StepExecution.queue.in_(bindparam("queues", expanding=True)))
    stmt = select(keys.c.key).where(exists(due)).order_by(keys.c.served_at, keys.c.key)
    if excluding:
        stmt = stmt.where(keys.c.key.not_in(bindparam("tried", expanding=True)))
    if not locked:
        return stmt.limit(KEYS_PER_CLAIM)
    return stmt.limit(1).with_for_update(skip_locked=True)


@functools.cache
def _lock_key_stmt() -> Any:
    keys: Any = FairKey.__table__
    return (
        select(keys.c.key).where(keys.c.key == bindparam("key")).with_for_update(skip_locked=True)
    )


@functools.cache
def _stamp_stmt() -> Any:
    keys: Any = FairKey.__table__
    return (
        update(keys)
        .where(keys.c.key == bindparam("served_key"))
        .values(served_at=bindparam("served_now"))
        .execution_options(synchronize_session=False)
    )


def keys_of_ongoing_workflows(session: Session, among: Sequence[str] | None = None) -> set[str]:
    """The keys (``among`` these, if given) of the workflows not finished or canceled: those
    a step may still be scheduled for (a paused or waiting workflow's too). One branch per
    state, each a range of the workflows' state index, so it reads the ongoing workflows,
    never the history (an ``IN`` of the three states looked to SQLite's statistics like most
    of the table, and it read every workflow)."""
    wf = workflow_model()
    keyed = wf.fair_key.is_not(None) if among is None else wf.fair_key.in_(list(among))
    branches = [
        select(wf.fair_key).where(wf.state == literal_column(f"'{state.value}'", String), keyed)
        for state in sorted(ONGOING_WORKFLOW_STATES)
    ]
    return {str(key) for key in session.scalars(union_all(*branches))}


def any_key_scheduled(session: Session) -> bool:
    """Whether a scheduled execution has a fairness key: one probe of the fair claim's index
    (its predicate spelled as the index's, so PostgreSQL's and SQLite's partial index serves)."""
    e: Any = StepExecution.__table__
    keyed = and_(e.c.state == literal_column("'scheduled'", String), e.c.fair_key.is_not(None))
    return bool(session.scalar(select(exists().where(keyed))))


def every_key(session: Session) -> list[str]:
    """Every key that has a row, in order (housekeeping's read, never a claim's)."""
    table: Any = FairKey.__table__
    return [str(key) for key in session.scalars(select(table.c.key).order_by(table.c.key))]


def prune_idle_keys(session: Session, candidates: Sequence[str]) -> int:
    """Delete the rows of those of ``candidates`` (keys no ongoing workflow had when the
    caller looked) that still have none, in the caller's transaction; how many it deleted.

    Each candidate row is locked ``FOR UPDATE SKIP LOCKED`` first: a key a claim serves at
    this moment is left for the next pass, never waited for. Then, under those locks, the
    ongoing workflows of the locked keys are read again (READ COMMITTED: a new statement
    sees every commit before it): a create() of one of them that committed since the caller
    looked keeps its key's row.

    The race left: a create() that read its key's row (a plain read, :func:`register_keys`)
    before this deletion and commits after it has a workflow whose key has no row, which no
    key's turn serves. The next pass gives it one again (``register_keys`` of the keys of
    ongoing workflows, ``runtime.housekeeping.prune_fair_keys``), so its steps wait one
    housekeeping interval at most. Locking the row in create() would close it, at the price
    of a create() waiting for a claim that serves its key.
    """
    table: Any = FairKey.__table__
    lock = select(table.c.key).where(table.c.key.in_(list(candidates)))
    locked = list(session.scalars(lock.with_for_update(skip_locked=True)))
    if not locked:
        return 0
    still = keys_of_ongoing_workflows(session, among=locked)
    idle = sorted(set(locked) - still)
    if idle:
        gone = delete(table).where(table.c.key.in_(idle))
        session.execute(gone.execution_options(synchronize_session=False))
    return len(idle)

"""Concurrency and rate limits, enforced where a step starts: in phase 1, under its locks.

**Concurrency** (a slots table). A step with a concurrency key starts only holding one of
the key's ``n`` slots: rows ``(key, slot)`` of ``geneva_drive_limit_slots``, slot numbers
below ``n``, each free or naming its holder. The slot is taken in the transaction that starts
the step (phase 1: the claim's), and freed in the one that ends it (phase 3, or the lease
recovery of a crashed holder). When every slot is held, the claimed row is *parked* — left
``scheduled``, due at :data:`PARKED_UNTIL`, so no claim ever finds it, with a row in
``geneva_drive_limit_waiters`` — and the worker goes on to its next claim: it never holds a
row it would have to wait on, and never polls for a slot. The transaction that frees a slot
makes the next waiter due now and wakes a worker (NOTIFY on PostgreSQL, the backend's
wake-up elsewhere).

Why takers rarely wait: a free slot is taken ``FOR UPDATE SKIP LOCKED``, so steps of one key
start side by side. Only a taker that finds none locks every slot row of the key, waiting,
and looks again before it parks; a release locks the row it frees before it looks for a
waiter. One of the two therefore sees the other's work, and no waiter is left behind by a
release that committed between "all slots are held" and "park" (``queries.limits``).

Deadlocks: the lock order is the workflow row (the claim's), then a rate key's row, then
slot rows in slot order. A transaction that freed a slot never waits for another lock: phase
3 frees last; the waiter it wakes is taken ``SKIP LOCKED``, its execution too (a claim of
that execution, made due by an operator, holds it and waits for the waiter row — waiting
for it was a cycle that rolled phase 3 back and ran its step again; the claim takes the
freed slot itself); and a step it then starts (chaining, ``chaining``) takes only a slot free
at once (``SKIP LOCKED``) and is never rate-limited; without a free slot the row is left due
for an ordinary claim, which parks it. (MariaDB runs at READ COMMITTED, so these reads take
no gap locks; a release finds its slot row through the unique index on its execution.)
A key's slot rows are created by the first takers, and those may deadlock each other: no
savepoint is used (InnoDB undoes the whole transaction on a deadlock, and the savepoint's
rollback then failed in its place), so the error stays a deadlock, phase 1 is rolled back
whole, and the worker claims again (``runtime.worker``).

A slot passes on: when a step completes and its successor, inserted already started in the
same transaction, has the same concurrency key and no rate limit, the slot row is moved to
the successor (:func:`inherits_slot`, :func:`pass_on`) — where freeing it, looking for a
waiter and taking a slot again took four statements, and the successor needs no phase 1. On
PostgreSQL the move is part of the completing statement itself (``queries.executions``), which
then still commits as it is written. And when a workflow's last step completes on a backlog,
PostgreSQL's handover (``queries.handover``) passes the slot to the next workflow's first step
it claims if that has the same key and nobody waits for one of it — a waiter that parked while
the statement ran is seen by the next holder's end, late by one step, never left behind.
Otherwise it starts no limited step, and the finished step's slot is freed after it as above.

A slot left behind (its holder ended by a path that does not free it, or deleted by
retention) is *stale*: its execution is no longer in progress, and the next taker that finds
no free slot frees it. So the count is right even then; only a wake-up may be late.

**Rate limits** (a sliding-window log). A step with a rate key starts only if fewer than
``n`` starts of the key are logged after ``now - per``; its start is then logged
(``geneva_drive_rate_starts``). Counting and logging happen under the key's row lock
(``geneva_drive_limit_keys``), one worker after another. Over the limit, the row stays
``scheduled``, due when the oldest start that counts leaves the window — not run, not
failed, not a reattempt. Precision: any window of length ``per`` holds at most ``n`` starts
as stamped by the workers' clocks (the same ``now`` as the execution's ``started_at``), so
clocks that differ by ``d`` may let ``n`` starts fall in ``per - d`` of real time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from geneva_drive.core.errors import StepConfigurationError
from geneva_drive.core.ports import EnqueuedStep
from geneva_drive.definition.limits import MAX_KEY_LENGTH, StepLimits, keys_for, limits_of
from geneva_drive.engine.wakeups import enqueue_after_commit, enqueued_step
from geneva_drive.storage.queries import limits as queries

if TYPE_CHECKING:
    from geneva_drive.definition.steps import StepDefinition
    from geneva_drive.definition.workflow import Workflow
    from geneva_drive.storage.models import StepExecution

# Where a parked row is due: never, until a release makes it due now.
PARKED_UNTIL = datetime(3000, 1, 1, tzinfo=UTC)
# Where an execution keeps its keys (its metadata), computed when it is scheduled: by
# create() for a workflow's first step (:func:`keys_at_start`), by the transaction that
# schedules it for every later one (:func:`scheduled_keys`).
KEYS = queries.KEYS
# Instead of the keys, when a key callable failed as the execution was scheduled: the claim
# fails the step with it (no user code runs in the claim).
KEYS_ERROR = "limit_keys_error"
# Set on an execution the first time it parks: a later claim has a waiter row to drop.
PARKED = queries.PARKED
CONCURRENCY, RATE = queries.CONCURRENCY, "rate"
# How long past its window a start stays in the log. Each worker counts from its own ``now``,
# read before it waited for the key's lock: a worker whose ``now`` is later than another's
# must not forget starts that the other, admitted after it, still has to count.
FORGET_AFTER = timedelta(minutes=1)


@dataclass(frozen=True)
class Admission:
    """Whether the step may start now; the concurrency key whose slot it then holds."""

    started: bool
    holds: str | None = None


def scheduled_keys(workflow: Workflow, step_def: StepDefinition) -> dict[str, Any] | None:
    """The metadata a new execution of ``step_def`` is inserted with: its limit keys, computed
    now, when it is scheduled (None for a step without limits: the usual case, one look-up).

    A key callable that fails is not raised here — the transaction scheduling the step is
    another step's outcome or an operator's action, which it must not undo. The execution is
    stored with the error instead, and its claim fails the step with it, through the step's
    exception policies: a reattempt is scheduled anew and computes its keys again.
    """
    step_limits = limits_of(type(workflow), step_def)
    if step_limits is None:
        return None
    try:
        return {KEYS: keys_for(workflow, step_def, step_limits)}
    except StepConfigurationError as error:
        return {KEYS_ERROR: str(error)}


def keys_at_start(
    workflow: Workflow, step_def: StepDefinition, whose: str
) -> dict[str, Any] | None:
    """The metadata a workflow's first execution is inserted with (None for a step without
    limits): its keys, computed by create() (create_many(), start_child(), a schedule's tick)
    on the workflow not inserted yet, named by ``whose`` in errors.

    Unlike :func:`scheduled_keys`, a key callable that fails is raised: nothing is written
    yet, so create() refuses the workflow — its caller's mistake, told to its caller, rather
    than a first step that fails in a worker later.
    """
    step_limits = limits_of(type(workflow), step_def)
    if step_limits is None:
        return None
    return {KEYS: keys_for(workflow, step_def, step_limits, whose)}


# "Not computed yet" for ``scheduling.execution_values``'s ``keys`` (None means "no limits").
UNKNOWN = object()


def inherits_slot(
    held: str | None, keys: dict[str, Any] | None, step_limits: StepLimits | None
) -> bool:
    """Whether a step scheduled with ``keys`` may start on the slot of ``held`` — the
    concurrency key of the step that completes in this transaction: the same key, and no
    rate limit to admit it (each start is counted). Then the slot passes from one to the
    other (:func:`pass_on`): at most ``n`` still run, and the transaction waits for no lock."""
    if held is None or keys is None or step_limits is None or step_limits.rate is not None:
        return False
    return keys.get(KEYS) == {CONCURRENCY: held}


def constant_key(step_limits: StepLimits) -> str | None:
    """The concurrency key of a step whose key is no callable (class or step constant, or
    none: the owner's global key), as :func:`keys_for` would compute it; None otherwise."""
    concurrency = step_limits.concurrency
    if concurrency is None or callable(concurrency.key):
        return None
    owner = step_limits.concurrency_owner
    key = owner if concurrency.key is None else f"{owner}:{concurrency.key}"
    return key if len(key) <= MAX_KEY_LENGTH else None


def pass_on(
    session: Session, from_id: int, to: StepExecution, workflow_id: int, now: datetime
) -> None:
    """Give the slot ``from_id`` holds to ``to`` (:func:`inherits_slot`), in the transaction
    that completes ``from_id`` and inserts ``to`` in progress."""
    if not queries.pass_slot(session, from_id, to.id, workflow_id, now):
        # Impossible while ``from_id`` was in progress under this run (phase 3 checked it):
        # only a slot of an execution no longer in progress is ever freed by another.
        raise RuntimeError(
            f"execution {from_id} holds no concurrency slot to pass to execution {to.id}"
        )


def admit(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition,
    limits: StepLimits,
    now: datetime,
    *,
    chained: bool = False,
) -> Admission:
    """Take a slot and log a start, or park / postpone ``execution``. Under phase 1's locks.

    The keys were stored with the execution when it was scheduled (:func:`keys_at_start`,
    :func:`scheduled_keys`): no key callable runs here — except for a row scheduled before
    its step had limits (a deploy that added one, or an older version that computed a first
    step's keys at its claim), which has none stored and gets them once, now.

    ``chained``: the transaction did other work first (it completed the step before, and may
    have freed a slot), so it must wait for no lock: only a slot free at once is taken, and
    without one the row is left due for an ordinary claim, which parks it if need be.
    """
    keys = _stored_keys(execution)
    if keys is None:
        problem = execution.read_metadata(KEYS_ERROR)
        if problem is not None:
            raise StepConfigurationError(str(problem))
        # A row scheduled while its step had no limits, or by a version that stored no keys
        # for a first step: computed once and stored, as that version did.
        keys = keys_for(workflow, step_def, limits)
        execution.write_metadata(KEYS, keys)
    parked_before = bool(execution.read_metadata(PARKED))  # a waiter row to drop
    concurrency_key = keys.get(CONCURRENCY)
    concurrency = limits.concurrency if concurrency_key is not None else None
    rate_key = keys.get(RATE)
    if limits.rate is not None and rate_key is not None:
        # First (the lock order: a rate key's row, then slot rows), and a step over its rate
        # takes no slot it would have to give back.
        queries.lock_key(session, RATE, rate_key, now)
        window_start = now - limits.rate.per
        starts = queries.rate_starts(session, rate_key, window_start)
        if len(starts) >= limits.rate.n:
            # When the oldest start that keeps the window full leaves it.
            execution.scheduled_for = starts[len(starts) - limits.rate.n] + limits.rate.per
            enqueue_after_commit(session, enqueued_step(workflow, execution))
            return Admission(started=False)
    if concurrency is not None and concurrency_key is not None:
        if parked_before:  # made due by a release, or an operator
            queries.drop_waiter(session, execution.id)
        if chained:
            taken = queries.take_free_slot(
                session, concurrency_key, concurrency.n, execution.id, workflow.id, now
            )
            if not taken:
                enqueue_after_commit(session, enqueued_step(workflow, execution))
                return Admission(started=False)
        elif not _take_slot(session, workflow, execution, concurrency_key, concurrency.n, now):
            execution.scheduled_for = PARKED_UNTIL
            if not parked_before:
                execution.write_metadata(PARKED, True)
            queries.add_waiter(session, execution.id, concurrency_key, execution.priority, now)
            workflow.logger.info(
                "step %r waits for one of the %d slots of concurrency key %r",
                step_def.name,
                concurrency.n,
                concurrency_key,
            )
            return Admission(started=False)
    if limits.rate is not None and rate_key is not None:
        queries.record_start(
            session, rate_key, execution.id, now, now - limits.rate.per - FORGET_AFTER
        )
    return Admission(started=True, holds=concurrency_key if concurrency is not None else None)


def _take_slot(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    key: str,
    n: int,
    now: datetime,
) -> bool:
    """A free slot at once if there is one (SKIP LOCKED); else, every slot row locked, a
    free or stale one, or none (the caller parks the row)."""
    if queries.take_free_slot(session, key, n, execution.id, workflow.id, now):
        return True
    found = queries.lock_slots(session, key, n, now)
    stale = [h.slot for h in found if h.execution_id is not None and not h.live]
    queries.free_slots(session, key, stale)
    free = [h.slot for h in found if h.execution_id is None or not h.live]
    if not free:
        return False
    queries.hold(session, key, free[0], execution.id, workflow.id, now)
    # Stale slots freed beyond the one taken: a waiter each.
    _wake(session, key, len(free) - 1, now)
    return True


def _stored_keys(execution: StepExecution) -> dict[str, str] | None:
    keys = execution.read_metadata(KEYS)
    return keys if isinstance(keys, dict) else None


def release(session: Session, execution_id: int, key: str, now: datetime) -> None:
    """Free the slot ``execution_id`` holds and make the next waiter of ``key`` due now.

    In the transaction that ends the execution, under its workflow's lock, as its last
    writes; the wake-up goes out with its commit.
    """
    # The first waiter is found with the release, and locked: only then is it woken (with a
    # look at its execution), so a key nobody waits for costs one round trip.
    if queries.release_slot(session, execution_id, key) is not None:
        _wake(session, key, 1, now)


def _wake(session: Session, key: str, count: int, now: datetime) -> int:
    """Make up to ``count`` waiters of ``key`` due now, a wake-up each after commit: how many."""
    if count <= 0:
        return 0
    woken = queries.wake_waiters(session, key, count, PARKED_UNTIL, now)
    for row in woken:
        enqueue_after_commit(
            session,
            EnqueuedStep(
                row.execution_id, row.workflow_id, row.step_name, now, {"queue": row.queue}
            ),
        )
    return len(woken)


def wake_stranded(session: Session, now: datetime) -> int:
    """Wake the waiters of keys that have a slot free or stale (housekeeping's): how many.

    A waiter is woken by a release of its key. None comes when the holder ended by a path
    that frees nothing (its slot is stale), or when the release left the waiter to the
    transaction that held its execution (``queries.wake_waiters``) and that one rolled back
    without taking the slot. Waking one too many costs only a claim that parks it again."""
    return sum(_wake(session, key, room, now) for key, room in queries.keys_with_room(session))


def held_key(execution: StepExecution) -> str | None:
    """The concurrency key whose slot ``execution`` holds while in progress, if any."""
    keys = _stored_keys(execution)
    return None if keys is None else keys.get(CONCURRENCY)

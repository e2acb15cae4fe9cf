"""Concurrency and rate limits, enforced where a step starts: in phase 1, under its locks.

**Concurrency** (a slots table). A step with a concurrency key starts only holding one of
the key's ``n`` slots: a row ``(key, slot)`` of ``geneva_drive_limit_slots`` with a slot
number below ``n``, whose unique primary key admits one holder per slot. The slot is taken in
the transaction that starts the step (phase 1: the claim's), and freed in the one that ends
it (phase 3, or the lease recovery of a crashed holder). When every slot is held, the
claimed row is *parked* — left ``scheduled``, due at :data:`PARKED_UNTIL`, so no claim ever
finds it, with a row in ``geneva_drive_limit_waiters`` — and the worker goes on to its next
claim: it never holds a row it would have to wait on, and never polls for a slot. The
transaction that frees a slot makes the next waiters due now and wakes a worker (NOTIFY on
PostgreSQL, the backend's wake-up elsewhere).

Why a lock per key: "every slot is held, so park" and "free a slot, then wake a waiter"
must not interleave, or a release that committed between the check and the park would find
no waiter to wake, and the parked row would wait for ever. Both therefore lock the key's row
in ``geneva_drive_limit_keys`` first (``FOR UPDATE``; SQLite's write lock), so one runs
after the other. The lock is held from the check to the commit a few statements later.

Deadlocks: the lock order is the workflow row (the claim's), then key rows in sorted order,
then nothing. A transaction that holds a key row therefore never waits for anything but
another key row it sorts after. The one transaction that could break that order — phase 3,
which frees a slot and may then start another step (chaining, the next workflow's claim) —
never starts a limited step: it leaves it to an ordinary claim (``chaining``).

A slot left behind (its holder ended by a path that does not free it, or deleted by
retention) is *stale*: its execution is no longer in progress, and the next taker of the key
frees it before counting. So the count is right even then; only a wake-up may be late.

**Rate limits** (a sliding-window log). A step with a rate key starts only if fewer than
``n`` starts of the key are logged in the window ``(now - per, now]``; its start is then
logged (``geneva_drive_rate_starts``) and the log's entries older than the window dropped.
Over the limit, the row stays ``scheduled``, due when the oldest start that counts leaves
the window — not run, not failed, not a reattempt. Precision: any window of length ``per``
holds at most ``n`` starts as stamped by the workers' clocks (the same ``now`` as the
execution's ``started_at``), so clocks that differ by ``d`` may let ``n`` starts fall in a
window ``d`` shorter than ``per``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from geneva_drive.core.ports import EnqueuedStep
from geneva_drive.definition.limits import StepLimits, keys_for, limits_of
from geneva_drive.engine.wakeups import enqueue_after_commit, enqueued_step
from geneva_drive.storage.queries import limits as queries

if TYPE_CHECKING:
    from geneva_drive.definition.steps import StepDefinition
    from geneva_drive.definition.workflow import Workflow
    from geneva_drive.storage.models import StepExecution

# Where a parked row is due: never, until a release makes it due now.
PARKED_UNTIL = datetime(3000, 1, 1, tzinfo=UTC)
# Where an execution keeps its keys (its metadata), computed the first time it is claimed.
KEYS = "limit_keys"
CONCURRENCY, RATE = "concurrency", "rate"
# How long past its window a start stays in the log. Each worker counts from its own ``now``,
# read before it waited for the key's lock: a worker whose ``now`` is later than another's
# must not forget starts that the other, admitted after it, still has to count.
FORGET_AFTER = timedelta(minutes=1)


@dataclass(frozen=True)
class Admission:
    """Whether the step may start now; the concurrency key whose slot it then holds."""

    started: bool
    holds: str | None = None


def admit(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition,
    limits: StepLimits,
    now: datetime,
) -> Admission:
    """Take a slot and log a start, or park / postpone ``execution``. Under phase 1's locks.

    The keys are computed the first time (the application's key callables run here, like
    its preconditions) and stored in the execution's metadata; later claims of the same row
    reuse them.
    """
    keys = _stored_keys(execution)
    claimed_before = keys is not None  # then it may have parked: a waiter row to drop
    if keys is None:
        keys = keys_for(workflow, step_def, limits)
        execution.write_metadata(KEYS, keys)
    # Sorted: every transaction takes the key rows in one order (see the module docstring).
    for kind, key in sorted(keys.items()):
        queries.lock_key(session, kind, key, now)
    slot = None
    concurrency_key = keys.get(CONCURRENCY)
    if limits.concurrency is not None and concurrency_key is not None:
        slot = _free_slot(session, concurrency_key, limits.concurrency.n)
        if slot is None:
            execution.scheduled_for = PARKED_UNTIL
            queries.add_waiter(session, execution.id, concurrency_key, execution.priority, now)
            workflow.logger.info(
                "step %r waits for a slot of concurrency key %r (%d in progress)",
                step_def.name,
                concurrency_key,
                limits.concurrency.n,
            )
            return Admission(started=False)
    rate_key = keys.get(RATE)
    if limits.rate is not None and rate_key is not None:
        window_start = now - limits.rate.per
        starts = queries.rate_starts(session, rate_key, window_start)
        if len(starts) >= limits.rate.n:
            # When the oldest start that keeps the window full leaves it.
            execution.scheduled_for = starts[len(starts) - limits.rate.n] + limits.rate.per
            enqueue_after_commit(session, enqueued_step(workflow, execution))
            return Admission(started=False)
        queries.record_start(session, rate_key, execution.id, now, window_start - FORGET_AFTER)
    if slot is not None and concurrency_key is not None:
        if claimed_before:  # made due by an operator, say, rather than by a release
            queries.drop_waiter(session, execution.id)
        queries.take_slot(session, concurrency_key, slot, execution.id, workflow.id, now)
        return Admission(started=True, holds=concurrency_key)
    return Admission(started=True)


def _stored_keys(execution: StepExecution) -> dict[str, str] | None:
    keys = execution.read_metadata(KEYS)
    return keys if isinstance(keys, dict) else None


def _free_slot(session: Session, key: str, n: int) -> int | None:
    """The lowest free slot below ``n`` (stale ones freed first), or None when all are held."""
    found = queries.holders(session, key)
    queries.free_slots(session, key, [h.slot for h in found if not h.live])
    held = {h.slot for h in found if h.live}
    return next((slot for slot in range(n) if slot not in held), None)


def release(
    session: Session,
    workflow: Workflow | None,
    execution_id: int,
    key: str,
    step_def: StepDefinition | None,
    now: datetime,
) -> None:
    """Free the slot ``execution_id`` holds and make as many waiters due as slots are free.

    In the transaction that ends the execution, under its workflow's lock; the wake-ups go
    out with its commit. Without the step's definition (a class this process lacks), one
    waiter is woken: a woken row that finds no slot only parks again.
    """
    queries.lock_key(session, CONCURRENCY, key, now)
    queries.release_slot(session, execution_id)
    limits = limits_of(type(workflow), step_def) if workflow and step_def else None
    n = limits.concurrency.n if limits is not None and limits.concurrency is not None else 1
    live = sum(1 for h in queries.holders(session, key) if h.live)
    for woken in queries.wake_waiters(session, key, max(n - live, 0), PARKED_UNTIL, now):
        enqueue_after_commit(
            session,
            EnqueuedStep(
                woken.execution_id,
                woken.workflow_id,
                woken.step_name,
                now,
                {"queue": woken.queue},
            ),
        )


def held_key(execution: StepExecution) -> str | None:
    """The concurrency key whose slot ``execution`` holds while in progress, if any."""
    keys = _stored_keys(execution)
    return None if keys is None else keys.get(CONCURRENCY)

"""Signal rows and the executions that wait for or are attached to them.

Every look-up reloads what it finds (``populate_existing``): they run under the workflow row
lock, and a row another process committed before we took it must be seen as it is now, not as
an earlier read in this session left it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, String, bindparam, column, select, text
from sqlalchemy.orm import Session

from geneva_drive.core.states import ExecutionState
from geneva_drive.storage.models import (
    EXECUTIONS,
    SIGNALS,
    WORKFLOWS,
    Signal,
    StepExecution,
    UTCDateTime,
)
from geneva_drive.storage.queries._sql import in_state, text_array
from geneva_drive.storage.queries.coordination import NOTIFY_CHANNEL

CONSUMED = "consumed"


def find_delivery(session: Session, workflow_id: int, name: str, key: str) -> Signal | None:
    """The signal already delivered with this name and idempotency key, if any."""
    stmt = (
        select(Signal)
        .where(
            Signal.workflow_id == workflow_id,
            Signal.name == name,
            Signal.idempotency_key == key,
        )
        .execution_options(populate_existing=True)
    )
    return session.execute(stmt).scalar_one_or_none()


def unconsumed_signals(session: Session, workflow_id: int) -> Sequence[Signal]:
    """Signals not yet consumed, oldest first: the candidates at the gate and on resume."""
    stmt = (
        select(Signal)
        .where(Signal.workflow_id == workflow_id, Signal.state != CONSUMED)
        .order_by(Signal.created_at, Signal.id)
        .execution_options(populate_existing=True)
    )
    return session.execute(stmt).scalars().all()


def newest_signal_named(session: Session, workflow_id: int, name: str) -> Signal | None:
    stmt = (
        select(Signal)
        .where(Signal.workflow_id == workflow_id, Signal.name == name)
        .order_by(Signal.created_at.desc(), Signal.id.desc())
        .limit(1)
        .execution_options(populate_existing=True)
    )
    return session.execute(stmt).scalar_one_or_none()


def parked_executions(session: Session, workflow_id: int) -> Sequence[StepExecution]:
    """The workflow's executions waiting for a signal, oldest first."""
    stmt = (
        select(StepExecution)
        .where(
            StepExecution.workflow_id == workflow_id,
            in_state(StepExecution.state, ExecutionState.WAITING),
        )
        .order_by(StepExecution.created_at, StepExecution.id)
        .execution_options(populate_existing=True)
    )
    return session.execute(stmt).scalars().all()


def executions_attached_to(session: Session, signal_id: int) -> Sequence[StepExecution]:
    """Every execution that carries ``signal_id``, oldest first."""
    stmt = (
        select(StepExecution)
        .where(StepExecution.signal_id == signal_id)
        .order_by(StepExecution.created_at, StepExecution.id)
    )
    return session.execute(stmt).scalars().all()


# -- the whole delivery in one statement (PostgreSQL) --------------------------------------


@dataclass(frozen=True)
class Delivered:
    """What the :func:`delivery` statement wrote: the signal, and the executions it woke."""

    signal_id: int
    woken: tuple[tuple[int, str], ...]  # (execution id, step name); each claimed the signal


def delivery(
    *,
    workflow_id: int,
    name: str,
    key: str | None,
    payload: Any,
    steps: Sequence[str],
    now: datetime,
    wake_queue: str | None,
    states: Sequence[str],
) -> tuple[Any, dict[str, Any]]:
    """The statement that inserts the signal and wakes what waits for it, or writes nothing;
    and its parameters. Run it with :func:`delivered` on the row it returns.

    The caller holds the workflow row lock, taken by a statement of its own *before* this
    one (in the same round trip: ``bypass.lock_workflow_state_with``): every writer of a
    workflow's executions takes that lock first, so this statement's snapshot — taken after
    the lock — is the truth until commit. (In one statement with the lock, the snapshot would
    predate a wait for the lock, and a row parked or woken by its holder would be missed.)
    It wakes every execution waiting on one of ``steps``, each claiming the signal once, and
    NOTIFYs ``wake_queue`` when it woke any.

    Writes nothing, and returns no row, whenever the caller has something to decide: the
    workflow is not in one of ``states`` (the lock's answer was not known when this was
    sent), the idempotency key was used already (``ON CONFLICT DO NOTHING``), a waiting row
    has a timer to disarm first, or another execution of the workflow is active (waking then
    breaks the one-active index — an error that would abort the caller's transaction, as
    this path takes no savepoint).
    """
    params: dict[str, Any] = {
        "workflow_id": workflow_id,
        "name": name,
        "key": key,
        "payload": payload,
        # Arrays in their text form (see _sql.text_array), cast by the statement.
        "steps": text_array(tuple(steps)),
        "states": text_array(tuple(str(state) for state in states)),
        "now": now,
    }
    if wake_queue is not None:
        params["channel"], params["queue"] = NOTIFY_CHANNEL, wake_queue
    return _delivery_stmt(wake_queue is not None), params


def delivered(row: Any) -> Delivered | None:
    """What the :func:`delivery` statement wrote; None if it wrote nothing."""
    if row is None:
        return None
    woken = tuple(zip(map(int, row[1] or ()), row[2] or (), strict=True))
    return Delivered(int(row[0]), woken)


@functools.cache
def _delivery_stmt(wake: bool) -> Any:
    """``p``: the rows to wake; ``go``: one row if the whole delivery can be done here (the
    workflow in one of the given states among them); ``s``:
    the signal's INSERT, from ``go``; ``x``: the wake-up, joined to ``s`` so it runs only
    for an inserted signal; and the NOTIFY, evaluated only if ``x`` woke a row."""
    notify = ", (SELECT pg_notify(:channel, :queue) FROM x LIMIT 1)" if wake else ""
    active = f"'{ExecutionState.SCHEDULED}', '{ExecutionState.IN_PROGRESS}'"
    sql = f"""
WITH p AS (
    SELECT e.id, e.metadata ->> '{TIMER_KEY}' AS timer_id
    FROM {EXECUTIONS} e
    WHERE e.workflow_id = :workflow_id AND e.state = '{ExecutionState.WAITING}'
      AND e.step_name = ANY(CAST(:steps AS text[]))
),
go AS (
    SELECT (SELECT count(*) FROM p) AS n
    WHERE EXISTS (
          SELECT 1 FROM {WORKFLOWS} w
          WHERE w.id = :workflow_id AND w.state = ANY(CAST(:states AS text[]))
      )
      AND NOT EXISTS (SELECT 1 FROM p WHERE p.timer_id IS NOT NULL)
      AND NOT EXISTS (
          SELECT 1 FROM {EXECUTIONS} a
          WHERE a.workflow_id = :workflow_id AND a.state IN ({active})
      )
),
s AS (
    INSERT INTO {SIGNALS} (workflow_id, name, idempotency_key, state, payload, claimed_at,
                           claimed, consumed, created_at, updated_at)
    SELECT :workflow_id, :name, :key, CASE WHEN go.n > 0 THEN 'claimed' ELSE 'pending' END,
           :payload, CASE WHEN go.n > 0 THEN :now END, go.n, 0, :now, :now
    FROM go
    ON CONFLICT (workflow_id, name, idempotency_key) DO NOTHING
    RETURNING id, claimed
),
x AS (  -- writer.woken_columns
    UPDATE {EXECUTIONS} e
    SET state = '{ExecutionState.SCHEDULED}', signal_id = s.id, scheduled_for = :now,
        waiting_since = NULL, updated_at = :now
    FROM s
    WHERE s.claimed > 0 AND e.id IN (SELECT id FROM p)
    RETURNING e.id, e.step_name
)
SELECT s.id,
       (SELECT array_agg(x.id ORDER BY x.id) FROM x),
       (SELECT array_agg(x.step_name ORDER BY x.id) FROM x){notify}
FROM s
"""
    returned = [column("id", BigInteger()), column("woken_ids"), column("woken_steps")]
    if wake:
        returned.append(column("notified"))
    typed = text(sql).bindparams(
        bindparam("workflow_id", type_=BigInteger()),
        bindparam("name", type_=String()),
        bindparam("key", type_=String()),
        bindparam("payload", type_=Signal.__table__.c.payload.type),
        bindparam("now", type_=UTCDateTime()),
    )
    return typed.columns(*returned)


TIMER_KEY = "timeout_execution_id"  # on a parked row (signals.py writes it): its timer's id

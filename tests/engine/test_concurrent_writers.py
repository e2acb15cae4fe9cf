"""Concurrent create(), signal() and operator verbs, each in its own session, all succeed.

On SQLite they used to read before writing, so a commit by anyone in between made the write
fail at once with "database is locked" (SQLite cannot move a read transaction's snapshot
forward). They now take the write lock first and so wait their turn within the busy timeout.
The same calls must of course succeed on PostgreSQL and MariaDB too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from geneva_drive import Signal, Workflow, immediate_transactions, step
from tests.support.app import Order

THREADS = 8


class ConcurrentSignals(Workflow):
    may_proceed_without_hero = True

    @step(wait_for="go")
    def wait(self) -> None:
        pass


class ConcurrentCreates(Workflow):
    @step
    def only(self) -> None:
        pass


def _in_threads(engine: Any, work: Callable[[Session, int], None]) -> list[BaseException]:
    """Run ``work(session, i)`` in THREADS threads at once, each with a session of its own."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        with Session(engine) as session:
            try:
                work(session, i)  # reads in a transaction of its own, commits, then waits
                session.commit()
            except BaseException as error:  # collected: the test reports every failure
                errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return errors


def _workflows(gd: Any, cls: type[Workflow], count: int) -> list[int]:
    with Session(gd.engine) as session:
        ids = [int(cls.create(session).id) for _ in range(count)]
        session.commit()
    return ids


def _start_together(count: int) -> threading.Barrier:
    return threading.Barrier(count, timeout=60)


def test_concurrent_signals_from_fresh_transactions_all_succeed(gd):
    (workflow_id,) = _workflows(gd, ConcurrentSignals, 1)
    together = _start_together(THREADS)

    def send(session: Session, i: int) -> None:
        wf = session.get(Workflow, workflow_id)
        session.commit()  # what the README advises: deliver in a fresh transaction
        together.wait()
        wf.signal("go", idempotency_key=f"delivery-{i}")

    assert _in_threads(gd.engine, send) == []
    with Session(gd.engine) as session:
        count = select(func.count()).select_from(Signal).where(Signal.workflow_id == workflow_id)
        assert session.scalar(count) == THREADS


def test_concurrent_creates_from_fresh_transactions_all_succeed(gd):
    with Session(gd.engine) as session:
        orders = [Order() for _ in range(THREADS)]
        session.add_all(orders)
        session.commit()
        order_ids = [order.id for order in orders]
    together = _start_together(THREADS)

    def create(session: Session, i: int) -> None:
        order = session.get(Order, order_ids[i])
        session.commit()
        together.wait()
        ConcurrentCreates.create(session, hero=order)

    assert _in_threads(gd.engine, create) == []
    with Session(gd.engine) as session:
        count = select(func.count()).select_from(ConcurrentCreates)
        assert session.scalar(count) == THREADS


def test_concurrent_operator_verbs_from_fresh_transactions_all_succeed(gd):
    ids = _workflows(gd, ConcurrentSignals, THREADS)
    together = _start_together(THREADS)

    def pause(session: Session, i: int) -> None:
        wf = session.get(Workflow, ids[i])
        session.commit()
        together.wait()
        wf.pause()

    assert _in_threads(gd.engine, pause) == []
    with Session(gd.engine) as session:
        states = session.scalars(select(Workflow.state).where(Workflow.id.in_(ids))).all()
        assert states == ["paused"] * THREADS


def _read_then_signal(engine: Any, workflow_id: int, key: str, between: Callable[[], None]) -> None:
    """The README's webhook handler: read the workflow, then signal it, in one transaction;
    ``between`` runs after the read (another request committing, say)."""
    with Session(engine) as session:
        wf = session.get(Workflow, workflow_id)
        assert wf is not None
        between()
        wf.signal("go", idempotency_key=key)
        session.commit()


def _someone_else_writes(gd: Any) -> None:
    with Session(gd.engine) as other:
        other.add(Order(status="elsewhere"))
        other.commit()


def test_on_sqlite_a_handler_that_reads_first_fails_if_someone_commits_before_its_signal(gd):
    # Why immediate_transactions exists: the deferred read transaction's snapshot is overtaken.
    if gd.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL and MariaDB lock the workflow row; there is no snapshot to lose")
    (workflow_id,) = _workflows(gd, ConcurrentSignals, 1)
    with pytest.raises(OperationalError, match="database is locked"):
        _read_then_signal(gd.engine, workflow_id, "k", lambda: _someone_else_writes(gd))


def test_a_handler_on_immediate_transactions_reads_then_signals_while_others_commit(gd):
    # The same handler on immediate_transactions(engine): the other writer waits for it (on
    # SQLite, within the busy timeout) instead of making it fail; elsewhere nothing changes.
    (workflow_id,) = _workflows(gd, ConcurrentSignals, 1)
    handler_engine = immediate_transactions(gd.engine)
    other = threading.Thread(target=_someone_else_writes, args=(gd,))

    _read_then_signal(handler_engine, workflow_id, "k", other.start)
    other.join(timeout=60)

    assert not other.is_alive()
    with Session(gd.engine) as session:
        count = select(func.count()).select_from(Signal).where(Signal.workflow_id == workflow_id)
        assert session.scalar(count) == 1
        assert session.scalar(select(func.count()).select_from(Order)) >= 1

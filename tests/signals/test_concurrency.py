"""Many senders, duplicates and a real worker at once: every signal is consumed exactly once."""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest
from sqlalchemy import func, select

from geneva_drive import Signal, StepExecution, Workflow, step
from geneva_drive.runtime.worker import Worker
from geneva_drive.storage.db import session_factory
from geneva_drive.testing import perform_next_step
from tests.signals._support import signals_of
from tests.support.app import AuditEntry, Order
from tests.worker._support import someone_waits_for_a_lock, wait_until_true

EVENTS = 4
COPIES = 3  # each event is delivered this many times (same idempotency key)


def _consume(workflow: Workflow) -> None:
    signal = workflow.received_signal
    workflow.session.add(
        AuditEntry(order_id=workflow.hero.id, note=f"{signal.idempotency_key}:{signal.id}")
    )


class SigConcurrentFour(Workflow):
    one = step(_consume, name="one", wait_for="event")
    two = step(_consume, name="two", wait_for="event")
    three = step(_consume, name="three", wait_for="event")
    four = step(_consume, name="four", wait_for="event")


def _all_finished(factory, ids):
    def check() -> bool:
        with factory() as s:
            left = s.execute(
                select(func.count())
                .select_from(Workflow)
                .where(Workflow.id.in_(ids), Workflow.state != "finished")
            ).scalar_one()
        return left == 0

    return check


def test_concurrent_senders_with_duplicates_and_a_running_worker_lose_and_repeat_nothing(
    gd, session, db_backend
):
    orders = [Order() for _ in range(3)]
    session.add_all(orders)
    session.flush()
    ids = [SigConcurrentFour.create(session, hero=o).id for o in orders]
    session.commit()

    # Every (workflow, event) delivered COPIES times, in a random order across 6 threads.
    deliveries = [(wf_id, n) for wf_id in ids for n in range(EVENTS) for _ in range(COPIES)]
    random.Random(4).shuffle(deliveries)
    chunks = [deliveries[i::6] for i in range(6)]
    factory = session_factory(gd)
    errors: list[BaseException] = []
    flags: Counter[bool] = Counter()
    flags_lock = threading.Lock()

    def sender(chunk) -> None:
        for wf_id, n in chunk:
            try:
                with factory() as s:
                    got = s.get(Workflow, wf_id).signal(
                        "event", payload={"n": n}, idempotency_key=f"wf{wf_id}-ev{n}"
                    )
                    duplicate = got.duplicate_delivery
                    s.commit()
                with flags_lock:
                    flags[duplicate] += 1
            except BaseException as error:
                errors.append(error)

    worker = Worker(config=gd, concurrency=1 if db_backend == "sqlite" else 4, poll_interval=0.05)
    worker_thread = threading.Thread(
        target=worker.run,
        kwargs={"until": _all_finished(factory, ids), "install_signals": False},
    )
    senders = [threading.Thread(target=sender, args=(chunk,)) for chunk in chunks]
    worker_thread.start()
    for thread in senders:
        thread.start()
    for thread in senders:
        thread.join(timeout=120)
    worker_thread.join(timeout=120)
    assert not worker_thread.is_alive(), "the worker did not finish the workflows in time"

    assert errors == []
    # The first copy of each event is new; every other copy is a duplicate.
    assert flags == {False: len(ids) * EVENTS, True: len(ids) * EVENTS * (COPIES - 1)}
    rows = session.execute(
        select(Signal.workflow_id, Signal.state, Signal.claimed, Signal.consumed)
    ).all()
    assert len(rows) == len(ids) * EVENTS
    assert {(state, claimed, consumed) for _, state, claimed, consumed in rows} == {
        ("consumed", 1, 1)
    }
    # Each workflow consumed each of its events exactly once, one per step.
    consumed = Counter(
        note.split(":")[0] for (note,) in session.execute(select(AuditEntry.note)).all()
    )
    assert consumed == Counter({f"wf{w}-ev{n}": 1 for w in ids for n in range(EVENTS)})
    outcomes = Counter(
        (name, state, outcome)
        for name, state, outcome in session.execute(
            select(StepExecution.step_name, StepExecution.state, StepExecution.outcome)
        )
    )
    assert outcomes == Counter(
        {(name, "completed", "success"): len(ids) for name in ("one", "two", "three", "four")}
    )


class SigRaceOnce(Workflow):
    @step(wait_for="approved")
    def approve(self) -> None:
        pass


def test_a_signal_waiting_for_the_lock_sees_what_its_holder_committed(gd, session, db_backend):
    # B's signal() waits for the workflow row lock that A holds while A's own signal wakes the
    # parked step. Once A commits, B must see the step woken (and leave its signal pending),
    # not the parked row of a snapshot taken before its wait: that is why the delivery's
    # statement runs only after a statement of its own has taken the lock.
    if db_backend != "postgresql":
        pytest.skip("the lock wait is watched in pg_stat_activity")
    (order,) = [Order()]
    session.add(order)
    session.flush()
    wf = SigRaceOnce.create(session, hero=order)
    session.commit()
    perform_next_step(wf)  # parks
    factory = session_factory(gd)
    errors: list[BaseException] = []

    with factory() as holder:
        first = holder.get(Workflow, wf.id).signal("approved")  # holds the lock, wakes
        first_id = first.id

        def second_sender() -> None:
            try:
                with factory() as s:
                    s.get(Workflow, wf.id).signal("approved")
                    s.commit()
            except BaseException as error:
                errors.append(error)

        sender = threading.Thread(target=second_sender)
        sender.start()
        wait_until_true(
            lambda: someone_waits_for_a_lock(gd.engine), "the second sender to wait for the lock"
        )
        holder.commit()
    sender.join(timeout=60)
    assert not sender.is_alive() and errors == []

    session.expire_all()
    rows = signals_of(session, wf)
    assert [(s.id == first_id, s.state, s.claimed) for s in rows] == [
        (True, "claimed", 1),
        (False, "pending", 0),
    ]
    woken = session.execute(
        select(StepExecution.signal_id).where(
            StepExecution.workflow_id == wf.id, StepExecution.state == "scheduled"
        )
    ).all()
    assert woken == [(first_id,)]

"""The async API in the caller's AsyncSession transaction: its commit wakes a worker, its
rollback leaves nothing and wakes nothing, and what it returns is usable in async code."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from geneva_drive import DatabaseBackend, Signal, StepExecution, Workflow, admin, step
from geneva_drive.runtime.configure import configured
from geneva_drive.runtime.worker import Worker
from tests.async_api.conftest import run
from tests.engine._support import RecordingBackend
from tests.support.app import Order
from tests.worker._support import DEADLINE, finished, wait_until_true

FOREVER = 600.0  # a poll interval the tests never wait out: only a wake-up runs the step


class AsyncApiOneStep(Workflow):
    @step
    def only(self) -> None:
        pass


class AsyncApiWaits(Workflow):
    @step(wait_for="approved")
    def approve(self) -> None:
        pass


def _count(session, model) -> int:
    return session.execute(select(func.count()).select_from(model)).scalar_one()


def test_a_rolled_back_acreate_leaves_no_row_and_wakes_nothing(gd, session, async_engine):
    backend = RecordingBackend()

    async def start_then_roll_back() -> None:
        async with AsyncSession(async_engine) as s:
            order = Order()
            s.add(order)
            await AsyncApiOneStep.acreate(s, hero=order)
            await s.rollback()

    with configured(backend=backend):
        run(start_then_roll_back())

    assert backend.enqueued == []
    assert (_count(session, Workflow), _count(session, StepExecution)) == (0, 0)


def test_a_committed_acreate_is_handed_to_the_backend_once_after_the_commit(
    gd, session, async_engine
):
    backend = RecordingBackend()
    seen_before_commit = []

    async def start() -> int:
        async with AsyncSession(async_engine, expire_on_commit=False) as s:
            order = Order()
            s.add(order)
            wf = await AsyncApiOneStep.acreate(s, hero=order)
            seen_before_commit.extend(backend.enqueued)
            await s.commit()
            return wf.id

    with configured(backend=backend):
        workflow_id = run(start())

    assert seen_before_commit == []
    (execution,) = session.execute(select(StepExecution)).scalars().all()
    assert [(s.workflow_id, s.execution_id) for s in backend.enqueued] == [
        (workflow_id, execution.id)
    ]


def test_a_commit_wakes_an_idle_worker_which_runs_the_step(gd, async_engine):
    # listen=False: the in-process wake-up the after-commit hook sends (see the next test for
    # PostgreSQL's NOTIFY); the poll interval is never reached.
    worker = Worker(config=gd, concurrency=2, poll_interval=FOREVER, listen=False)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()

    async def start() -> int:
        async with AsyncSession(async_engine, expire_on_commit=False) as s:
            order = Order()
            s.add(order)
            wf = await AsyncApiOneStep.acreate(s, hero=order)
            await s.commit()
            return wf.id

    try:
        wait_until_true(lambda: worker._wakeup.idle == 2, "both step threads to go idle")
        workflow_id = run(start())
        wait_until_true(finished(gd, workflow_id), "the workflow to finish")
        assert worker.steps_run == 1
    finally:
        worker.stop()
        thread.join(DEADLINE)
    assert not thread.is_alive()


def test_on_postgresql_the_async_commit_delivers_the_notify(gd, async_engine, db_backend):
    if db_backend != "postgresql":
        pytest.skip("NOTIFY is PostgreSQL's")
    worker = Worker(config=gd, concurrency=1, poll_interval=FOREVER)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()

    async def start() -> int:
        async with AsyncSession(async_engine, expire_on_commit=False) as s:
            wf = await AsyncApiOneStep.acreate(s, hero=Order())
            await s.commit()
            return wf.id

    try:
        wait_until_true(lambda: worker.listening, "the worker to LISTEN")
        wait_until_true(lambda: worker._wakeup.idle == 1, "the step thread to go idle")
        with configured(backend=DatabaseBackend()):  # not the worker's: its NOTIFY only
            workflow_id = run(start())
        wait_until_true(finished(gd, workflow_id), "the workflow to finish")
    finally:
        worker.stop()
        thread.join(DEADLINE)
    assert not thread.is_alive()


def test_a_signal_sent_twice_with_one_key_is_stored_once(gd, session, async_engine):
    async def deliver_twice() -> tuple[Signal, Signal]:
        async with AsyncSession(async_engine, expire_on_commit=False) as s:
            wf = await AsyncApiWaits.acreate(s, hero=Order())
            await s.commit()
            first = await wf.asignal("approved", {"by": "ann"}, idempotency_key="evt-7")
            await s.commit()
            again = await wf.asignal("approved", {"by": "ann"}, idempotency_key="evt-7")
            await s.commit()
            return first, again

    first, again = run(deliver_twice())

    assert (again.id, again.duplicate_delivery) == (first.id, True)
    assert _count(session, Signal) == 1


def test_the_uniqueness_error_is_the_sync_one(gd, session, async_engine):
    order = Order()
    session.add(order)
    holder = AsyncApiOneStep.create(session, hero=order)
    session.commit()
    with pytest.raises(Exception) as from_sync:
        AsyncApiOneStep.create(session, hero=order)
    session.rollback()

    async def again() -> None:
        async with AsyncSession(async_engine) as s:
            hero = await s.get(Order, order.id)  # the hero as the async session loads it
            await AsyncApiOneStep.acreate(s, hero=hero)

    with pytest.raises(Exception) as from_async:
        run(again())

    assert type(from_async.value) is type(from_sync.value)
    assert str(from_async.value) == str(from_sync.value)
    assert f"id={holder.id}" in str(from_async.value)


def test_what_acreate_returns_is_readable_without_awaiting(gd, async_engine):
    async def start() -> dict:
        async with AsyncSession(async_engine, expire_on_commit=False) as s:
            order = Order()
            s.add(order)
            wf = await AsyncApiOneStep.acreate(s, hero=order)
            await s.commit()
            # No lazy load may be left: outside run_sync it would need a greenlet.
            columns = {a.key: getattr(wf, a.key) for a in Workflow.__mapper__.column_attrs}
            return {"hero": wf.hero is order, **columns}

    seen = run(start())

    assert seen["hero"] is True
    assert (seen["state"], seen["next_step_name"], seen["type"]) == (
        "ready",
        "only",
        "AsyncApiOneStep",
    )


def test_operator_verbs_and_admin_twins_act_in_the_callers_transaction(gd, session, async_engine):
    async def pause_then_roll_back(workflow_id: int) -> list[str]:
        async with AsyncSession(async_engine, expire_on_commit=False) as s:
            wf = await s.get(Workflow, workflow_id)
            await wf.apause()
            seen = [wf.state]
            await s.rollback()
            result = await admin.apause(s, workflow_id, actor="ops", reason="async")
            seen.append(result.state_after)
            await s.commit()
            return seen

    wf = AsyncApiOneStep.create(session, hero=Order())
    session.commit()

    assert run(pause_then_roll_back(wf.id)) == ["paused", "paused"]
    session.expire_all()
    assert session.get(Workflow, wf.id).state == "paused"
    assert [t.actor for t in admin.show(session, wf.id).actions] == ["ops"]

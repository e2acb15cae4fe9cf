"""Many async steps in flight on one loop, holding no database connection while they await."""

from __future__ import annotations

import asyncio
import threading

from sqlalchemy import select

from geneva_drive import Workflow, step
from geneva_drive.engine.leases import RunningExecutions
from tests.async_steps._support import lane, wait_until
from tests.engine._support import reload
from tests.support.app import AuditEntry, Order

IN_FLIGHT = 20
gate: dict[str, object] = {}


class AwaitsTheGate(Workflow):
    @step
    async def call_the_gateway(self) -> None:
        # Every step waits here until all IN_FLIGHT are in their bodies at once: they can
        # only get there together if none of them holds one of the lane's 2 connections.
        gate["waiting"] = int(gate.get("waiting", 0)) + 1  # type: ignore[call-overload]
        release = gate.setdefault("release", asyncio.Event())
        assert isinstance(release, asyncio.Event)
        if gate["waiting"] == IN_FLIGHT:
            running = gate["running"]
            assert isinstance(running, RunningExecutions)
            gate["leased"] = len(running.ids())  # what the worker's heartbeat renews now
            release.set()
        await asyncio.wait_for(release.wait(), timeout=30)
        # Now the body touches the database: a connection is taken for it, then.
        self.async_session.add(AuditEntry(order_id=self.hero.id, note="after the gate"))


def test_steps_awaiting_io_hold_no_connection_so_more_run_than_the_pool_has(gd, session):
    gate.clear()
    gate["running"] = running = RunningExecutions()
    workflows = []
    for _ in range(IN_FLIGHT):
        hero = Order()
        session.add(hero)
        workflows.append(AwaitsTheGate.create(session, hero=hero))
    session.commit()

    with lane(gd, concurrency=IN_FLIGHT, pool_size=2, running=running) as the_lane:
        wait_until(lambda: all(reload(session, w).state == "finished" for w in workflows))
        peak = the_lane.peak_in_flight
        pool = the_lane.engine.sync_engine.pool

    assert gate["waiting"] == IN_FLIGHT
    assert peak == IN_FLIGHT  # all in their bodies at once, over a pool of 2
    assert gate["leased"] == IN_FLIGHT  # each one's lease is renewed while it awaits
    assert pool.size() == 2  # type: ignore[attr-defined]
    session.expire_all()
    notes = session.scalars(select(AuditEntry.note)).all()
    assert notes == ["after the gate"] * IN_FLIGHT


threads: set[int] = set()


class RecordsItsThread(Workflow):
    @step
    async def only(self) -> None:
        threads.add(threading.get_ident())


def test_the_lane_runs_on_one_thread(gd, session):
    threads.clear()
    heroes = [Order() for _ in range(5)]
    session.add_all(heroes)
    workflows = [RecordsItsThread.create(session, hero=hero) for hero in heroes]
    session.commit()
    with lane(gd, concurrency=5):
        wait_until(lambda: all(reload(session, w).state == "finished" for w in workflows))
    assert len(threads) == 1
    assert threading.get_ident() not in threads

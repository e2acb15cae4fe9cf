"""An idle async lane sleeps on its wake-ups: one claim per wake-up, not one per free slot.

The lane's transactions are counted on its own engine (every claim, every look for the next
due time is one); nothing here asserts how long anything took.
"""

from __future__ import annotations

import time
from datetime import timedelta

from sqlalchemy import event

from geneva_drive import Workflow, step
from geneva_drive.runtime.async_lane import AsyncLane
from tests.async_steps._support import lane, wait_until
from tests.engine._support import reload

SLOTS = 100
FOREVER = 3600.0  # a poll interval no test waits out: only a wake-up or a due time ends it


class Transactions:
    """Counts the transactions the lane begins on its engine (claims and idle-time queries)."""

    def __init__(self) -> None:
        self.count = 0

    def watch(self, the_lane: AsyncLane) -> None:
        event.listen(the_lane.engine.sync_engine, "begin", self._begun)

    def _begun(self, _connection: object) -> None:
        self.count += 1


class Later(Workflow):
    may_proceed_without_hero = True

    @step(wait=timedelta(seconds=1))
    async def only(self) -> None:
        pass


def test_an_idle_lane_of_a_hundred_slots_claims_once_before_it_sleeps(gd):
    transactions = Transactions()
    with lane(
        gd, concurrency=SLOTS, poll_interval=FOREVER, before_start=transactions.watch
    ) as the_lane:
        wait_until(lambda: the_lane.idle == SLOTS)
        # One claim that found nothing, and one look for the next due time: not one per slot.
        assert transactions.count <= 2


def test_an_idle_lane_makes_one_claim_per_poll_interval_whatever_its_slots(gd):
    poll = 0.05
    transactions = Transactions()
    with lane(gd, concurrency=SLOTS, poll_interval=poll, before_start=transactions.watch):
        began = time.monotonic()
        wait_until(lambda: transactions.count >= 20)
        intervals = (time.monotonic() - began) / poll
        counted = transactions.count
    # At most a claim and a look for the next due time per interval (an upper bound: a slow
    # host makes fewer, never more). A lane whose slots polled each made SLOTS per interval.
    assert counted <= 2 * (intervals + 2)


def test_a_commit_in_this_process_wakes_the_idle_lane_and_a_later_row_runs_when_due(
    gd, session, clock
):
    transactions = Transactions()
    subscribed: list[AsyncLane] = []

    def subscribe(the_lane: AsyncLane) -> None:
        transactions.watch(the_lane)
        gd.backend.subscribe(the_lane.wakeups)  # as the worker does: its commits wake the lane
        subscribed.append(the_lane)

    with lane(gd, concurrency=SLOTS, poll_interval=FOREVER, before_start=subscribe) as the_lane:
        wait_until(lambda: the_lane.idle == SLOTS)
        slept = the_lane.sleeps
        workflow = Later.create(session)
        session.commit()  # wakes the lane: it claims (nothing is due yet), then sleeps again
        wait_until(lambda: the_lane.sleeps > slept)
        # …until the row's due time, not the poll interval: it runs once the clock is there.
        clock.advance(seconds=2)
        wait_until(lambda: reload(session, workflow).state == "finished")
    for the_lane in subscribed:
        gd.backend.unsubscribe(the_lane.wakeups)

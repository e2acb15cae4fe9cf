"""What a checkpoint costs, and the guarantees that must survive making it cheap.

A committing checkpoint writes the cursor, checks that the execution is still ours and reads
the workflow's state in one statement (``UPDATE … RETURNING``; MariaDB, which has no
``UPDATE … RETURNING``, needs a second one), then commits. A checkpoint that does not commit
runs no SQL at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event

from geneva_drive import SystemClock, Workflow, resumable_step
from geneva_drive.core.settings import settings
from geneva_drive.engine.executor import RunOptions, run_execution
from geneva_drive.engine.recovery import recover_expired_leases
from geneva_drive.runtime.configure import configured
from tests.engine._support import current
from tests.resumable._support import (
    advance_clock,
    chain,
    notes,
    other_pause,
    reload,
    start,
    summary,
)
from tests.support.app import AuditEntry


def _walk(count: int) -> Any:
    def walk(wf: Workflow, it: Any) -> None:
        for item in it.iterate_over(range(count)):
            wf.session.add(AuditEntry(order_id=wf.hero.id, note=f"item {item}"))

    return walk


class ResumableCostPerItemTen(Workflow):
    walk = resumable_step(_walk(10))


class ResumableCostPerItemThirty(Workflow):
    walk = resumable_step(_walk(30))


class ResumableCostBatchedTen(Workflow):
    walk = resumable_step(_walk(10), checkpoint_every=10)


class ResumableCostBatchedThirty(Workflow):
    walk = resumable_step(_walk(30), checkpoint_every=10)


class ResumableCostRecoveredMidBatch(Workflow):
    @resumable_step(checkpoint_every=2)
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(range(10)):
            self.session.add(AuditEntry(order_id=self.hero.id, note=f"item {item}"))
            if item == 3 and not it.resumed:
                # This worker stalls past its lease; housekeeping recovers the execution
                # while items 2 and 3 are done but not yet checkpointed.
                advance_clock(seconds=120)
                assert recover_expired_leases() == 1


class ResumableCostPausedMidBatch(Workflow):
    @resumable_step(checkpoint_every=5)
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(range(15)):
            self.session.add(AuditEntry(order_id=self.hero.id, note=f"item {item}"))
            if item == 6 and not it.resumed:
                # No transaction of ours is open here (items 5-6 are not flushed yet), so the
                # operator's write does not wait for our next commit, even on SQLite.
                other_pause(self.id)


class ResumableCostRuntimeMidBatch(Workflow):
    @resumable_step(checkpoint_every=100, max_runtime=timedelta(seconds=5))
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(range(10)):
            self.session.add(AuditEntry(order_id=self.hero.id, note=f"item {item}"))
            advance_clock(seconds=1)


class ResumableCostRealClockRuntime(Workflow):
    @resumable_step(checkpoint_every=100, max_runtime=timedelta(microseconds=1))
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(range(10)):
            self.session.add(AuditEntry(order_id=self.hero.id, note=f"item {item}"))


@contextmanager
def counting() -> Iterator[dict[str, int]]:
    """Statements and commits on the configured engine inside the block.

    BEGINs and the INSERTs of the step's own rows are left out: how many statements those take
    (one per row, or one per flush) is the dialect's business, not the checkpoint's.
    """
    engine = settings().require_engine()
    counts = {"statements": 0, "commits": 0}

    def on_statement(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not statement.lstrip().upper().startswith(("BEGIN", "INSERT")):
            counts["statements"] += 1

    def on_commit(_conn: Any) -> None:
        counts["commits"] += 1

    event.listen(engine, "before_cursor_execute", on_statement)
    event.listen(engine, "commit", on_commit)
    try:
        yield counts
    finally:
        event.remove(engine, "before_cursor_execute", on_statement)
        event.remove(engine, "commit", on_commit)


def _run_counted(session: Any, cls: type[Workflow]) -> dict[str, int]:
    wf, _ = start(session, cls)
    execution = current(session, wf)
    assert execution is not None
    with counting() as counts:
        run_execution(execution.id, options=RunOptions(worker_id="cost-worker"))
    assert chain(session, wf, "walk")[0].outcome == "success"
    return counts


@pytest.mark.parametrize(
    ("short", "long", "committing_checkpoints"),
    [
        (ResumableCostPerItemTen, ResumableCostPerItemThirty, 20),
        (ResumableCostBatchedTen, ResumableCostBatchedThirty, 2),
    ],
    ids=["per_item", "checkpoint_every"],
)
def test_a_committing_checkpoint_costs_one_statement_and_a_commit_and_the_others_none(
    session, db_backend, short, long, committing_checkpoints
):
    few = _run_counted(session, short)
    many = _run_counted(session, long)

    # Twenty more items, the same work around them: the difference is the checkpoints alone
    # (no ORM flush of the cursor, no separate ownership check or workflow read).
    per_commit = 2 if db_backend == "mariadb" else 1
    assert many["commits"] - few["commits"] == committing_checkpoints
    assert many["statements"] - few["statements"] == committing_checkpoints * per_commit


def test_a_recovery_between_batched_checkpoints_rolls_back_the_unchecked_items_once(session):
    wf, _ = start(session, ResumableCostRecoveredMidBatch)
    execution = current(session, wf)
    assert execution is not None

    run_execution(
        execution.id, options=RunOptions(worker_id="stalled-worker", lease=timedelta(seconds=30))
    )

    # Items 0-1 were checkpointed; 2-3 were done after it and die with the stalled run.
    recovered, successor = chain(session, wf, "walk")
    assert (recovered.state, recovered.outcome, recovered.cursor_value) == (
        "completed",
        "recovered",
        2,
    )
    assert (successor.state, successor.cursor_value) == ("scheduled", 2)
    assert notes(session) == ["item 0", "item 1"]

    run_execution(successor.id, options=RunOptions(worker_id="healthy-worker"))

    assert notes(session) == [f"item {i}" for i in range(10)]  # every item exactly once
    assert reload(session, wf).state == "finished"


def test_an_external_pause_is_observed_at_the_next_committing_checkpoint_of_a_batch(session):
    wf, _ = start(session, ResumableCostPausedMidBatch)
    execution = current(session, wf)
    assert execution is not None

    run_execution(execution.id, options=RunOptions(worker_id="cost-worker"))

    # Paused during item 6; the checkpoint after item 9 commits items 5-9, then sees it.
    assert summary(session, wf) == [("walk", "completed", "workflow_paused", 10)]
    assert reload(session, wf).state == "paused"
    assert notes(session) == [f"item {i}" for i in range(10)]


def test_max_runtime_reached_between_batched_commits_commits_before_it_stops(session):
    wf, _ = start(session, ResumableCostRuntimeMidBatch)
    execution = current(session, wf)
    assert execution is not None

    run_execution(execution.id, options=RunOptions(worker_id="cost-worker"))

    # One frozen second per item: after item 5, 6 s have passed (> 5 s), long before the
    # 100th checkpoint would commit; the interruption commits items 0-5 with cursor 6.
    first, successor = chain(session, wf, "walk")
    assert (first.outcome, first.cursor_value) == ("continued", 6)
    assert (successor.state, successor.cursor_value) == ("scheduled", 6)
    assert notes(session) == [f"item {i}" for i in range(6)]


def test_with_the_real_clock_max_runtime_is_measured_on_the_monotonic_clock(session):
    wf, _ = start(session, ResumableCostRealClockRuntime)
    execution = current(session, wf)
    assert execution is not None

    with configured(clock=SystemClock()):
        run_execution(execution.id, options=RunOptions(worker_id="cost-worker"))

    # A microsecond of runtime is over by the first checkpoint, whatever the machine. (By id:
    # the successor's real-clock created_at sorts before the frozen clock's rows.)
    first, successor = sorted(chain(session, wf, "walk"), key=lambda e: e.id)
    assert (first.outcome, first.cursor_value) == ("continued", 1)
    assert (successor.state, successor.cursor_value) == ("scheduled", 1)
    assert notes(session) == ["item 0"]

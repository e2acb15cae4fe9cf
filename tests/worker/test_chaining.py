"""Chaining: the worker starts a step due now in the transaction that completes its predecessor.

One commit per step instead of two, and no claim for the next step — with phase 1's guards
(hero, cancel_if, skip_if) still deciding, exactly as a claim's phase 1 would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from sqlalchemy import event, select
from sqlalchemy.engine import Engine

from geneva_drive import StepExecution, Workflow, step
from geneva_drive.engine import prepare as prepare_module
from geneva_drive.runtime.worker import Worker
from tests.support.app import AuditEntry, Order
from tests.support.statements import WRITES
from tests.worker._support import state_of, trail
from tests.worker.apps import WorkerScaleThreeSteps


class ChainHeroDeletedMidway(Workflow):
    @step
    def delete_the_order(self) -> None:
        self.session.delete(self.hero)

    @step
    def needs_the_order(self) -> None:
        raise AssertionError("must not run: its hero is gone")


class ChainCancelIf(Workflow):
    def cancel_if(self) -> bool:
        return bool(self.hero.canceled)

    @step
    def cancel_the_order(self) -> None:
        self.hero.canceled = True

    @step
    def ship(self) -> None:
        raise AssertionError("must not run: cancel_if holds")


class ChainSkipIf(Workflow):
    @step
    def first(self) -> None:
        self.hero.status = "skip-second"

    @step(skip_if=lambda wf: wf.hero.status == "skip-second")
    def second(self) -> None:
        raise AssertionError("must not run: skip_if holds")

    @step
    def third(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="third ran"))


class ChainGuardBlowsUp(Workflow):
    may_proceed_without_hero = True
    fail_next_start: ClassVar[bool] = True

    @step
    def first(self) -> None:
        self.session.add(AuditEntry(note="first's write"))

    @step(skip_if=lambda wf: False)
    def second(self) -> None:
        pass


def _writing_commits(engine: Engine) -> tuple[list[int], Callable[[], None]]:
    """Count commits of transactions that wrote something (reads are not the question)."""
    count = [0]
    wrote: set[int] = set()

    def on_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        # Not "FOR UPDATE": a claim (which on PostgreSQL also begins with WITH) only reads.
        # Nor a statement that wrote no row: on PostgreSQL a key's turn that finds no key
        # due is one statement whose stamp (an UPDATE in a CTE) writes nothing.
        if WRITES.search(statement) and cursor.rowcount != 0:
            wrote.add(id(conn.connection.dbapi_connection))

    def on_commit(conn: Any) -> None:
        key = id(conn.connection.dbapi_connection)
        if key in wrote:
            wrote.discard(key)
            count[0] += 1

    event.listen(engine, "after_cursor_execute", on_execute)
    event.listen(engine, "commit", on_commit)

    def stop() -> None:
        event.remove(engine, "after_cursor_execute", on_execute)
        event.remove(engine, "commit", on_commit)

    return count, stop


def _run_until_done(gd: Any, session: Any, wf: Workflow, **worker_options: Any) -> Worker:
    worker = Worker(config=gd, concurrency=1, poll_interval=0.05, **worker_options)

    def done() -> bool:
        return state_of(session, wf) in ("finished", "canceled", "paused")

    worker.run(until=done, install_signals=False)
    return worker


def test_a_chained_workflow_commits_once_per_step_after_its_claim(gd, session, engine):
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()
    commits, stop = _writing_commits(gd.require_engine())
    try:
        worker = _run_until_done(gd, session, wf)
    finally:
        stop()

    assert [s for _, s, _ in trail(session, wf)] == ["completed"] * 3
    assert worker.steps_run == 3
    # The claim with step one's start, then one commit per step: its outcome together with
    # the next step's start. Without chaining it is two per step (six).
    assert commits[0] == 4


def test_without_eager_continuation_nothing_is_chained(gd, session):
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()
    commits, stop = _writing_commits(gd.require_engine())
    try:
        _run_until_done(gd, session, wf, eager=False)
    finally:
        stop()

    assert commits[0] == 6


def test_a_chained_step_whose_hero_was_deleted_cancels_the_workflow(gd, session):
    order = Order(status="new")
    session.add(order)
    session.flush()
    wf = ChainHeroDeletedMidway.create(session, hero=order)
    session.commit()

    _run_until_done(gd, session, wf)

    assert state_of(session, wf) == "canceled"
    assert trail(session, wf) == [
        ("delete_the_order", "completed", "success"),
        ("needs_the_order", "canceled", "canceled"),
    ]


def test_cancel_if_is_checked_before_a_chained_step_starts(gd, session):
    order = Order(status="new")
    session.add(order)
    session.flush()
    wf = ChainCancelIf.create(session, hero=order)
    session.commit()

    _run_until_done(gd, session, wf)

    assert state_of(session, wf) == "canceled"
    assert trail(session, wf) == [
        ("cancel_the_order", "completed", "success"),
        ("ship", "canceled", "canceled"),
    ]


def test_skip_if_skips_a_chained_step_and_the_chain_goes_on(gd, session):
    order = Order(status="new")
    session.add(order)
    session.flush()
    wf = ChainSkipIf.create(session, hero=order)
    session.commit()

    _run_until_done(gd, session, wf)

    assert state_of(session, wf) == "finished"
    assert trail(session, wf) == [
        ("first", "completed", "success"),
        ("second", "skipped", "skipped"),
        ("third", "completed", "success"),
    ]
    notes = session.scalars(select(AuditEntry.note).where(AuditEntry.order_id == order.id))
    assert list(notes) == ["third ran"]


def test_a_chained_start_that_fails_keeps_the_predecessor_and_leaves_the_step_to_a_claim(
    gd, session, monkeypatch
):
    real = prepare_module.guards_and_start
    failures: list[str] = []

    def start_once_failing(
        session_: Any, workflow: Any, execution: Any, *args: Any, **kwargs: Any
    ) -> Any:
        if execution.step_name == "second" and not failures:
            failures.append(execution.step_name)
            raise RuntimeError("injected: the chained start breaks once")
        return real(session_, workflow, execution, *args, **kwargs)

    monkeypatch.setattr(prepare_module, "guards_and_start", start_once_failing)
    wf = ChainGuardBlowsUp.create(session)
    session.commit()

    worker = _run_until_done(gd, session, wf)

    assert failures == ["second"]
    assert state_of(session, wf) == "finished"
    # The predecessor's outcome and its body's write were kept; the step ran once, claimed.
    assert trail(session, wf) == [
        ("first", "completed", "success"),
        ("second", "completed", "success"),
    ]
    assert list(session.scalars(select(AuditEntry.note))) == ["first's write"]
    assert worker.steps_run == 2


@pytest.mark.parametrize("wait_or_queue", ["wait", "queue"])
def test_a_step_that_is_not_due_now_or_not_for_this_worker_is_never_chained(
    gd, session, wait_or_queue
):
    from tests.worker.test_worker_runtime import (
        WorkerSecondStepElsewhere,
        WorkerSecondStepLater,
    )

    cls = WorkerSecondStepLater if wait_or_queue == "wait" else WorkerSecondStepElsewhere
    wf = cls.create(session)
    session.commit()
    worker = Worker(config=gd, queues=["default"], concurrency=1, poll_interval=0.05)

    worker.run(until=lambda: len(trail(session, wf)) == 2, install_signals=False)

    second = session.scalars(
        select(StepExecution).where(StepExecution.workflow_id == wf.id).order_by(StepExecution.id)
    ).all()[1]
    assert (second.state, second.started_at, worker.steps_run_eagerly) == ("scheduled", None, 0)

"""The transaction that finishes a workflow claims the worker thread's next execution.

One commit per workflow fewer on a backlog — with the claim's scope, the worker's stop, and
phase 1's guards deciding exactly as an ordinary claim's would, and an application error in
the claimed step's phase 1 never costing the finished workflow its outcome.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from sqlalchemy import select

from geneva_drive import StepExecution, Workflow, step
from geneva_drive.engine.executor import RunOptions, claim_and_run
from geneva_drive.runtime.worker import Worker
from geneva_drive.storage.db import session_factory
from tests.worker._support import DEADLINE, trail
from tests.worker.apps import WorkerScaleThreeSteps
from tests.worker.test_chaining import _writing_commits

THREE_DONE = [
    ("one", "completed", "success"),
    ("two", "completed", "success"),
    ("three", "completed", "success"),
]


class ClaimedCancelIfBlowsUpOnce(WorkerScaleThreeSteps):
    """Its steps (one, two, three) are its parent's."""

    raised: ClassVar[list[str]] = []

    def cancel_if(self) -> bool:
        if not self.raised:
            self.raised.append("cancel_if")
            raise RuntimeError("injected: cancel_if breaks once")
        return False


class ChecksBeforeEachStep(WorkerScaleThreeSteps):
    """A ``cancel_if`` runs before each of its steps: on PostgreSQL, the transaction that
    finishes it goes on after the claim (see chaining.hand_over), as everywhere else."""

    def cancel_if(self) -> bool:
        return False


class FinishLooksAtTheNext(Workflow):
    """Its last step loads another workflow's rows into the step's session (and keeps them)."""

    may_proceed_without_hero = True
    other_id: ClassVar[int | None] = None
    kept: ClassVar[list[Any]] = []

    @step
    def only(self) -> None:
        assert self.other_id is not None
        other = self.session.get(Workflow, self.other_id)
        rows = self.session.scalars(
            select(StepExecution).where(StepExecution.workflow_id == self.other_id)
        ).all()
        self.kept[:] = [other, *rows]  # held: the session's identity map is weak


def _due_after(clock: Any, cls: type[Workflow], session: Any) -> Workflow:
    """A workflow due a second after those made before it: the frozen clock gives equal due
    times otherwise, and the claim's order between equals is the database's."""
    clock.advance(seconds=1)
    return cls.create(session)


def _run(gd: Any, *workflows: Workflow) -> Worker:
    worker = Worker(config=gd, concurrency=1, poll_interval=0.05)
    ids = [wf.id for wf in workflows]

    deadline = time.monotonic() + DEADLINE

    def all_done() -> bool:  # or given up on: the assertions then say what is left
        with session_factory(gd)() as s:
            done = all(s.get(Workflow, i).state in ("finished", "canceled") for i in ids)
        return done or time.monotonic() > deadline

    worker.run(until=all_done, install_signals=False)
    return worker


def test_finishing_a_workflow_claims_the_next_in_the_same_transaction(gd, session, clock):
    first = WorkerScaleThreeSteps.create(session)
    second = _due_after(clock, WorkerScaleThreeSteps, session)
    session.commit()
    commits, stop = _writing_commits(gd.require_engine())
    try:
        worker = _run(gd, first, second)
    finally:
        stop()

    assert trail(session, first) == THREE_DONE
    assert trail(session, second) == THREE_DONE
    # One claim (with the first step's start), then one commit per step: the first
    # workflow's last one also claims and starts the second's first step. A claim of its
    # own for the second workflow would make it eight.
    assert commits[0] == 7
    # The second workflow's first step was claimed, not chained: only the steps that
    # followed their own predecessor count as eager.
    assert (worker.steps_run, worker.steps_run_eagerly) == (6, 4)


def test_a_stopping_worker_claims_nothing_when_a_workflow_finishes(gd, session, clock):
    first = WorkerScaleThreeSteps.create(session)
    second = _due_after(clock, WorkerScaleThreeSteps, session)
    session.commit()
    options = RunOptions(worker_id="w", chain=lambda queue: True, should_exit=lambda: True)

    assert claim_and_run(None, options, gd)

    assert trail(session, first) == THREE_DONE
    assert trail(session, second) == [("one", "scheduled", None)]


def test_an_error_in_the_claimed_steps_phase_one_keeps_the_finished_workflow(gd, session, clock):
    ClaimedCancelIfBlowsUpOnce.raised.clear()
    first = ChecksBeforeEachStep.create(session)
    second = _due_after(clock, ClaimedCancelIfBlowsUpOnce, session)
    session.commit()

    _run(gd, first, second)

    assert ClaimedCancelIfBlowsUpOnce.raised == ["cancel_if"]
    assert trail(session, first) == THREE_DONE
    # Left scheduled for an ordinary claim, whose phase 1 then passed: no error recorded,
    # as there would be had an ordinary claim's phase 1 met the error.
    assert trail(session, second) == THREE_DONE


def test_a_claimed_workflow_the_finishing_body_had_loaded_is_refreshed(gd, session, clock):
    first = FinishLooksAtTheNext.create(session)
    second = _due_after(clock, WorkerScaleThreeSteps, session)
    session.commit()
    FinishLooksAtTheNext.other_id = second.id
    FinishLooksAtTheNext.kept.clear()
    try:
        worker = _run(gd, first, second)
    finally:
        FinishLooksAtTheNext.kept.clear()

    assert trail(session, first) == [("only", "completed", "success")]
    assert trail(session, second) == THREE_DONE
    assert (worker.steps_run, worker.steps_run_eagerly) == (4, 2)

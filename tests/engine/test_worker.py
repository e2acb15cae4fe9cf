"""The database worker runs workflows to completion, one step at a time, each exactly once."""

from __future__ import annotations

import threading
from collections import Counter

from sqlalchemy import func, select

from geneva_drive import StepExecution, Workflow, step
from geneva_drive.runtime.worker import Worker
from geneva_drive.storage.db import session_factory
from tests.support.app import AuditEntry, Order


class WorkerThreeSteps(Workflow):
    @step
    def one(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="one"))

    @step
    def two(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="two"))

    @step
    def three(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="three"))


def _all_finished(session_factory, ids):
    def check() -> bool:
        with session_factory() as s:
            left = s.execute(
                select(func.count())
                .select_from(Workflow)
                .where(Workflow.id.in_(ids), Workflow.state != "finished")
            ).scalar_one()
        return left == 0

    return check


def test_the_worker_runs_many_workflows_to_the_end_running_each_step_once(gd, session, db_backend):
    orders = [Order() for _ in range(25)]
    session.add_all(orders)
    session.flush()
    ids = [WorkerThreeSteps.create(session, hero=o).id for o in orders]
    session.commit()

    worker = Worker(config=gd, concurrency=1 if db_backend == "sqlite" else 4, poll_interval=0.05)
    thread = threading.Thread(
        target=worker.run,
        kwargs={"until": _all_finished(session_factory(gd), ids), "install_signals": False},
    )
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the worker did not finish the workflows in time"

    notes = Counter(
        (order_id, note)
        for order_id, note in session.execute(select(AuditEntry.order_id, AuditEntry.note))
    )
    assert len(notes) == 75
    assert set(notes.values()) == {1}
    states = Counter(
        (state, outcome)
        for state, outcome in session.execute(select(StepExecution.state, StepExecution.outcome))
    )
    assert states == {("completed", "success"): 75}


def test_a_stopped_worker_leaves_no_execution_in_progress(gd, session):
    order = Order()
    session.add(order)
    session.flush()
    WorkerThreeSteps.create(session, hero=order)
    session.commit()

    worker = Worker(config=gd, concurrency=1, poll_interval=0.05)
    worker.stop()  # stopped before it starts: it must not claim anything
    worker.run(install_signals=False)

    assert worker.steps_run == 0
    in_progress = session.execute(
        select(func.count()).select_from(StepExecution).where(StepExecution.state == "in_progress")
    ).scalar_one()
    assert in_progress == 0

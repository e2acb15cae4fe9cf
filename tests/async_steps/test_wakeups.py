"""A row made due wakes the worker's idle async lane at once, not at its next poll.

The worker polls every 60 s here: the test's own deadline (30 s) runs out first unless a
wake-up reached the lane.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session

from geneva_drive import Workflow, step
from geneva_drive.runtime.backends.database import DatabaseBackend
from geneva_drive.runtime.configure import configured
from geneva_drive.runtime.worker import Worker
from tests.async_steps._support import wait_until
from tests.engine._support import reload

POLL = 60.0  # longer than wait_until's deadline
LANE_TASKS = 3


class WokenOnTheLoop(Workflow):
    may_proceed_without_hero = True

    @step
    async def only(self) -> None:
        pass


@pytest.fixture
def idle_worker(gd) -> Iterator[Worker]:
    """A worker with every lane task idle (and, on PostgreSQL, its LISTEN in place)."""
    worker = Worker(
        config=gd, concurrency=1, async_concurrency=LANE_TASKS, poll_interval=POLL, eager=False
    )
    thread = threading.Thread(target=lambda: worker.run(install_signals=False), daemon=True)
    thread.start()
    try:
        wait_until(lambda: worker.async_lane is not None and worker.async_lane.idle == LANE_TASKS)
        if worker.listen:
            wait_until(lambda: worker.listening)
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=30)


def test_a_workflow_started_in_this_process_wakes_the_idle_lane(gd, session, idle_worker):
    workflows = [WokenOnTheLoop.create(session) for _ in range(2)]
    session.commit()  # the backend wakes the worker's subscribers after commit

    wait_until(lambda: all(reload(session, w).state == "finished" for w in workflows))


def test_a_notify_from_another_process_wakes_the_idle_lane(gd, db_backend, idle_worker):
    if db_backend != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; elsewhere workers poll")
    # Another process's commit: a backend of its own that wakes nobody here, only the
    # NOTIFY sent with the commit reaches the worker — and through its LISTEN, the lane.
    # A create_many: one NOTIFY for all of them, relayed from task to task.
    with configured(engine=gd.engine, backend=DatabaseBackend()), Session(gd.engine) as other:
        ids = WokenOnTheLoop.create_many(other, count=5).workflow_ids
        other.commit()

    with Session(gd.engine) as session:

        def finished() -> bool:
            session.expire_all()
            return all(session.get(Workflow, i).state == "finished" for i in ids)

        wait_until(finished)

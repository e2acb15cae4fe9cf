"""A duplicated message for a step that is completing must not cost the step its outcome.

Celery (like every broker) may deliver a message twice, and two pool processes may take both
copies at once: each runs the execution by id. The first starts the step; the second locks
the workflow row, then the execution's, and finds it in progress. On PostgreSQL the step's
completion is one statement that reads its execution ``FOR SHARE`` before it locks the
workflow row. Had the duplicate locked the workflow row just before that statement began, and
then asked for the execution's row, each would wait for the other: the database breaks the
deadlock by aborting one, and when that was the completion, the step's outcome was rolled
back and the step ran a second time (seen in CI: a ``recovered`` execution, then a second
``success``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from sqlalchemy import Engine, select, text

from geneva_drive import Workflow, step
from geneva_drive.engine.executor import run_execution
from geneva_drive.storage.models import StepExecution
from tests.engine._support import history
from tests.worker._support import lock_waiters, wait_until_true

pytestmark = pytest.mark.postgres


@pytest.fixture(autouse=True)
def _postgresql_only(db_backend: str) -> None:
    if db_backend != "postgresql":
        pytest.skip("the completion reads its execution FOR SHARE in one statement on PostgreSQL")


class Interleaving:
    """Puts the duplicate run between the step's start and its completion.

    A third connection holds the workflow row while the duplicate run queues for it; the step's
    body then returns, and its completion queues behind the duplicate. Letting go hands the row
    to the duplicate first, with the completion's shared lock on the execution already held.
    """

    def __init__(self, engine: Engine, execution_id: int, config: Any) -> None:
        self.engine, self.execution_id, self.config = engine, execution_id, config
        self.duplicate_queued = threading.Event()
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []

    def begin(self, workflow_id: int) -> None:
        """From the step's body: hold the workflow row, start the duplicate, return once it
        waits for the row."""
        holder = threading.Thread(target=self._hold, args=(workflow_id,), daemon=True)
        self.threads.append(holder)
        holder.start()
        assert self.duplicate_queued.wait(30), "the duplicate run never queued for the row"

    def _hold(self, workflow_id: int) -> None:
        try:
            with self.engine.connect() as conn, conn.begin():
                conn.execute(
                    text("SELECT 1 FROM geneva_drive_workflows WHERE id = :id FOR UPDATE"),
                    {"id": workflow_id},
                )
                duplicate = threading.Thread(target=self._duplicate, daemon=True)
                self.threads.append(duplicate)
                duplicate.start()
                wait_until_true(lambda: lock_waiters(self.engine) == 1, "the duplicate's wait")
                self.duplicate_queued.set()
                wait_until_true(lambda: lock_waiters(self.engine) == 2, "the completion's wait")
        except BaseException as error:  # reported by the test
            self.errors.append(error)

    def _duplicate(self) -> None:
        try:
            run_execution(self.execution_id, reraise=False, config=self.config)
        except BaseException as error:  # reported by the test
            self.errors.append(error)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(60)


_RUNS: list[int] = []
_INTERLEAVINGS: list[Interleaving] = []


class DeliveredTwice(Workflow):
    may_proceed_without_hero = True

    @step
    def only(self) -> None:
        _RUNS.append(self.id)
        if len(_RUNS) == 1:
            _INTERLEAVINGS[0].begin(self.id)


def test_a_duplicate_run_that_locks_the_workflow_during_the_completion_leaves_it_alone(
    gd, session, caplog
):
    caplog.set_level(logging.INFO, logger="geneva_drive")
    _RUNS.clear()
    _INTERLEAVINGS.clear()
    wf = DeliveredTwice.create(session)
    session.commit()
    execution_id = session.scalars(
        select(StepExecution.id).where(StepExecution.workflow_id == wf.id)
    ).one()
    interleaving = Interleaving(gd.engine, execution_id, gd)
    _INTERLEAVINGS.append(interleaving)

    run_execution(execution_id, config=gd)
    interleaving.join()

    assert interleaving.errors == []
    assert len(_RUNS) == 1  # the body ran once
    assert history(session, wf) == [("only", "completed", "success")]
    assert "no longer scheduled, skipping duplicate run" in caplog.text

"""A ``geneva-drive worker --concurrency 32`` process under a backlog of slow steps.

Issue 41 found a worker of 16 threads on SQLAlchemy's default pool (5 + 10): its heartbeat and
lease recovery waited out the pool's 30 s timeout behind the step threads, and a heartbeat that
waits is a lease that expires under a running step. Here the heartbeat renews every 0.5 s a
lease of 1.5 s, so a stall of one second would show: no lease may be recovered while its worker
lives, no renewal may be late or fail, and the pool must never time out — while at least 24 of
the 32 threads run steps at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

import geneva_drive
from geneva_drive import SystemClock
from geneva_drive.runtime.configure import configured
from tests.kill._support import Workers, scalar
from tests.kill.apps import KillSleeps

CONCURRENCY = 32
WORKFLOWS = 320  # ten rounds of 32
STEP_SECONDS = 0.2
LEASE = 1.5
HEARTBEAT = 0.5


@pytest.fixture
def workers(installed_database_url: str, tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(installed_database_url, tmp_path)
    try:
        yield pool
    finally:
        pool.kill_all()


class PeakInProgress:
    """Samples how many steps run at once, on a thread of its own, until stopped."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine, self.peak = engine, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        sql = "SELECT count(*) FROM geneva_drive_step_executions WHERE state = 'in_progress'"
        while not self._stop.wait(0.02):  # a sampling period, not synchronisation
            self.peak = max(self.peak, int(scalar(self.engine, sql)))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(10)
        return self.peak


def test_a_worker_of_32_threads_keeps_every_lease_under_a_backlog_of_slow_steps(
    db_backend, installed_database_url, workers
):
    if db_backend == "sqlite":
        pytest.skip("SQLite has one writer: 32 step threads would queue on its lock")
    engine = geneva_drive.create_engine(installed_database_url, poolclass=NullPool)
    with configured(engine=engine, clock=SystemClock()), Session(engine) as session:
        KillSleeps.create_many(session, count=WORKFLOWS, allow_multiple=True)
        session.commit()
    peak = PeakInProgress(engine)
    worker = workers.start(
        "--concurrency",
        str(CONCURRENCY),
        "--lease",
        str(LEASE),
        "--heartbeat-interval",
        str(HEARTBEAT),
        GD_KILL_STEP_SECONDS=str(STEP_SECONDS),
    )
    finished = "SELECT count(*) FROM geneva_drive_workflows WHERE state = 'finished'"
    workers.wait_until(lambda: scalar(engine, finished) == WORKFLOWS, "the backlog to finish")
    most_at_once = peak.stop()

    recovered = "SELECT count(*) FROM geneva_drive_step_executions WHERE outcome = 'recovered'"
    assert scalar(engine, recovered) == 0, workers.logs()
    assert workers.stop(worker) == 0, workers.logs()
    log = workers.output(worker)
    for trouble in ("QueuePool limit", "TimeoutError", "lease renewal", "recovered"):
        assert trouble not in log, log[-4000:]
    assert most_at_once >= CONCURRENCY * 3 // 4, most_at_once
    engine.dispose()

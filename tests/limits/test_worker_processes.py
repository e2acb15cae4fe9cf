"""Limits hold across real `geneva-drive worker` processes racing for the same keys.

Three workers, each with its step threads, on PostgreSQL and MariaDB (SQLite has one writer).
What ran when is read from the rows afterwards — the bodies' own records, the executions'
start times — never from how long anything took.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from geneva_drive import SystemClock, create_engine
from geneva_drive.runtime.configure import configured
from tests.limits.apps import BodyRun, Gateway, LimitsBase, OnePerTenant, TwoAtATime
from tests.support.worker_processes import (
    finished_workflows,
    start_worker_processes,
    stop_worker_processes,
    wait_until,
)

DEADLINE = 240.0
WORKERS = 3

pytestmark = pytest.mark.usefixtures("server_database")


@pytest.fixture
def server_database(db_backend: str) -> None:
    if db_backend == "sqlite":
        pytest.skip("one writer: SQLite's workers never race for a slot")


@pytest.fixture
def workers(installed_database_url: str, tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    processes = start_worker_processes(
        installed_database_url, "tests.limits.apps", tmp_path, count=WORKERS, body_seconds=0.05
    )
    try:
        yield processes
    finally:
        stop_worker_processes(processes)


@pytest.fixture
def db(installed_database_url: str) -> Iterator[sa.Engine]:
    engine = create_engine(installed_database_url)
    LimitsBase.metadata.create_all(engine)
    with configured(engine=engine, clock=SystemClock()):
        yield engine
    engine.dispose()


def _most_at_once(runs: list[BodyRun]) -> int:
    """The largest number of bodies running at one instant (an end before a start at a tie)."""
    edges = sorted([(r.began, 1) for r in runs] + [(r.ended, -1) for r in runs])
    running = most = 0
    for _, change in edges:
        running += change
        most = max(most, running)
    return most


def test_no_more_than_n_steps_per_key_run_at_once_across_worker_processes(db, workers, tmp_path):
    with Session(db) as session:
        for _ in range(16):
            TwoAtATime.create(session)
        for tenant in ("a", "b"):
            for _ in range(6):
                OnePerTenant.create(session, input={"tenant": tenant})
        session.commit()

    wait_until(lambda: finished_workflows(db) >= 28, "every workflow to finish", tmp_path, DEADLINE)

    with Session(db) as session:
        runs = list(session.scalars(sa.select(BodyRun)))
        outcomes = session.execute(
            sa.text("SELECT outcome, count(*) FROM geneva_drive_step_executions GROUP BY outcome")
        ).all()
        leftovers = session.execute(
            sa.text(
                "SELECT (SELECT count(*) FROM geneva_drive_limit_slots "
                "WHERE execution_id IS NOT NULL), "
                "(SELECT count(*) FROM geneva_drive_limit_waiters)"
            )
        ).one()
    by_key: dict[str, list[BodyRun]] = {}
    for run in runs:
        by_key.setdefault(run.key, []).append(run)
    assert sorted(len(v) for v in by_key.values()) == [12, 12, 16]
    assert _most_at_once(by_key["global"]) == 2  # the limit binds, and is never passed
    assert _most_at_once(by_key["a"]) == 1
    assert _most_at_once(by_key["b"]) == 1
    assert dict(outcomes) == {"success": 40}  # nothing failed or ran twice
    assert tuple(leftovers) == (0, 0)


def test_ten_starts_a_second_hold_across_three_worker_processes(db, workers, tmp_path):
    with Session(db) as session:
        for _ in range(35):
            Gateway.create(session)
        session.commit()

    wait_until(lambda: finished_workflows(db) >= 35, "every workflow to finish", tmp_path, DEADLINE)

    with Session(db) as session:
        starts = sorted(
            session.scalars(
                sa.text(
                    "SELECT started_at FROM geneva_drive_step_executions WHERE step_name = 'charge'"
                )
            )
        )
        outcomes = session.execute(
            sa.text("SELECT outcome, count(*) FROM geneva_drive_step_executions GROUP BY outcome")
        ).all()
    assert len(starts) == 35  # one execution each: none failed, none reattempted
    assert dict(outcomes) == {"success": 35}
    # No window of one second holds more than ten starts: the eleventh start after any
    # start is at least a second later (exact: the starts are stamped with the instants the
    # limit counted, one machine's clock).
    gaps = [starts[i + 10] - starts[i] for i in range(len(starts) - 10)]
    assert min(gaps) >= timedelta(seconds=1)

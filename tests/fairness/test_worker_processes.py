"""Fair claims hold across real `geneva-drive worker` processes racing for the same keys.

Three workers, each with its step threads, on PostgreSQL and MariaDB (SQLite has one writer):
tenant a's 60 workflows are due before tenant b's 5, and every one is due before the
workers start. Claims rotate among the keys whatever worker makes them, so b's steps start
among the first ones, not after a's 60. The order is read from the rows afterwards (the
executions' start times), never from how long anything took.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from geneva_drive import FrozenClock, create_engine
from geneva_drive.runtime.configure import configured
from tests.fairness.apps import FairCharge
from tests.support.app import Account, AppBase

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 240.0
WORKERS = 3
A, B = 60, 5


@pytest.fixture
def db(db_backend: str, installed_database_url: str) -> Iterator[tuple[sa.Engine, FrozenClock]]:
    if db_backend == "sqlite":
        pytest.skip("one writer: SQLite's workers never race for a key")
    engine = create_engine(installed_database_url)
    AppBase.metadata.create_all(engine)
    # Created in the past, by a frozen clock: every row is due when the workers start.
    clock = FrozenClock(datetime.now(UTC) - timedelta(days=1))
    with configured(engine=engine, clock=clock):
        yield engine, clock
    engine.dispose()


def _start_workers(url: str, tmp_path: Path) -> list[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "GENEVA_DRIVE_DATABASE_URL": url,
        "GD_TEST_BODY_SECONDS": "0.02",
        "PYTHONUNBUFFERED": "1",
    }
    command = [sys.executable, "-m", "geneva_drive.cli", "worker", "--app", "tests.fairness.apps"]
    processes = []
    for i in range(WORKERS):
        with (tmp_path / f"worker-{i}.log").open("wb") as log:
            processes.append(
                subprocess.Popen(
                    [*command, "--poll-interval", "0.2"],
                    cwd=REPO,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                )
            )
    return processes


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until(condition: Callable[[], bool], what: str, tmp_path: Path) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            logs = "\n".join(p.read_text()[-2000:] for p in tmp_path.glob("worker-*.log"))
            raise AssertionError(f"gave up waiting for {what}; worker logs:\n{logs}")
        time.sleep(0.1)  # polling a condition with a deadline


def _finished(engine: sa.Engine) -> int:
    with engine.connect() as connection:
        return int(
            connection.execute(
                sa.text("SELECT count(*) FROM geneva_drive_workflows WHERE state = 'finished'")
            ).scalar_one()
        )


def test_a_later_tenant_is_served_among_the_first_claims_across_worker_processes(
    db, installed_database_url, tmp_path
):
    engine, clock = db
    with Session(engine) as session:
        for tenant, n in (("a.example", A), ("b.example", B)):
            for i in range(n):
                account = Account(id=f"{tenant}-{i}", email=f"u{i}@{tenant}")
                session.add(account)
                session.flush()
                FairCharge.create(session, hero=account)
            session.commit()
            clock.advance(seconds=1)  # b's rows are due after a's

    processes = _start_workers(installed_database_url, tmp_path)
    try:
        _wait_until(lambda: _finished(engine) >= A + B, "every workflow to finish", tmp_path)
    finally:
        _stop(processes)

    with Session(engine) as session:
        started = session.execute(
            sa.text(
                "SELECT w.hero_id, e.outcome FROM geneva_drive_step_executions e "
                "JOIN geneva_drive_workflows w ON w.id = e.workflow_id "
                "ORDER BY e.started_at, e.id"
            )
        ).all()
    assert len(started) == A + B  # one execution each: none failed, none ran twice
    assert {outcome for _, outcome in started} == {"success"}
    b_places = [i for i, (hero, _) in enumerate(started) if hero.startswith("b.example")]
    # Each of b's steps waits for at most a turn of a and one of the ordinary order per
    # worker thread claiming at the same moment (3 workers x 4 threads): far from a's 60.
    assert b_places[0] < 3 * 4 + 3
    assert b_places[-1] < 3 * 4 + 3 * B

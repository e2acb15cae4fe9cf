"""KeyboardInterrupt and SystemExit from step code fail the step, not the worker; a worker
that stops abnormally says why and never exits 0. Real ``geneva-drive worker`` processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from geneva_drive import SystemClock, Workflow, create_engine
from geneva_drive.runtime.configure import configured
from tests.kill._support import Workers, rows, scalar
from tests.kill.apps import KillPlain, KillStepExits, KillStepInterrupts


@pytest.fixture
def workers(installed_database_url: str, tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(installed_database_url, tmp_path)
    try:
        yield pool
    finally:
        pool.kill_all()


@pytest.fixture
def db(installed_database_url: str) -> Iterator[sa.Engine]:
    engine = create_engine(installed_database_url)
    with configured(engine=engine, clock=SystemClock()):
        yield engine
    engine.dispose()


def _create(engine: sa.Engine, *classes: type[Workflow]) -> list[int]:
    with Session(engine) as session:
        ids = [int(cls.create(session).id) for cls in classes]
        session.commit()
    return ids


def _state(engine: sa.Engine, workflow_id: int) -> object:
    return scalar(engine, "SELECT state FROM geneva_drive_workflows WHERE id = :id", id=workflow_id)


def _history(engine: sa.Engine, workflow_id: int) -> list[tuple[object, ...]]:
    return rows(
        engine,
        "SELECT state, outcome, error_class_name FROM geneva_drive_step_executions "
        "WHERE workflow_id = :id ORDER BY created_at, id",
        id=workflow_id,
    )


def test_a_step_raising_system_exit_or_keyboard_interrupt_fails_and_the_worker_carries_on(
    db, workers
):
    worker = workers.start("--concurrency", "1")  # one thread: had it died, nothing would run
    workers.wait_started(worker)
    exits, interrupts = _create(db, KillStepExits, KillStepInterrupts)

    workers.wait_until(
        lambda: _state(db, exits) == _state(db, interrupts) == "paused",
        "both workflows to pause, as their policies say",
    )
    (plain,) = _create(db, KillPlain)
    workers.wait_until(lambda: _state(db, plain) == "finished", "a later workflow to finish")

    assert worker.poll() is None, workers.logs()
    assert workers.stop(worker) == 0, workers.logs()
    assert _history(db, exits) == [
        ("completed", "reattempted", None),
        ("failed", "failed", "SystemExit"),
    ]
    assert _history(db, interrupts) == [("failed", "failed", "KeyboardInterrupt")]
    running = "SELECT count(*) FROM geneva_drive_step_executions WHERE state = 'in_progress'"
    assert scalar(db, running) == 0


@pytest.mark.parametrize(
    ("how", "thread", "error"),
    [
        ("step-thread", "geneva-drive-0", "RuntimeError: injected failure (step-thread)"),
        ("heartbeat", "geneva-drive-heartbeat", "SystemExit: 0"),
    ],
    ids=["a step thread dies", "the heartbeat dies"],
)
def test_a_worker_whose_thread_dies_stops_and_exits_non_zero_saying_why(
    db, workers, how, thread, error
):
    worker = workers.start("--concurrency", "1", "--lease", "0.6", GD_KILL_CRASH=how)

    code = workers.exit_code(worker)

    output = workers.output(worker)
    assert code == 1, output
    assert f"worker thread {thread} died of" in output  # with its traceback, in the log
    last = output.strip().splitlines()[-1]
    assert last.startswith("geneva-drive worker: error: worker "), output
    assert f"its thread {thread} died of {error}" in last

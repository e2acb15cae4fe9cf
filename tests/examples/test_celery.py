"""examples/celery: its README commands — a real Celery worker on a real Redis, and the script
that starts workflows — run the onboarding workflows to the end on PostgreSQL.

The Redis server, the Celery worker process and the PostgreSQL database are the Celery tests'
own (tests/celery); Redis or Celery that cannot start skips this test loudly, and fails it under
CI=true, as there.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

import geneva_drive
from examples.celery.models import User
from geneva_drive import Workflow
from tests.celery.conftest import _unavailable, pg_celery_url, redis_server
from tests.celery.support import CeleryUnavailable, CeleryWorker, RedisServer, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
__all__ = ["pg_celery_url", "redis_server"]  # the Celery tests' fixtures, used here


def _commands() -> tuple[list[str], list[str]]:
    """The celery row's commands in examples/README.md: the worker's and the script's."""
    readme = (REPO / "examples" / "README.md").read_text()
    (row,) = [line for line in readme.splitlines() if line.startswith("| [`celery/`]")]
    worker, script = re.findall(r"`((?:celery -A|python -m) [^`]*)`", row)
    return shlex.split(worker), shlex.split(script)


@pytest.fixture
def worker_for(redis_server: RedisServer, pg_celery_url: str) -> Iterator[CeleryWorker]:
    redis_server.flush()
    argv, _ = _commands()
    assert argv[:2] == ["celery", "-A"] and argv[3] == "worker" and argv[4] == "-Q", argv
    try:
        worker = CeleryWorker.start(
            app=argv[2],
            queues=argv[5].split(","),
            broker_url=redis_server.url,
            database_url=pg_celery_url,
            extra_env={
                "CELERY_BROKER_URL": redis_server.url,
                "GENEVA_DRIVE_DATABASE_URL": pg_celery_url,
            },
        )
    except CeleryUnavailable as error:
        _unavailable("a Celery worker", error)
    yield worker
    worker.stop()


def test_the_start_script_runs_onboarding_workflows_on_the_celery_worker(
    worker_for: CeleryWorker, redis_server: RedisServer, pg_celery_url: str
):
    _, script = _commands()
    assert script[:3] == ["python", "-m", "examples.celery.start"], script

    started = subprocess.run(
        [sys.executable, *script[1:]],
        cwd=REPO,
        env={
            **os.environ,
            "CELERY_BROKER_URL": redis_server.url,
            "GENEVA_DRIVE_DATABASE_URL": pg_celery_url,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith("started onboarding workflows 1, 2, 3"), started.stdout
    engine = geneva_drive.create_engine(pg_celery_url)
    try:
        with Session(engine) as session:

            def states() -> list[str]:
                found = list(session.scalars(select(Workflow.state).order_by(Workflow.id)))
                session.commit()
                return found

            wait_until(
                lambda: states() == ["finished"] * 3,
                describe=lambda: f"workflow states {states()}; worker:\n{worker_for.output.text()}",
            )
            users = list(session.scalars(select(User).order_by(User.id)))
            assert all(u.welcomed_at is not None and u.nudged_at is not None for u in users)
            assert [u.nudged_at >= u.welcomed_at for u in users] == [True] * 3
    finally:
        engine.dispose()
    output = worker_for.output.text()
    for n in range(3):
        assert f"mail to user{n}@example.com: Welcome!" in output
        assert f"mail to user{n}@example.com: How is it going?" in output

"""Real `geneva-drive worker` processes for tests that race several of them (limits, fair
claims): start them with an app module, wait on a condition with their logs in the failure,
stop them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[2]


def start_worker_processes(
    url: str, app: str, tmp_path: Path, *, count: int, body_seconds: float
) -> list[subprocess.Popen[bytes]]:
    """``count`` workers on ``url`` loading ``app``; each logs to ``tmp_path/worker-N.log``.
    ``body_seconds``: what the apps' bodies read from ``GD_TEST_BODY_SECONDS``."""
    env = {
        **os.environ,
        "GENEVA_DRIVE_DATABASE_URL": url,
        "GD_TEST_BODY_SECONDS": str(body_seconds),
        "PYTHONUNBUFFERED": "1",
    }
    command = [sys.executable, "-m", "geneva_drive.cli", "worker", "--app", app]
    processes = []
    for i in range(count):
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


def stop_worker_processes(processes: list[subprocess.Popen[bytes]]) -> None:
    """Ask each to stop (SIGTERM: a graceful shutdown), kill what has not after 60 s."""
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_until(condition: Callable[[], bool], what: str, tmp_path: Path, deadline: float) -> None:
    """Poll ``condition`` until it holds; past ``deadline`` seconds, fail with the tail of
    every worker's log."""
    give_up = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > give_up:
            logs = "\n".join(p.read_text()[-2000:] for p in tmp_path.glob("worker-*.log"))
            raise AssertionError(f"gave up waiting for {what}; worker logs:\n{logs}")
        time.sleep(0.1)  # polling a condition with a deadline


def finished_workflows(engine: sa.Engine) -> int:
    with engine.connect() as connection:
        return int(
            connection.execute(
                sa.text("SELECT count(*) FROM geneva_drive_workflows WHERE state = 'finished'")
            ).scalar_one()
        )

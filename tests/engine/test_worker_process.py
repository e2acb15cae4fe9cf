"""The `geneva-drive worker` command runs steps and stops cleanly on SIGTERM and SIGINT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parents[2]


def _start_worker(url: str) -> subprocess.Popen[str]:
    env = {**os.environ, "GENEVA_DRIVE_DATABASE_URL": url, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "geneva_drive.cli",
            "worker",
            "--app",
            "tests.support.worker_app",
            "--poll-interval",
            "0.1",
        ],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )


def _wait_for_line(process: subprocess.Popen[str], needle: str) -> list[str]:
    seen: list[str] = []
    assert process.stderr is not None
    for line in process.stderr:  # blocks on the worker's own output: no sleeping
        seen.append(line)
        if needle in line:
            return seen
    raise AssertionError(f"worker exited before printing {needle!r}: {''.join(seen)}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_worker_process_runs_a_workflow_and_exits_cleanly_on_a_signal(
    installed_database_url, signum
):
    from tests.support import worker_app

    worker_app.create_schema_and_workflow(installed_database_url)
    process = _start_worker(installed_database_url)
    try:
        _wait_for_line(process, "worker_app: finished")
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert "stopped after" in stderr
    engine = create_engine(installed_database_url)
    with engine.connect() as connection:
        states = (
            connection.execute(text("SELECT state FROM geneva_drive_workflows")).scalars().all()
        )
        running = connection.execute(
            text("SELECT count(*) FROM geneva_drive_step_executions WHERE state = 'in_progress'")
        ).scalar_one()
    engine.dispose()
    assert states == ["finished"]
    assert running == 0

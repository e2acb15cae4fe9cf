"""A real `geneva-drive worker` runs many async steps at once on its event loop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, text

from tests.async_steps import lane_app

REPO = Path(__file__).resolve().parents[2]


def test_one_worker_process_runs_more_async_steps_at_once_than_it_has_threads(
    installed_database_url,
):
    lane_app.create_workflows(installed_database_url)
    env = {**os.environ, "GENEVA_DRIVE_DATABASE_URL": installed_database_url}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "geneva_drive.cli",
            "worker",
            "--app",
            "tests.async_steps.lane_app",
            "--concurrency",
            "2",  # step threads; the lane's 30 steps in flight are not theirs
            "--poll-interval",
            "0.1",
        ],
        cwd=REPO,
        env={**env, "PYTHONUNBUFFERED": "1"},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    seen: list[str] = []
    try:
        assert process.stderr is not None
        for line in process.stderr:  # blocks on the worker's own output: no sleeping
            seen.append(line)
            if "lane_app: 30 steps in flight" in line:
                break
        else:
            raise AssertionError(f"worker exited first: {''.join(seen)}")
        process.send_signal(signal.SIGTERM)  # the running steps finish in the grace period
        _, rest = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, "".join(seen) + rest
    engine = create_engine(installed_database_url)
    with engine.connect() as connection:
        calls = connection.execute(
            text("SELECT state, outcome FROM geneva_drive_step_executions WHERE step_name = 'call'")
        ).all()
    engine.dispose()
    assert sorted(calls) == [("completed", "success")] * lane_app.IN_FLIGHT

"""A worker killed mid-iteration loses nothing and duplicates nothing (DESIGN §4.2.1).

A real ``geneva-drive worker`` process copies 10,000 source rows into result rows with a
checkpoint commit every 20 rows; it is killed with SIGKILL while 10 rows past a checkpoint
are written but not committed. The orphaned execution is recovered as housekeeping does,
and a second worker finishes the job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from sqlalchemy import func, select, text

import geneva_drive
from geneva_drive import StepExecution
from tests.resumable import crash_app
from tests.resumable.crash_app import CrashResult, CrashSource

REPO = Path(__file__).resolve().parents[2]
HOLD_AT = 2010  # 100 checkpoint commits of 20 rows, then 10 uncommitted rows


def _start_worker(url: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "geneva_drive.cli",
            "worker",
            "--app",
            "tests.resumable.crash_app",
            "--poll-interval",
            "0.1",
        ],
        cwd=REPO,
        env={**os.environ, "GENEVA_DRIVE_DATABASE_URL": url, "PYTHONUNBUFFERED": "1", **env},
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_line(process: subprocess.Popen[str], needle: str) -> str:
    seen: list[str] = []
    assert process.stderr is not None
    for line in process.stderr:  # blocks on the worker's own output: no sleeping
        seen.append(line)
        if needle in line:
            return line
    raise AssertionError(f"worker exited before printing {needle!r}: {''.join(seen)}")


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
    process.communicate(timeout=60)


def test_a_worker_killed_mid_iteration_resumes_from_the_last_checkpoint_exactly_once(
    installed_database_url,
):
    url = installed_database_url
    workflow_id = crash_app.prepare(url)
    engine = geneva_drive.create_engine(url)
    try:
        first = _start_worker(url, RESUMABLE_CRASH_HOLD_AT=str(HOLD_AT))
        try:
            line = _wait_for_line(first, crash_app.HOLD_LINE)
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=60)
        finally:
            _stop(first)
        assert "after 100 checkpoint commits" in line
        assert first.returncode == -signal.SIGKILL

        # What the dead worker left: exactly the committed checkpoints, and its execution
        # still in progress with the cursor of the last of them.
        with engine.connect() as connection:
            results = connection.execute(select(func.count()).select_from(CrashResult)).scalar()
            orphan_id, state, cursor = connection.execute(
                select(StepExecution.id, StepExecution.state, StepExecution.cursor).where(
                    StepExecution.workflow_id == workflow_id
                )
            ).one()
        assert results == 2000
        assert (state, cursor) == ("in_progress", 2000)

        crash_app.recover_orphan(url, orphan_id)

        second = _start_worker(url)
        try:
            _wait_for_line(second, crash_app.DONE_LINE)
            second.send_signal(signal.SIGTERM)
            second.communicate(timeout=60)
        finally:
            _stop(second)
        assert second.returncode == 0

        with engine.connect() as connection:
            per_source = dict(
                connection.execute(
                    select(CrashSource.id, func.count(CrashResult.id))
                    .outerjoin(CrashResult, CrashResult.source_id == CrashSource.id)
                    .group_by(CrashSource.id)
                ).all()
            )
            copy_chain = connection.execute(
                select(StepExecution.outcome, StepExecution.continues_from_id)
                .where(StepExecution.workflow_id == workflow_id)
                .where(StepExecution.step_name == "copy")
                .order_by(StepExecution.created_at, StepExecution.id)
            ).all()
            workflow_state = connection.execute(
                text("SELECT state FROM geneva_drive_workflows WHERE id = :id"), {"id": workflow_id}
            ).scalar_one()
        assert len(per_source) == crash_app.SOURCE_ROWS
        assert set(per_source.values()) == {1}  # none lost, none twice
        assert copy_chain == [("recovered", None), ("success", orphan_id)]
        assert workflow_state == "finished"
    finally:
        engine.dispose()

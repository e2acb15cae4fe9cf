"""Real ``geneva-drive worker`` processes for the tests here, their logs in files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 120.0
COMMAND = [sys.executable, "-m", "geneva_drive.cli", "worker", "--poll-interval", "0.1"]


class Workers:
    """Starts worker processes with stderr in files; :meth:`kill_all` ends any left over."""

    def __init__(self, url: str, directory: Path, app: str = "tests.kill.apps") -> None:
        self.url = url
        self.directory = directory
        self.app = app
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str, **env: str) -> subprocess.Popen[bytes]:
        log = self.directory / f"worker-{len(self.processes)}.log"
        environment = {
            **os.environ,
            "GENEVA_DRIVE_DATABASE_URL": self.url,
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        with log.open("wb") as stderr:
            process = subprocess.Popen(
                [*COMMAND, "--app", self.app, *args],
                cwd=REPO,
                env=environment,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        process.log = log  # type: ignore[attr-defined]
        self.processes.append(process)
        return process

    def output(self, process: subprocess.Popen[bytes]) -> str:
        return process.log.read_text(errors="replace")  # type: ignore[attr-defined]

    def logs(self) -> str:
        return "\n".join(
            f"--- worker {i} (exit {p.poll()}):\n{self.output(p)[-4000:]}"
            for i, p in enumerate(self.processes)
        )

    def wait_until(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"gave up waiting for {what}; worker logs:\n{self.logs()}")
            time.sleep(0.05)  # polling a condition with a deadline

    def wait_started(self, *processes: subprocess.Popen[bytes]) -> None:
        """Until each has installed its signal handlers and begun claiming."""
        self.wait_until(
            lambda: all(" started: " in self.output(p) for p in processes), "workers to start"
        )

    def exit_code(self, process: subprocess.Popen[bytes]) -> int:
        try:
            return process.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker did not exit; logs:\n{self.logs()}") from None

    def stop(self, process: subprocess.Popen[bytes]) -> int:
        process.send_signal(signal.SIGTERM)
        return self.exit_code(process)

    def kill_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def scalar(engine: sa.Engine, sql: str, **params: object) -> Any:
    with engine.connect() as connection:
        return connection.execute(sa.text(sql), params).scalar()


def rows(engine: sa.Engine, sql: str, **params: object) -> list[tuple[Any, ...]]:
    with engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text(sql), params)]

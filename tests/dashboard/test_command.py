"""``geneva-drive dashboard``: served by uvicorn, read-only unless given a token, and one of
the two must be chosen."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

import geneva_drive

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 60.0


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'dashboard.db'}"
    engine = geneva_drive.create_engine(url)
    geneva_drive.install(engine)
    engine.dispose()
    return url


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "geneva_drive", "dashboard", *args]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def served(sqlite_url: str) -> Iterator[object]:
    """``start(*flags, env=...)``: the command running on a free port; yields its base URL."""
    processes: list[subprocess.Popen[str]] = []

    def start(*flags: str, env: dict[str, str] | None = None) -> str:
        port = free_port()
        process = subprocess.Popen(
            command(
                "--database-url",
                sqlite_url,
                "--app",
                "tests.dashboard.apps",
                "--port",
                str(port),
                *flags,
            ),
            cwd=REPO,
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        processes.append(process)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + DEADLINE
        while True:
            assert process.poll() is None, f"the dashboard exited: {process.stderr.read()}"
            try:
                httpx2.get(base + "/workflows", timeout=1)
                return base
            except httpx2.TransportError:
                assert time.monotonic() < deadline, "the dashboard did not start listening"
                time.sleep(0.05)  # polling for the port to open, with a deadline

    yield start
    for process in processes:
        process.terminate()
        process.communicate(timeout=30)


def test_the_command_refuses_to_guess_between_read_only_and_a_token(sqlite_url):
    result = subprocess.run(
        command("--database-url", sqlite_url),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("geneva-drive dashboard: error:")
    assert "--token" in last and "--read-only" in last


def test_read_only_serves_the_pages_and_offers_no_login(served):
    base = served("--read-only")
    with httpx2.Client(base_url=base) as client:
        page = client.get("/workflows")
        assert page.status_code == 200 and "read-only" in page.text
        assert client.get("/login").status_code == 404


def test_with_a_token_from_the_environment_an_action_needs_the_login(served):
    base = served(env={"GENEVA_DRIVE_DASHBOARD_TOKEN": "s3cret"})
    with httpx2.Client(base_url=base) as client:
        assert "Log in to act" in client.get("/workflows").text
        token = client.cookies["gd_csrf"]
        logged_in = client.post(
            "/login", data={"token": "s3cret", "csrf_token": token}, follow_redirects=False
        )
        assert logged_in.status_code == 303 and "gd_auth" in client.cookies
        assert "Log out" in client.get("/workflows").text

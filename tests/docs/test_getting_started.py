"""The getting-started page's commands, as a reader types them, in an empty directory:
``python start.py``, ``geneva-drive worker --app app`` until the workflow finishes, then Ctrl-C
(exit 0), and ``geneva-drive show 1``. The page's code runs in test_snippets; this runs its
command lines, which that test leaves alone."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from tests.docs.test_snippets import DOCS, page_environment, python_blocks

PAGE = DOCS / "getting-started.md"
URL = "sqlite:///app.db"
WORKER = f"geneva-drive worker --database-url {URL} --app app"
SHOW = f"geneva-drive show 1 --database-url {URL} --app app"


def geneva_drive(*args: str) -> list[str]:
    return [sys.executable, "-m", "geneva_drive", *args]  # the `geneva-drive` script's entry


def write_the_page_files(directory: Path) -> None:
    for block in python_blocks(PAGE):
        if block.title == "app.py":
            (directory / "app.py").write_text(block.source)
        elif block.source.startswith("# start.py\n"):
            (directory / "start.py").write_text(block.source)
    assert {"app.py", "start.py"} <= {p.name for p in directory.iterdir()}


def workflow_state(directory: Path) -> str | None:
    engine = create_engine(f"sqlite:///{directory / 'app.db'}")
    try:
        with engine.connect() as connection:
            return connection.scalar(text("SELECT state FROM geneva_drive_workflows"))
    finally:
        engine.dispose()


def test_the_page_shows_the_commands_this_test_runs():
    page = PAGE.read_text()

    for command in ("$ python start.py", f"$ {WORKER}", f"$ {SHOW}"):
        assert command in page, f"docs/getting-started.md no longer shows {command!r}"


def test_a_reader_following_the_page_gets_a_finished_workflow_from_a_worker(tmp_path):
    write_the_page_files(tmp_path)
    env = page_environment()
    run = {"cwd": tmp_path, "env": env, "capture_output": True, "text": True, "timeout": 60}

    started = subprocess.run([sys.executable, "start.py"], check=False, **run)
    assert started.returncode == 0, started.stderr
    assert started.stdout == "started Onboarding 1 for ada@example.com: ready\n"

    worker = subprocess.Popen(
        geneva_drive(*WORKER.split()[1:]),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # An explicit wait on the row the worker writes, bounded: the follow-up is due 2 s
        # after the welcome.
        deadline = time.monotonic() + 30
        while workflow_state(tmp_path) != "finished" and worker.poll() is None:
            assert time.monotonic() < deadline, "the worker did not finish the workflow in 30 s"
            time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGINT)  # Ctrl-C
        stdout, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
    assert stdout == "welcome, ada@example.com\nhow is it going, ada@example.com?\n"

    shown = subprocess.run(geneva_drive(*SHOW.split()[1:]), check=False, **run)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("workflow 1  Onboarding  finished")
    assert "follow_up  completed  success" in shown.stdout

"""Running the operator commands: in-process with Typer's CliRunner, or as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from geneva_drive.cli.main import app

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 120


def invoke(url: str, *args: str, input: str | None = None) -> Any:
    """``geneva-drive ARGS --database-url URL`` in this process (its workflow classes loaded).

    Wide, so that Rich does not fold the values a test looks for.
    """
    runner = CliRunner()
    return runner.invoke(app, [*args, "--database-url", url], input=input, env={"COLUMNS": "250"})


def invoke_json(url: str, *args: str) -> Any:
    result = invoke(url, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def command(
    *args: str, url: str, path: Path | None = None, columns: str | None = "250"
) -> subprocess.CompletedProcess[str]:
    """The real command in a fresh process: only the --app modules' classes are loaded.

    ``columns``: the terminal width it is told; None tells none (what ``| grep`` gives it).
    """
    unset = {"GENEVA_DRIVE_DATABASE_URL", "COLUMNS", "LINES"}
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["GENEVA_DRIVE_DATABASE_URL"] = url
    if columns is not None:
        env["COLUMNS"] = columns
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "geneva_drive", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert lines, "no error printed"
    assert lines[-1].startswith("geneva-drive"), stderr
    return lines[-1]

"""Running a user's test module under pytest, in a process of its own, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# What a user's project configures, and no more: warnings are errors there too, so a warning
# the plugin or the helpers cause fails these tests.
PYTEST_INI = "[pytest]\nfilterwarnings = error\naddopts = -p no:cacheprovider\n"


def url_for(db_backend: str, request: pytest.FixtureRequest) -> str | None:
    """None on SQLite (the plugin's default, a temporary file); else a fresh empty database."""
    if db_backend == "sqlite":
        return None
    return str(request.getfixturevalue("database_url"))


def run_pytest(
    directory: Path,
    modules: dict[str, str],
    *args: str,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Write ``modules`` (file name → source) and a pytest.ini into ``directory``, run pytest
    there in a new interpreter (which loads the plugin through its entry point), return it."""
    (directory / "pytest.ini").write_text(PYTEST_INI)
    for name, source in modules.items():
        (directory / name).write_text(source)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GENEVA_DRIVE_")}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", *args],
        cwd=directory,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def outcome(result: subprocess.CompletedProcess[str]) -> str:
    """The last line of pytest's summary ("3 passed in 0.52s"), with the output on failure."""
    lines = result.stdout.strip().splitlines()
    return lines[-1] if lines else f"no output; stderr:\n{result.stderr}"


def explain(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"

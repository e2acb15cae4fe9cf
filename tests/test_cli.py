"""The ``geneva-drive`` command, run as a user runs it: errors are one line with the fix.

Every test starts the real command in a subprocess (``python -m geneva_drive``), so what is
checked is what a terminal shows: stderr, the exit code, and no traceback unless asked for.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from geneva_drive import __version__
from geneva_drive.storage.migrate import VERSION_TABLE, alembic_config

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 120  # a command that hangs (retrying for ever) fails the test instead


def run(
    *args: str, url: str | None = None, path: Path | None = None, script: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GENEVA_DRIVE_DATABASE_URL"}
    if url is not None:
        env["GENEVA_DRIVE_DATABASE_URL"] = url
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    command = (
        [str(Path(sys.executable).parent / "geneva-drive")]
        if script
        else [
            sys.executable,
            "-m",
            "geneva_drive",
        ]
    )
    return subprocess.run(
        [*command, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The command's error: no traceback, and its last stderr line names the command."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines, "no error printed"
    assert lines[-1].startswith("geneva-drive"), result.stderr
    return lines[-1]


def closed_port_url() -> str:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now: connections are refused at once
    return f"postgresql+psycopg://nobody@127.0.0.1:{port}/nothing"


# -- the command itself ------------------------------------------------------------------------


def test_version_is_printed_by_the_command_and_by_python_dash_m():
    for result in (run("--version"), run("--version", script=True)):
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"geneva-drive {__version__}"


@pytest.mark.parametrize("command", ["housekeeping", "dispatch", "worker"])
def test_boolean_flags_show_no_bool_metavar_in_help(command):
    result = run(command, "--help")

    assert result.returncode == 0
    assert "<bool>" not in result.stdout, result.stdout
    assert "--app MODULE[:ATTR]" in result.stdout


def test_a_missing_database_url_is_one_line_naming_the_option_and_the_variable():
    result = run("housekeeping")

    line = one_error_line(result)
    assert result.returncode == 2
    assert "--database-url" in line and "GENEVA_DRIVE_DATABASE_URL" in line


def test_an_unparsable_database_url_is_one_line():
    result = run("migrate", url="not a url")

    assert "--database-url" in one_error_line(result)
    assert result.returncode == 2


# -- --app --------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["worker", "housekeeping", "dispatch"])
def test_an_app_module_that_does_not_exist_is_one_line_on_every_command(command, tmp_path):
    result = run(command, "--app", "no_such_project.workflows", url=f"sqlite:///{tmp_path}/x.db")

    line = one_error_line(result)
    assert result.returncode == 2
    assert "--app 'no_such_project.workflows': no module named 'no_such_project'" in line


def test_an_app_that_fails_to_import_says_so_in_one_line_and_traceback_shows_where(tmp_path):
    (tmp_path / "broken_app.py").write_text("import no_such_dependency_either\n")
    url = f"sqlite:///{tmp_path}/x.db"

    short = run("housekeeping", "--app", "broken_app", url=url, path=tmp_path)
    full = run("housekeeping", "--app", "broken_app", "--traceback", url=url, path=tmp_path)

    line = one_error_line(short)
    assert "--app 'broken_app': importing it raised ModuleNotFoundError" in line
    assert "--traceback" in line
    assert "Traceback (most recent call last)" in full.stderr
    assert full.returncode != 0


def test_app_takes_module_colon_attribute_on_the_worker_and_housekeeping(installed_sqlite_url):
    result = run(
        "housekeeping", "--app", "tests.worker.apps:WorkerScaleThreeSteps", url=installed_sqlite_url
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("{")


def test_app_names_a_missing_attribute_in_one_line(installed_sqlite_url):
    result = run("worker", "--app", "tests.worker.apps:NoSuchThing", url=installed_sqlite_url)

    line = one_error_line(result)
    assert result.returncode == 2
    assert "module 'tests.worker.apps' has no attribute 'NoSuchThing'" in line


def test_a_worker_without_workflows_refuses_to_start(installed_sqlite_url):
    result = run("worker", url=installed_sqlite_url)

    line = one_error_line(result)
    assert result.returncode == 2
    assert "no workflows loaded; pass --app" in line


def test_options_that_are_wrong_together_are_a_usage_error_naming_the_option(
    installed_sqlite_url,
):
    result = run(
        "worker",
        "--app",
        "tests.worker.apps",
        "--lease",
        "3",
        "--heartbeat-interval",
        "2",
        url=installed_sqlite_url,
    )

    line = one_error_line(result)
    assert result.returncode == 2
    assert "Invalid value for '--heartbeat-interval'" in line
    assert "at least three times per lease" in line


# -- startup checks -----------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["worker", "housekeeping"])
def test_an_unreachable_database_is_retried_for_a_bounded_time_then_one_line(command):
    result = run(
        command, "--app", "tests.worker.apps", "--wait-for-database", "1", url=closed_port_url()
    )

    line = one_error_line(result)
    assert result.returncode == 1
    assert "cannot reach the database at postgresql+psycopg://nobody@127.0.0.1:" in line
    assert "after 1 s" in line and "Connection refused" in line
    assert len(result.stderr.strip().splitlines()) == 2  # "retrying for up to 1 s", then this


@pytest.mark.parametrize("command", ["worker", "housekeeping"])
def test_a_database_without_the_schema_stops_the_command_at_once_naming_migrate(
    command, database_url
):
    empty = sa.create_engine(database_url)
    empty.connect().close()  # on SQLite an empty file: a missing one is another error
    empty.dispose()
    result = run(command, "--app", "tests.worker.apps", url=database_url)

    line = one_error_line(result)
    assert result.returncode == 1
    assert "the database has no geneva-drive schema" in line
    assert "geneva-drive migrate" in line and _head() in line


def test_a_schema_older_than_the_package_names_both_revisions_and_migrate(installed_sqlite_url):
    engine = sa.create_engine(installed_sqlite_url)
    with engine.begin() as connection:
        from alembic import command

        command.downgrade(alembic_config(connection), "-1")
        older = connection.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
    engine.dispose()

    result = run("worker", "--app", "tests.worker.apps", url=installed_sqlite_url)

    line = one_error_line(result)
    assert result.returncode == 1
    assert f"at revision {older}, older than this package's {_head()}" in line
    assert "geneva-drive migrate" in line


def test_a_schema_newer_than_the_package_names_both_revisions(installed_sqlite_url):
    engine = sa.create_engine(installed_sqlite_url)
    with engine.begin() as connection:
        connection.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '0099'"))
    engine.dispose()

    result = run("housekeeping", url=installed_sqlite_url)

    line = one_error_line(result)
    assert result.returncode == 1
    assert "at revision 0099, which this package does not know" in line
    assert _head() in line


def _head() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


@pytest.fixture
def installed_sqlite_url(tmp_path: Path) -> str:
    import geneva_drive

    url = f"sqlite:///{tmp_path}/installed.db"
    engine = geneva_drive.create_engine(url)
    geneva_drive.install(engine)
    engine.dispose()
    return url

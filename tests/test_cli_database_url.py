"""``--database-url`` mistakes are usage errors (exit 2) that say the URL to write and the
extra to install; and only ``migrate`` creates a SQLite file — every other command names the
absolute file it looked for instead of leaving an empty database behind."""

from __future__ import annotations

import sys

import pytest

from geneva_drive.cli.main import main
from tests.test_cli import run


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    code = exited.value.code
    return (code if isinstance(code, int) else 0), capsys.readouterr().err.strip()


@pytest.mark.parametrize(
    ("url", "hidden", "suggested", "extra"),
    [
        (
            "postgres://app:secret@db/app",
            ("psycopg",),
            "postgresql+psycopg://app:***@db/app",
            "pip install 'geneva-drive[postgres]'",
        ),
        (
            "postgresql://app@db/app",
            ("psycopg2", "psycopg"),  # the default driver: psycopg2 before SQLAlchemy 2.1
            "postgresql+psycopg://app@db/app",
            "pip install 'geneva-drive[postgres]'",
        ),
        (
            "mysql://app@db/app",
            ("MySQLdb", "pymysql"),
            "mysql+pymysql://app@db/app",
            "pip install 'geneva-drive[mysql]'",
        ),
        (
            "mysql+pymysql://app@db/app",
            ("pymysql",),
            "mysql+pymysql://app@db/app",
            "pip install 'geneva-drive[mysql]'",
        ),
        (
            "postgresql+psycopg://app@db/app",
            ("psycopg",),
            "postgresql+psycopg://app@db/app",
            "pip install 'geneva-drive[postgres]'",
        ),
    ],
)
def test_a_url_for_a_driver_that_is_not_there_suggests_the_url_and_the_extra(
    capsys, monkeypatch, url, hidden, suggested, extra
):
    for module in hidden:  # as if not installed: importing it raises ModuleNotFoundError
        monkeypatch.setitem(sys.modules, module, None)

    code, err = run_main(capsys, "list", "--database-url", url)

    assert code == 2, err
    assert err.startswith("geneva-drive list: error: --database-url"), err
    assert suggested in err and extra in err
    assert "secret" not in err


def test_an_extra_already_installed_is_not_suggested(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "MySQLdb", None)

    code, err = run_main(capsys, "list", "--database-url", "mysql://app@db/app")

    assert code == 2, err
    assert "write mysql+pymysql://app@db/app" in err
    assert "pip install" not in err  # PyMySQL is installed here


def test_a_sqlite_file_that_does_not_exist_is_named_and_not_created(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    code, err = run_main(capsys, "list", "--database-url", "sqlite:///app.db")

    assert code == 2, err
    assert f"no SQLite database at {tmp_path / 'app.db'}" in err
    assert "geneva-drive migrate" in err
    assert not (tmp_path / "app.db").exists()


@pytest.mark.parametrize(
    "command", [("worker", "--app", "tests.worker.apps"), ("housekeeping",), ("stats",)]
)
def test_no_command_but_migrate_creates_a_sqlite_file(command, tmp_path):
    missing = tmp_path / "missing.db"

    result = run(*command, url=f"sqlite:///{missing}")

    assert result.returncode == 2, result.stderr
    assert f"no SQLite database at {missing}" in result.stderr
    assert not missing.exists()


def test_migrate_creates_the_sqlite_file(tmp_path):
    created = tmp_path / "new.db"

    result = run("migrate", url=f"sqlite:///{created}")

    assert result.returncode == 0, result.stderr
    assert created.exists()


def test_an_in_memory_sqlite_url_is_not_taken_for_a_missing_file(capsys):
    code, err = run_main(capsys, "list", "--database-url", "sqlite://")

    assert "no SQLite database" not in err
    assert "no geneva-drive schema" in err and code == 1

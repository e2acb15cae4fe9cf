"""SQLite: one writer at a time, no row locks — WAL, a busy timeout, and ``BEGIN IMMEDIATE``
for geneva-drive's own transactions; a single node."""

from __future__ import annotations

import functools
import sqlite3
import time
from typing import Any, ClassVar

from sqlalchemy import Engine, Insert, Table, Update, event, false, update
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session

from geneva_drive.storage.dialects.base import Dialect
from geneva_drive.storage.models import WORKFLOWS, Base

BUSY_TIMEOUT_MS = 30_000
IMMEDIATE_OPTION = "geneva_drive_begin_immediate"


class SQLite(Dialect):
    names: ClassVar[tuple[str, ...]] = ("sqlite",)
    single_writer = True
    default_concurrency = 1
    async_driver = "aiosqlite"

    def prepare(self, engine: Engine) -> Engine:
        """SQLite has no row locks: a transaction that reads and later writes can fail with
        SQLITE_BUSY_SNAPSHOT when another connection wrote in between, and the busy handler
        cannot retry that. geneva-drive's own transactions (executor, worker, housekeeping)
        therefore start with ``BEGIN IMMEDIATE``, taking the single write lock up front so
        writers queue on the busy timeout instead — SQLite's equivalent of ``SELECT … FOR
        UPDATE`` on the workflow row. The application's transactions keep a deferred
        ``BEGIN``. WAL keeps plain readers unblocked.
        """
        if event.contains(engine, "begin", _begin_immediate):
            return engine
        event.listen(engine, "connect", _configure_connection)
        event.listen(engine, "begin", _begin_immediate)
        return engine

    def immediate_transactions(self, engine: Engine) -> Engine:
        self.prepare(engine)
        return engine.execution_options(**{IMMEDIATE_OPTION: True})

    def for_workers(self, engine: Engine) -> Engine:
        return self.immediate_transactions(engine)

    def take_write_lock(self, session: Session) -> None:
        """Why: ``create()``, ``signal()`` and the operator verbs read before they write, in
        the application's transaction, which SQLite begins deferred. Its first read fixes the
        transaction's snapshot, and SQLite refuses to let a transaction write from a snapshot
        that another commit has since overtaken — "database is locked" at once, without
        waiting on the busy timeout. Writing first (an UPDATE that matches no row still takes
        the lock) makes the caller wait for the lock instead, within the busy timeout, and
        read the latest data under it: SQLite's ``SELECT … FOR UPDATE``, as ``BEGIN
        IMMEDIATE`` is for geneva-drive's own sessions, which already hold it. A transaction
        that read before calling us and was overtaken meanwhile still fails here; nothing can
        move its snapshot.
        """
        connection = session.connection()
        if connection.get_execution_options().get(IMMEDIATE_OPTION):
            return  # began with BEGIN IMMEDIATE: it holds the lock already
        connection.execute(_no_op_write())

    def insert_skipping_conflicts(self, table: Table) -> Insert:
        return sqlite.insert(table).on_conflict_do_nothing()


@functools.cache
def _no_op_write() -> Update:
    table = Base.metadata.tables[WORKFLOWS]
    return update(table).where(false()).values({table.c.id: table.c.id})


def _configure_connection(dbapi_connection: Any, _record: Any) -> None:
    # Let us issue BEGIN ourselves (pysqlite otherwise emits a deferred BEGIN lazily).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
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
    # Not ``execute(...).fetchone()``: DB-API leaves execute's return value undefined, and an
    # async driver's adapted cursor (aiosqlite) does not return itself.
    cursor.execute("PRAGMA journal_mode")
    mode = cursor.fetchone()[0]
    if str(mode).lower() in ("wal", "memory"):  # already done, or an in-memory database
        return
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
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

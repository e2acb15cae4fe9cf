"""Cross-process coordination: NOTIFY/LISTEN wake-ups, the housekeeping advisory lock, and
SQLite's write lock for the application's own transactions."""

from __future__ import annotations

import functools

from sqlalchemy import (
    Connection,
    false,
    func,
    select,
    update,
)
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Update

from geneva_drive.storage.db import IMMEDIATE_OPTION
from geneva_drive.storage.queries._sql import workflow_model

# -- SQLite: the write lock before the first read -------------------------------------------


def take_write_lock(session: Session) -> None:
    """On SQLite, make ``session``'s transaction hold the database write lock from now on.

    Why: ``create()``, ``signal()`` and the operator verbs read before they write, in the
    application's transaction, which SQLite begins deferred. Its first read fixes the
    transaction's snapshot, and SQLite refuses to let a transaction write from a snapshot that
    another commit has since overtaken — "database is locked" at once, without waiting on the
    busy timeout. Writing first (an UPDATE that matches no row still takes the lock) makes the
    caller wait for the lock instead, within the busy timeout, and read the latest data under
    it: SQLite's ``SELECT … FOR UPDATE``, as ``BEGIN IMMEDIATE`` is for geneva-drive's own
    sessions, which already hold it. A transaction that read before calling us and was
    overtaken meanwhile still fails here; nothing can move its snapshot. PostgreSQL and
    MariaDB lock the workflow row instead: nothing to do.
    """
    if session.get_bind().dialect.name != "sqlite":
        return
    connection = session.connection()
    if connection.get_execution_options().get(IMMEDIATE_OPTION):
        return  # began with BEGIN IMMEDIATE: it holds the lock already
    connection.execute(_no_op_write())


@functools.cache
def _no_op_write() -> Update:
    workflow = workflow_model()
    return update(workflow).where(false()).values({workflow.id: workflow.id})


# -- cross-process coordination: NOTIFY and the housekeeping lock ----------------------------

NOTIFY_CHANNEL = "geneva_drive"
# An arbitrary, fixed 64-bit key for pg_try_advisory_lock ("gd-hk" in ASCII).
HOUSEKEEPING_LOCK_KEY = 0x67642D686B


def notifies(connection: Connection) -> bool:
    """Whether ``connection``'s database has NOTIFY (PostgreSQL) to wake idle workers."""
    return connection.dialect.name == "postgresql"


def notify_due(connection: Connection, queue: str) -> None:
    """``NOTIFY geneva_drive, '<queue>'`` (PostgreSQL): wake listening idle workers."""
    connection.execute(select(func.pg_notify(NOTIFY_CHANNEL, queue)))


def try_housekeeping_lock(connection: Connection) -> bool:
    """Take the cluster-wide housekeeping lock on ``connection`` if free; never waits.

    PostgreSQL: a session-level advisory lock, released by :func:`release_housekeeping_lock`
    or when the connection closes (a crashed holder cannot keep it). MySQL/MariaDB:
    ``GET_LOCK`` with the same life cycle. SQLite runs on one node: always granted.
    """
    dialect = connection.dialect.name
    if dialect == "postgresql":
        return bool(
            connection.execute(select(func.pg_try_advisory_lock(HOUSEKEEPING_LOCK_KEY))).scalar()
        )
    if dialect in ("mysql", "mariadb"):
        return (
            connection.execute(select(func.get_lock("geneva_drive_housekeeping", 0))).scalar() == 1
        )
    return True


def release_housekeeping_lock(connection: Connection) -> None:
    dialect = connection.dialect.name
    if dialect == "postgresql":
        connection.execute(select(func.pg_advisory_unlock(HOUSEKEEPING_LOCK_KEY)))
    elif dialect in ("mysql", "mariadb"):
        connection.execute(select(func.release_lock("geneva_drive_housekeeping")))


def listen_statement() -> str:
    """What an idle worker's dedicated connection runs to receive :func:`notify_due`."""
    return f"LISTEN {NOTIFY_CHANNEL}"

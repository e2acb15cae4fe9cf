"""Cross-process coordination: NOTIFY/LISTEN wake-ups, the housekeeping lock, and the write
lock an application's transaction takes before its first read. How each is done on each
database is the dialect's (``storage.dialects``)."""

from __future__ import annotations

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from geneva_drive.storage.dialects import dialect_of

NOTIFY_CHANNEL = "geneva_drive"


def take_write_lock(session: Session) -> None:
    """Make ``session``'s transaction hold the database write lock from now on, where the
    database has one writer (SQLite); PostgreSQL and MariaDB lock the workflow row instead."""
    dialect_of(session).take_write_lock(session)


def notifies(connection: Connection) -> bool:
    """Whether ``connection``'s database has NOTIFY (PostgreSQL) to wake idle workers."""
    return dialect_of(connection).notifies


def notify_due(connection: Connection, queue: str) -> None:
    """``NOTIFY geneva_drive, '<queue>'`` (PostgreSQL): wake listening idle workers."""
    dialect_of(connection).notify(connection, NOTIFY_CHANNEL, queue)


def try_housekeeping_lock(connection: Connection) -> bool:
    """Take the cluster-wide housekeeping lock on ``connection`` if free; never waits.

    Released by :func:`release_housekeeping_lock` or when the connection closes (a crashed
    holder cannot keep it). SQLite runs on one node: always granted.
    """
    return dialect_of(connection).try_housekeeping_lock(connection)


def release_housekeeping_lock(connection: Connection) -> None:
    dialect_of(connection).release_housekeeping_lock(connection)


def listen_statement() -> str:
    """What an idle worker's dedicated connection runs to receive :func:`notify_due`."""
    return f"LISTEN {NOTIFY_CHANNEL}"

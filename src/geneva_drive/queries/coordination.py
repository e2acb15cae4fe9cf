"""Cross-process coordination: NOTIFY/LISTEN wake-ups and the housekeeping advisory lock."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import (
    Connection,
    func,
    select,
)

if TYPE_CHECKING:
    pass


# -- cross-process coordination: NOTIFY and the housekeeping lock ----------------------------

NOTIFY_CHANNEL = "geneva_drive"
# An arbitrary, fixed 64-bit key for pg_try_advisory_lock ("gd-hk" in ASCII).
HOUSEKEEPING_LOCK_KEY = 0x67642D686B


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

"""PostgreSQL: row locks, ``SKIP LOCKED``, data-modifying CTEs, LISTEN/NOTIFY, advisory locks."""

from __future__ import annotations

from typing import ClassVar

from sqlalchemy import Connection, Insert, Table, func, select
from sqlalchemy.dialects import postgresql

from geneva_drive.storage.dialects.base import Dialect

# An arbitrary, fixed 64-bit key for pg_try_advisory_lock ("gd-hk" in ASCII).
HOUSEKEEPING_LOCK_KEY = 0x67642D686B


class PostgreSQL(Dialect):
    names: ClassVar[tuple[str, ...]] = ("postgresql",)
    notifies = True
    combined_writes = True
    windowed_claim = True

    def insert_skipping_conflicts(self, table: Table) -> Insert:
        return postgresql.insert(table).on_conflict_do_nothing()

    def try_housekeeping_lock(self, connection: Connection) -> bool:
        # A session-level advisory lock: a crashed holder's connection closes and frees it.
        lock = func.pg_try_advisory_lock(HOUSEKEEPING_LOCK_KEY)
        return bool(connection.execute(select(lock)).scalar())

    def release_housekeeping_lock(self, connection: Connection) -> None:
        connection.execute(select(func.pg_advisory_unlock(HOUSEKEEPING_LOCK_KEY)))

    def notify(self, connection: Connection, channel: str, payload: str) -> None:
        connection.execute(select(func.pg_notify(channel, payload)))

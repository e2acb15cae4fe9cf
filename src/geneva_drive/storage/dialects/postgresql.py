"""PostgreSQL: row locks, ``SKIP LOCKED``, data-modifying CTEs, LISTEN/NOTIFY, advisory locks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

from sqlalchemy import Connection, Insert, Table, func, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from geneva_drive.storage.dialects.base import Dialect

# What short reads (the overview's statistics) plan with: stock PostgreSQL JIT-compiles a
# statement whose estimated cost passes jit_above_cost (the counts over a large history do),
# which cost ~20 ms at every call for a query that runs in a few, and plans parallel workers
# that a 2-core server cannot give it for free. Statements are sent as set_config(…, true):
# SET LOCAL's value, and the old value back after.
SHORT_READ_SETTINGS = {"jit": "off", "max_parallel_workers_per_gather": "0"}
_SET = text(
    "SELECT current_setting('jit'), current_setting('max_parallel_workers_per_gather'), "
    "set_config('jit', :jit, true), "
    "set_config('max_parallel_workers_per_gather', :max_parallel_workers_per_gather, true)"
)

# An arbitrary, fixed 64-bit key for pg_try_advisory_lock ("gd-hk" in ASCII).
HOUSEKEEPING_LOCK_KEY = 0x67642D686B


class PostgreSQL(Dialect):
    names: ClassVar[tuple[str, ...]] = ("postgresql",)
    async_driver = "psycopg_async"  # the psycopg 3 the sync side uses, in its async mode
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

    @contextmanager
    def short_statements(self, session: Session) -> Iterator[None]:
        # The old values are read before the new ones are set (a select list is evaluated
        # left to right), in one round trip; they are put back the same way, so the caller's
        # transaction, if it goes on, plans as it did.
        jit, workers, *_ = session.execute(_SET, SHORT_READ_SETTINGS).one()
        try:
            yield
        finally:
            session.execute(_SET, {"jit": jit, "max_parallel_workers_per_gather": workers})

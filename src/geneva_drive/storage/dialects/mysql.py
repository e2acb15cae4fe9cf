"""MySQL ≥ 8 and MariaDB ≥ 10.6: ``SKIP LOCKED`` without ``FOR UPDATE OF``, READ COMMITTED,
unique keys in generated columns (no partial indexes), named locks."""

from __future__ import annotations

from typing import Any, ClassVar

import sqlalchemy
from sqlalchemy import Connection, Engine, Insert, Table, func, select
from sqlalchemy.dialects import mysql

from geneva_drive.storage.dialects.base import Dialect

# PostgreSQL's default, and what the engine's locking is written for: after a transaction locks
# a workflow row, its plain reads must see what other transactions committed before that. Under
# InnoDB's default REPEATABLE READ they would read the transaction's first snapshot instead
# (e.g. miss an execution row created by the previous lock holder), and range updates would
# take gap locks that make concurrent workers deadlock on each other's inserts.
ISOLATION_LEVEL = "READ COMMITTED"
HOUSEKEEPING_LOCK = "geneva_drive_housekeeping"


class MySQL(Dialect):
    # SQLAlchemy calls MariaDB "mariadb" for mariadb:// URLs, "mysql" otherwise.
    names: ClassVar[tuple[str, ...]] = ("mysql", "mariadb")
    async_driver = "aiomysql"
    claims_candidates_then_locks = True
    # No ON CONFLICT: a refused row is InnoDB's statement-level rollback.
    skips_conflicting_inserts = False
    # A single-table DELETE with an IN sub-query runs it as a *dependent* sub-query for every
    # row of the table (no semi-join for DELETE before MariaDB 11.1).
    deletes_by_semi_join = False
    # InnoDB runs ``INSERT … SELECT`` from the table it inserts into with the table's AUTO-INC
    # lock held to the statement's end and shared locks on the rows it reads: two workers'
    # completions, each holding the other's next row lock, deadlocked (a worker then stalled
    # until its lease was recovered). A plain INSERT takes the AUTO-INC lock only for the
    # moment it draws an id, and reads nothing.
    counts_attempt_on_insert = False

    def insert_keeping_existing(self, table: Table) -> Insert:
        # A no-op ON DUPLICATE KEY UPDATE: no savepoint to lose. InnoDB rolls back the whole
        # transaction on a deadlock, savepoints included, so a statement undone inside one
        # surfaced as "SAVEPOINT … does not exist" instead of the deadlock.
        first = next(iter(table.primary_key.columns))
        return mysql.insert(table).on_duplicate_key_update({first.name: first})

    def engine_arguments(
        self, url: sqlalchemy.URL, kwargs: dict[str, Any]
    ) -> tuple[sqlalchemy.URL, dict[str, Any]]:
        """READ COMMITTED for every connection (unless ``isolation_level`` is given) and the
        utf8mb4 connection character set (unless the URL names a ``charset``)."""
        kwargs = {"isolation_level": ISOLATION_LEVEL, **kwargs}
        if "charset" not in url.query:
            url = url.update_query_dict({"charset": "utf8mb4"})
        return url, kwargs

    def for_workers(self, engine: Engine) -> Engine:
        """READ COMMITTED even when the application's engine defaults to another level."""
        # create_engine() already set it for every connection; don't SET it again per checkout.
        if getattr(engine.dialect, "_on_connect_isolation_level", None) == ISOLATION_LEVEL:
            return engine
        return engine.execution_options(isolation_level=ISOLATION_LEVEL)

    def try_housekeeping_lock(self, connection: Connection) -> bool:
        # GET_LOCK is held by the connection, and freed when it closes, as an advisory lock.
        return connection.execute(select(func.get_lock(HOUSEKEEPING_LOCK, 0))).scalar() == 1

    def release_housekeeping_lock(self, connection: Connection) -> None:
        connection.execute(select(func.release_lock(HOUSEKEEPING_LOCK)))

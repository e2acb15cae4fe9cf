"""One module per database: everything in which PostgreSQL, MySQL/MariaDB and SQLite differ.

Like Oban's engines, each module implements one small interface (:class:`Dialect`): engine
preparation, the write lock, the housekeeping lock, NOTIFY/LISTEN, the conflict-skipping
INSERT, and flags that say which statements the query layer writes for the database. Code
outside this package (and the migrations, and the DDL variants of the schema in ``models``)
never asks which database it is on; it asks the dialect of its connection what it can do.

| what                  | PostgreSQL           | MySQL / MariaDB         | SQLite             |
|-----------------------|----------------------|-------------------------|--------------------|
| idle workers woken by | NOTIFY in the tx     | polling                 | polling            |
| one-statement writes  | data-modifying CTEs  | no                      | no                 |
| claim                 | windows, SKIP LOCKED | candidates, then locks  | BEGIN IMMEDIATE    |
| conflicting INSERT    | ON CONFLICT skips it | fails the statement     | ON CONFLICT skips  |
| housekeeping lock     | advisory lock        | GET_LOCK                | none (one node)    |
| engine preparation    | —                    | READ COMMITTED, utf8mb4 | WAL, busy timeout  |

The statements themselves stay in the query layer, one module per concern (``queries``):
the flags choose among them, so a statement and its portable twin sit side by side.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from geneva_drive.storage.dialects.base import Dialect
from geneva_drive.storage.dialects.mysql import MySQL
from geneva_drive.storage.dialects.postgresql import PostgreSQL
from geneva_drive.storage.dialects.sqlite import SQLite

_BY_NAME: dict[str, Dialect] = {
    name: dialect for dialect in (PostgreSQL(), MySQL(), SQLite()) for name in dialect.names
}
_PORTABLE = Dialect()  # another database SQLAlchemy speaks: the portable statements only


def dialect_named(name: str) -> Dialect:
    """The dialect of SQLAlchemy's dialect ``name`` ("postgresql", "mariadb", …)."""
    return _BY_NAME.get(name, _PORTABLE)


def dialect_of(bind: Session | Connection | Engine) -> Dialect:
    """The dialect of what ``bind`` talks to (a session's: its bind's)."""
    if isinstance(bind, Session):
        return _BY_NAME.get(bind.get_bind().dialect.name, _PORTABLE)
    return _BY_NAME.get(bind.dialect.name, _PORTABLE)


__all__ = ["Dialect", "MySQL", "PostgreSQL", "SQLite", "dialect_named", "dialect_of"]

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

import importlib
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from geneva_drive.storage.dialects.base import Dialect

if TYPE_CHECKING:
    from geneva_drive.storage.dialects.mysql import MySQL
    from geneva_drive.storage.dialects.postgresql import PostgreSQL
    from geneva_drive.storage.dialects.sqlite import SQLite

# SQLAlchemy's dialect name → (our module, its class). A module is imported when its database
# is first asked for: each imports SQLAlchemy's package for its database (PostgreSQL's brings
# every driver's module, asyncpg's adapter and asyncio with it), which a process talking to
# another database should not pay for at start (issue 42).
_MODULES: dict[str, tuple[str, str]] = {
    "postgresql": ("geneva_drive.storage.dialects.postgresql", "PostgreSQL"),
    "mysql": ("geneva_drive.storage.dialects.mysql", "MySQL"),
    "mariadb": ("geneva_drive.storage.dialects.mysql", "MySQL"),
    "sqlite": ("geneva_drive.storage.dialects.sqlite", "SQLite"),
}
_BY_NAME: dict[str, Dialect] = {}
_PORTABLE = Dialect()  # another database SQLAlchemy speaks: the portable statements only


def dialect_named(name: str) -> Dialect:
    """The dialect of SQLAlchemy's dialect ``name`` ("postgresql", "mariadb", …)."""
    dialect = _BY_NAME.get(name)
    if dialect is None:
        where = _MODULES.get(name)
        if where is None:
            return _PORTABLE
        module, class_name = where
        dialect = getattr(importlib.import_module(module), class_name)()
        _BY_NAME[name] = dialect  # two threads may both make one: equal, stateless
    return dialect


def dialect_of(bind: Session | Connection | Engine) -> Dialect:
    """The dialect of what ``bind`` talks to (a session's: its bind's)."""
    if isinstance(bind, Session):
        return dialect_named(bind.get_bind().dialect.name)
    return dialect_named(bind.dialect.name)


def __getattr__(name: str) -> type[Dialect]:
    """``MySQL``, ``PostgreSQL``, ``SQLite``: each class, its module imported on first use."""
    for module, class_name in _MODULES.values():
        if class_name == name:
            found: type[Dialect] = getattr(importlib.import_module(module), name)
            return found
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Dialect", "MySQL", "PostgreSQL", "SQLite", "dialect_named", "dialect_of"]

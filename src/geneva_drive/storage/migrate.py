"""Installing and upgrading the geneva-drive schema with the Alembic migrations we ship.

The migrations live in the package (``geneva_drive/migrations``) and record their revision in
their own table, ``geneva_drive_alembic_version``, so they never touch the application's own
Alembic history. No ``alembic.ini`` is needed: the configuration is built here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.resources import files
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, Index, delete, text

from geneva_drive.storage.db import engine_for_workers, prepare_engine
from geneva_drive.storage.models import (
    DIALECTS_INFO_KEY,
    MYSQL_DIALECTS,
    MYSQL_UNIQUE_KEY_COLUMNS,
    Base,
)
from geneva_drive.storage.revision import VERSION_TABLE as VERSION_TABLE
from geneva_drive.storage.revision import current_revision as current_revision

# Alembic's ``context`` and ``op`` are process-wide proxies: two threads running commands at
# once would swap them under each other (and deadlock against the database's locks).
_THREAD_LOCK = threading.Lock()
# Serializes install()/upgrade() across processes on PostgreSQL (several app instances booting at
# once); transaction-scoped, so the commit releases it. On SQLite, BEGIN IMMEDIATE does the same:
# it takes the database's single write lock before Alembic reads the version table.
_PG_LOCK_KEY = 0x6765_6E65_7661  # "geneva"
# MySQL/MariaDB: a named lock instead. DDL commits implicitly there, so it cannot be tied to a
# transaction; GET_LOCK is held by the connection until RELEASE_LOCK (or disconnect).
_MYSQL_LOCK_NAME = "geneva_drive.migrate"
MYSQL_LOCK_TIMEOUT_S = 300


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic ``Config`` for our migrations, running on ``connection`` if given.

    Lets Alembic's ``command`` functions (downgrade, history, …) be used directly.
    """
    config = Config()
    config.set_main_option("script_location", str(files("geneva_drive.storage") / "migrations"))
    config.set_main_option("version_table", VERSION_TABLE)
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade the geneva-drive schema to ``revision``, in one transaction.

    Prepares ``engine`` as :func:`geneva_drive.prepare_engine` does. On MySQL/MariaDB, DDL
    statements commit implicitly, so an upgrade that fails half-way is not rolled back there;
    concurrent upgrades are still serialised (by ``GET_LOCK``).
    """
    with (
        _THREAD_LOCK,
        engine_for_workers(prepare_engine(engine)).connect() as connection,
        _mysql_named_lock(connection),
        connection.begin(),
    ):
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
        command.upgrade(alembic_config(connection), revision)


@contextmanager
def _mysql_named_lock(connection: Connection) -> Iterator[None]:
    """Hold MySQL/MariaDB's named migration lock around the block (elsewhere: nothing)."""
    if connection.dialect.name not in MYSQL_DIALECTS:
        yield
        return
    got = connection.execute(
        text("SELECT GET_LOCK(:name, :timeout)"),
        {"name": _MYSQL_LOCK_NAME, "timeout": MYSQL_LOCK_TIMEOUT_S},
    ).scalar()
    connection.commit()  # GET_LOCK is not transactional; don't leave a transaction open
    if got != 1:
        raise TimeoutError(
            f"geneva-drive could not install or upgrade its schema: the named lock "
            f"{_MYSQL_LOCK_NAME!r} was not granted within {MYSQL_LOCK_TIMEOUT_S} s (GET_LOCK "
            f"returned {got!r}); another process is migrating and must finish first — find it "
            f"with SELECT IS_USED_LOCK('{_MYSQL_LOCK_NAME}') and retry"
        )
    try:
        yield
    finally:
        try:
            connection.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": _MYSQL_LOCK_NAME})
            connection.commit()
        except Exception:
            connection.invalidate()  # closing the connection releases the lock too


# How MySQL/MariaDB reflect the boolean defaults the models spell as SQL keywords.
_MYSQL_BOOLEAN_DEFAULTS = {"false": "0", "true": "1"}


def compare_server_default(
    context: Any,
    inspected_column: Any,
    metadata_column: Any,
    inspected_default: str | None,
    metadata_default: Any,
    rendered_metadata_default: str | None,
) -> bool | None:
    """Alembic ``compare_server_default``: ``DEFAULT false`` reflects as ``'0'`` on MySQL.

    Returns False (no difference) for that case, None (Alembic's own comparison) otherwise.
    """
    if context.dialect.name not in MYSQL_DIALECTS or rendered_metadata_default is None:
        return None
    expected = _MYSQL_BOOLEAN_DEFAULTS.get(rendered_metadata_default.strip("'").lower())
    if expected is not None and (inspected_default or "").strip("'") == expected:
        return False
    return None


def comparison_filter(dialect_name: str) -> Callable[..., bool]:
    """An Alembic ``include_object`` for comparing a ``dialect_name`` database to the models.

    Leaves out what is not a difference: indexes the models declare only for other dialects
    (``models.only_on``), and on MySQL/MariaDB the generated unique-key columns and their
    indexes, which the models add by DDL rather than declare (``models.MYSQL_UNIQUE_KEYS``).
    """

    def include_object(
        obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
    ) -> bool:
        if type_ == "index" and not reflected and isinstance(obj, Index):
            dialects = obj.info.get(DIALECTS_INFO_KEY)
            if dialects is not None and dialect_name not in dialects:
                return False
        if dialect_name in MYSQL_DIALECTS:
            if type_ == "column" and name in MYSQL_UNIQUE_KEY_COLUMNS:
                return False
            if (
                type_ == "index"
                and reflected
                and isinstance(obj, Index)
                and {column.name for column in obj.columns} & MYSQL_UNIQUE_KEY_COLUMNS
            ):
                return False
        return True

    return include_object


def install(engine: Engine) -> None:
    """Create or bring up to date the geneva-drive tables. Idempotent: safe to run on every boot."""
    upgrade(engine, "head")


def empty(engine: Engine) -> None:
    """Delete every row of geneva-drive's tables; the schema and its version stay (a test's
    clean slate, see ``geneva_drive.pytest_plugin``)."""
    with engine.begin() as connection:
        for table in reversed(Base.metadata.sorted_tables):  # children before parents
            connection.execute(delete(table))


def is_known_revision(revision: str) -> bool:
    """Whether ``revision`` is one of this package's migrations."""
    try:
        ScriptDirectory.from_config(alembic_config()).get_revision(revision)
    except CommandError:
        return False
    return True

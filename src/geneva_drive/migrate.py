"""Installing and upgrading the geneva-drive schema with the Alembic migrations we ship.

The migrations live in the package (``geneva_drive/migrations``) and record their revision in
their own table, ``geneva_drive_alembic_version``, so they never touch the application's own
Alembic history. No ``alembic.ini`` is needed: the configuration is built here.
"""

from __future__ import annotations

import threading
from importlib.resources import files

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, text

from .engine import engine_for_workers, prepare_engine

VERSION_TABLE = "geneva_drive_alembic_version"

# Alembic's ``context`` and ``op`` are process-wide proxies: two threads running commands at
# once would swap them under each other (and deadlock against the database's locks).
_THREAD_LOCK = threading.Lock()
# Serializes install()/upgrade() across processes on PostgreSQL (several app instances booting at
# once); transaction-scoped, so the commit releases it. On SQLite, BEGIN IMMEDIATE does the same:
# it takes the database's single write lock before Alembic reads the version table.
_PG_LOCK_KEY = 0x6765_6E65_7661  # "geneva"


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic ``Config`` for our migrations, running on ``connection`` if given.

    Lets Alembic's ``command`` functions (downgrade, history, …) be used directly.
    """
    config = Config()
    config.set_main_option("script_location", str(files("geneva_drive") / "migrations"))
    config.set_main_option("version_table", VERSION_TABLE)
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade the geneva-drive schema to ``revision``, in one transaction.

    Prepares ``engine`` as :func:`geneva_drive.prepare_engine` does (a no-op unless SQLite).
    """
    with _THREAD_LOCK, engine_for_workers(prepare_engine(engine)).begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
        command.upgrade(alembic_config(connection), revision)


def install(engine: Engine) -> None:
    """Create or bring up to date the geneva-drive tables. Idempotent: safe to run on every boot."""
    upgrade(engine, "head")


def current_revision(engine: Engine) -> str | None:
    """The installed schema revision, or ``None`` if geneva-drive is not installed."""
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()

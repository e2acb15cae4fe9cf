"""Which geneva-drive schema revision a database is at, read without loading Alembic.

Every command that touches the database first checks that its schema is at this package's
head revision (``runtime.startup.check_schema``). Reading one row does not need Alembic's
migration machinery, which costs a command more to import than the row costs to read; the
migrations themselves (``storage.migrate``) still go through Alembic.
"""

from __future__ import annotations

from sqlalchemy import Engine, inspect, text

VERSION_TABLE = "geneva_drive_alembic_version"

# The id of the last migration in ``storage/migrations/versions``. A new migration updates it;
# tests/test_migrations.py checks it against the head Alembic computes from the scripts.
HEAD_REVISION = "0017"


def current_revision(engine: Engine) -> str | None:
    """The installed schema revision, or ``None`` if geneva-drive is not installed."""
    with engine.connect() as connection:
        if not inspect(connection).has_table(VERSION_TABLE):
            return None
        # One row: the migrations never branch (Alembic's own reader refuses several heads).
        versions = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars()
        return next(iter(versions), None)

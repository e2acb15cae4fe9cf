"""Index finished_at, continues_from_id and signal_id only where they are set.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

On PostgreSQL and SQLite the three single-column indexes of the executions table become
partial, ``WHERE <column> IS NOT NULL``; MySQL/MariaDB, which have no partial indexes, keep
them as they are. Every query on these columns compares them with a value (a cut-off, an id),
which implies ``IS NOT NULL``, so the planners use the partial indexes as before.

Why: a step inserts its successor and updates itself, and neither row has a continuation or a
signal, nor the new row a ``finished_at`` — yet each wrote a NULL entry into all three indexes
(an update that changes ``state`` is never HOT on PostgreSQL). Measured on PostgreSQL with
durable commits: 2,332 → 1,964 bytes of WAL per no-op step (benchmarks/HISTORY.md). Written by
hand and frozen like 0001.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EXECUTIONS = "geneva_drive_step_executions"
COLUMNS = ("finished_at", "continues_from_id", "signal_id")


def _partial() -> bool:
    return op.get_bind().dialect.name not in ("mysql", "mariadb")


def _name(column: str) -> str:
    return f"ix_geneva_drive_step_executions_{column}"


def upgrade() -> None:
    if not _partial():
        return  # the same full indexes as before
    for column in COLUMNS:
        op.drop_index(_name(column), table_name=EXECUTIONS)
        where = sa.text(f"{column} IS NOT NULL")
        op.create_index(
            _name(column), EXECUTIONS, [column], postgresql_where=where, sqlite_where=where
        )


def downgrade() -> None:
    if not _partial():
        return
    for column in COLUMNS:
        op.drop_index(_name(column), table_name=EXECUTIONS)
        op.create_index(_name(column), EXECUTIONS, [column])

"""The ordinary claim's indexes hold only the scheduled rows without a fairness key.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05

``ix_geneva_drive_step_executions_due`` and ``…_due_any`` become partial over
``state = 'scheduled' AND fair_key IS NULL`` (PostgreSQL, SQLite). A row with a key is
claimed by its key's turn (``queries.fairness``, through ``…_fair``), never by the ordinary
claim; so in a worker that loads a keyed class, a class without a key is claimed (and handed
over, on PostgreSQL) with the statements of a worker that loads none, and its claim never
walks past a keyed burst to find its row. Each scheduled row is in one of the two claim
indexes, not both. MySQL/MariaDB, which have no partial indexes, keep theirs: there the
ordinary claim reads ``…_fair`` (``fair_key, state, …``) for the rows whose key is NULL.

Written by hand and frozen like 0001.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EXECUTIONS = "geneva_drive_step_executions"
INDEXES = {
    "ix_geneva_drive_step_executions_due": ["queue", "priority", "scheduled_for"],
    "ix_geneva_drive_step_executions_due_any": ["priority", "scheduled_for"],
}


def _partial() -> bool:
    return op.get_bind().dialect.name not in ("mysql", "mariadb")


def _recreate(where: str) -> None:
    for name, columns in INDEXES.items():
        op.drop_index(name, table_name=EXECUTIONS)
        clause = sa.text(where)
        op.create_index(name, EXECUTIONS, columns, postgresql_where=clause, sqlite_where=clause)


def upgrade() -> None:
    if _partial():
        _recreate("state = 'scheduled' AND fair_key IS NULL")


def downgrade() -> None:
    if _partial():
        _recreate("state = 'scheduled'")

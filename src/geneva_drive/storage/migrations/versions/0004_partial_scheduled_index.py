"""Index only the scheduled executions by due time.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

``(state, scheduled_for)`` over every execution ever kept becomes a partial index over
``scheduled_for`` of the ``scheduled`` rows (PostgreSQL, SQLite); MySQL/MariaDB, which have no
partial indexes, keep ``(state, scheduled_for)`` under the same name. Every query that used it
asks for scheduled rows only: the idle worker's next due time and the stuck-scheduled sweep.

Why: on a backlog that arrives before SQLite has statistics (it has none until ``ANALYZE``),
its planner took ``(state, scheduled_for)`` for the claim and sorted every due row at every
claim; the partial one offers it nothing to prefer over the claim's own ordered index
(measured: 2.5 ms a claim at 8,000 due workflows, 0.03 ms after). It is also one index fewer
to write at each state change of the finished history. Written by hand and frozen like 0001.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EXECUTIONS = "geneva_drive_step_executions"
NAME = "ix_geneva_drive_step_executions_scheduled"


def _partial() -> bool:
    return op.get_bind().dialect.name not in ("mysql", "mariadb")


def upgrade() -> None:
    if not _partial():
        return  # the same (state, scheduled_for) index as before
    op.drop_index(NAME, table_name=EXECUTIONS)
    where = sa.text("state = 'scheduled'")
    op.create_index(NAME, EXECUTIONS, ["scheduled_for"], postgresql_where=where, sqlite_where=where)


def downgrade() -> None:
    if not _partial():
        return
    op.drop_index(NAME, table_name=EXECUTIONS)
    op.create_index(NAME, EXECUTIONS, ["state", "scheduled_for"])

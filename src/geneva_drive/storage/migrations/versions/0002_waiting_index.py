"""Index the waiting executions (housekeeping's waiting gauges).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

A partial index over ``waiting_since`` of the ``waiting`` rows; on MySQL/MariaDB, which have
no partial indexes, a plain one over ``(state, waiting_since)``. Written by hand and frozen
like 0001.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EXECUTIONS = "geneva_drive_step_executions"
NAME = "ix_geneva_drive_step_executions_waiting"


def upgrade() -> None:
    if op.get_bind().dialect.name in ("mysql", "mariadb"):
        op.create_index(NAME, EXECUTIONS, ["state", "waiting_since"])
    else:
        where = sa.text("state = 'waiting'")
        op.create_index(
            NAME, EXECUTIONS, ["waiting_since"], postgresql_where=where, sqlite_where=where
        )


def downgrade() -> None:
    op.drop_index(NAME, table_name=EXECUTIONS)

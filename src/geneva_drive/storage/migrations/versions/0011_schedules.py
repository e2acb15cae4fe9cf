"""Cron schedules: one row per scheduled class, and one workflow per tick.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05

- ``geneva_drive_schedules``: per workflow class with ``schedule = Schedule(...)``, its next
  and last tick, the workflow created for the last one, and whether it is paused.
- ``scheduled_tick`` on workflows — the tick a scheduled workflow was created for — with a
  unique index on ``(type, scheduled_tick)``: two workers can never both create one tick's
  workflow. Partial (``scheduled_tick IS NOT NULL``) on PostgreSQL and SQLite, so no other
  insert writes to it; a plain unique index on MySQL/MariaDB, where NULLs never collide.

Self-contained: no data migration (existing workflows have no tick). Written by hand and
frozen like 0001.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# revision identifiers, used by Alembic.
revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WORKFLOWS = "geneva_drive_workflows"
SCHEDULES = "geneva_drive_schedules"
TICK_INDEX = "ix_geneva_drive_workflows_scheduled_tick"
MYSQL_DIALECTS = ("mysql", "mariadb")
# As in 0001 (and models): ids, naive-UTC datetimes with microseconds.
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_DATETIME = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), *MYSQL_DIALECTS)
TABLE_OPTIONS: dict[str, Any] = {
    f"{prefix}_{option}": value
    for prefix in MYSQL_DIALECTS
    for option, value in (("charset", "utf8mb4"), ("collate", "utf8mb4_bin"))
}


def _mysql() -> bool:
    return op.get_bind().dialect.name in MYSQL_DIALECTS


def upgrade() -> None:
    if _mysql():
        # Before the generated unique-key column, where create_all() puts it too (it adds
        # that column after creating the table), so both paths build the same table.
        op.execute(
            f"ALTER TABLE {WORKFLOWS} "
            "ADD COLUMN scheduled_tick DATETIME(6) NULL AFTER trace_context"
        )
        op.create_index(TICK_INDEX, WORKFLOWS, ["type", "scheduled_tick"], unique=True)
    else:
        op.add_column(WORKFLOWS, sa.Column("scheduled_tick", _DATETIME, nullable=True))
        where = sa.text("scheduled_tick IS NOT NULL")
        op.create_index(
            TICK_INDEX,
            WORKFLOWS,
            ["type", "scheduled_tick"],
            unique=True,
            postgresql_where=where,
            sqlite_where=where,
        )
    op.create_table(
        SCHEDULES,
        sa.Column("workflow_type", sa.String(255), nullable=False),
        sa.Column("cron", sa.String(255), nullable=False),
        sa.Column("timezone", sa.String(255), nullable=False),
        sa.Column("next_tick", _DATETIME, nullable=True),
        sa.Column("last_tick", _DATETIME, nullable=True),
        sa.Column("last_workflow_id", Id, nullable=True),
        sa.Column("paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("updated_at", _DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("workflow_type", name=op.f("pk_geneva_drive_schedules")),
        **TABLE_OPTIONS,
    )


def downgrade() -> None:
    op.drop_table(SCHEDULES)
    op.drop_index(TICK_INDEX, table_name=WORKFLOWS)
    op.drop_column(WORKFLOWS, "scheduled_tick")

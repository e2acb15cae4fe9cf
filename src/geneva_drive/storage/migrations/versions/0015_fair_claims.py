"""Fair claims: a workflow's fairness key, its executions' copy, and the keys' last service.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05

- ``fair_key`` on workflows and executions: the class's ``fairness_key`` of the workflow,
  computed once by ``create()``; NULL for every class without one.
- ``ix_geneva_drive_step_executions_fair``: a key's scheduled rows in claim order. Partial
  (scheduled rows that have a key) on PostgreSQL and SQLite, so no other execution writes to
  it; on MySQL/MariaDB, which have no partial indexes, over ``(fair_key, state, …)``.
- ``geneva_drive_fair_keys``: when each key was last served by a fair claim.

Written by hand and frozen like 0001.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# revision identifiers, used by Alembic.
revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WORKFLOWS = "geneva_drive_workflows"
EXECUTIONS = "geneva_drive_step_executions"
FAIR_KEYS = "geneva_drive_fair_keys"
INDEX = "ix_geneva_drive_step_executions_fair"
MYSQL_DIALECTS = ("mysql", "mariadb")
_DATETIME = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), *MYSQL_DIALECTS)
TABLE_OPTIONS: dict[str, Any] = {
    f"{prefix}_{option}": value
    for prefix in MYSQL_DIALECTS
    for option, value in (("charset", "utf8mb4"), ("collate", "utf8mb4_bin"))
}


def upgrade() -> None:
    if op.get_bind().dialect.name in MYSQL_DIALECTS:
        # Before the generated unique-key columns, where create_all() puts them too.
        op.execute(f"ALTER TABLE {WORKFLOWS} ADD COLUMN fair_key VARCHAR(255) NULL AFTER input")
        op.execute(f"ALTER TABLE {EXECUTIONS} ADD COLUMN fair_key VARCHAR(255) NULL AFTER result")
        op.create_index(INDEX, EXECUTIONS, ["fair_key", "state", "priority", "scheduled_for"])
    else:
        op.add_column(WORKFLOWS, sa.Column("fair_key", sa.String(255), nullable=True))
        op.add_column(EXECUTIONS, sa.Column("fair_key", sa.String(255), nullable=True))
        where = sa.text("state = 'scheduled' AND fair_key IS NOT NULL")
        op.create_index(
            INDEX,
            EXECUTIONS,
            ["fair_key", "priority", "scheduled_for"],
            postgresql_where=where,
            sqlite_where=where,
        )
    op.create_table(
        FAIR_KEYS,
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("served_at", _DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f(f"pk_{FAIR_KEYS}")),
        **TABLE_OPTIONS,
    )
    op.create_index(f"ix_{FAIR_KEYS}_served", FAIR_KEYS, ["served_at", "key"])


def downgrade() -> None:
    op.drop_table(FAIR_KEYS)
    op.drop_index(INDEX, table_name=EXECUTIONS)
    op.drop_column(EXECUTIONS, "fair_key")
    op.drop_column(WORKFLOWS, "fair_key")

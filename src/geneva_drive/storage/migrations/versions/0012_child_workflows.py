"""Child workflows: a child's parent and key, a parent's fan-in counters.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05

- ``parent_id`` and ``child_key`` on workflows: the parent that started a child and the key it
  gave it, unique per parent (``ix_geneva_drive_workflows_child``) so that a step retried
  after starting its children finds them instead of starting them twice. Partial (children
  only) on PostgreSQL and SQLite; on MySQL/MariaDB over every row, where NULLs never collide.
- ``children_started``, ``children_ended``, ``children_failed`` on workflows: a parent's
  counters, bumped by one row update per child started or ended, so the fan-in costs the same
  for 10 children or 10,000.

Written by hand and frozen like 0001.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WORKFLOWS = "geneva_drive_workflows"
MYSQL_DIALECTS = ("mysql", "mariadb")
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
INDEX = "ix_geneva_drive_workflows_child"
COUNTERS = ("children_started", "children_ended", "children_failed")


def upgrade() -> None:
    if op.get_bind().dialect.name in MYSQL_DIALECTS:
        # Before the generated unique-key column, where create_all() puts them too (it adds
        # that column after creating the table), so both paths build the same table.
        op.execute(
            f"ALTER TABLE {WORKFLOWS} "
            "ADD COLUMN parent_id BIGINT NULL AFTER scheduled_tick, "
            "ADD COLUMN child_key VARCHAR(255) NULL AFTER parent_id, "
            "ADD COLUMN children_started INTEGER NOT NULL DEFAULT 0 AFTER child_key, "
            "ADD COLUMN children_ended INTEGER NOT NULL DEFAULT 0 AFTER children_started, "
            "ADD COLUMN children_failed INTEGER NOT NULL DEFAULT 0 AFTER children_ended"
        )
        op.create_index(INDEX, WORKFLOWS, ["parent_id", "child_key"], unique=True)
        return
    op.add_column(WORKFLOWS, sa.Column("parent_id", Id, nullable=True))
    op.add_column(WORKFLOWS, sa.Column("child_key", sa.String(255), nullable=True))
    for counter in COUNTERS:
        op.add_column(
            WORKFLOWS,
            sa.Column(counter, sa.Integer(), nullable=False, server_default=sa.text("0")),
        )
    where = sa.text("parent_id IS NOT NULL")
    op.create_index(
        INDEX,
        WORKFLOWS,
        ["parent_id", "child_key"],
        unique=True,
        postgresql_where=where,
        sqlite_where=where,
    )


def downgrade() -> None:
    op.drop_index(INDEX, table_name=WORKFLOWS)
    # Plain ALTER TABLE … DROP COLUMN, SQLite's too (3.35+), once no index names the columns.
    for column in reversed(("parent_id", "child_key", *COUNTERS)):
        op.drop_column(WORKFLOWS, column)

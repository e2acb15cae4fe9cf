"""A workflow's input and a step's result.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05

- ``input`` on workflows: the JSON value passed as ``create(input=...)``, read as
  ``self.input``.
- ``result`` on executions: the JSON value a step's body returned, on its successful
  execution (``self.result_of("step")``).

Both nullable JSON, no index (they are read by the row's id, never searched). On MySQL/MariaDB
they go at the end of the declared columns (after 0012's ``children_failed`` and 0005's
``wait_deadline``), before the generated unique-key columns, where ``create_all()`` puts them
too (it adds those columns after creating the table), so both paths build the same table.
Written by hand and frozen like 0001.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WORKFLOWS = "geneva_drive_workflows"
EXECUTIONS = "geneva_drive_step_executions"
MYSQL_DIALECTS = ("mysql", "mariadb")
# As in 0001: JSONB on PostgreSQL; MariaDB's JSON is LONGTEXT with a json_valid() check.
Json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
# (table, column, the column it follows on MySQL/MariaDB)
COLUMNS = ((WORKFLOWS, "input", "children_failed"), (EXECUTIONS, "result", "wait_deadline"))


def upgrade() -> None:
    mysql = op.get_bind().dialect.name in MYSQL_DIALECTS
    for table, column, after in COLUMNS:
        if mysql:
            op.execute(f"ALTER TABLE {table} ADD COLUMN {column} JSON NULL AFTER {after}")
        else:
            op.add_column(table, sa.Column(column, Json, nullable=True))


def downgrade() -> None:
    for table, column, _ in COLUMNS:
        op.drop_column(table, column)

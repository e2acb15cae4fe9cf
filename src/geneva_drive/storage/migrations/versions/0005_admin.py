"""The admin API: what a waiting row waits for, operator actions, the admin indexes.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02

- ``awaiting_signal`` and ``wait_deadline`` on executions: the name of the signal a parked row
  waits for and when its timeout fires (set when it parks). Rows parked before this revision
  keep NULL there; they are still found by state, only not by signal name.
- ``geneva_drive_operator_actions``: who paused, resumed, skipped, … a workflow, and why.
- Indexes for the admin list and stats, each a range that follows the work asked about, not
  the history: workflows by ``(created_at, id)``, ``(state, created_at, id)`` and — replacing
  ``(type)``, which it still serves as its leading column — ``(type, created_at, id)``; the
  waiting rows by ``(awaiting_signal, wait_deadline)`` and the failed ones by
  ``(error_class_name, workflow_id)``, both partial (on MySQL/MariaDB led by ``state``).

Written by hand and frozen like 0001.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WORKFLOWS = "geneva_drive_workflows"
EXECUTIONS = "geneva_drive_step_executions"
ACTIONS = "geneva_drive_operator_actions"
MYSQL_DIALECTS = ("mysql", "mariadb")
# As in 0001 (and models): ids, JSON, long text, naive-UTC datetimes with microseconds.
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
LongText = sa.Text().with_variant(mysql.LONGTEXT(), *MYSQL_DIALECTS)
_DATETIME = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), *MYSQL_DIALECTS)
TABLE_OPTIONS: dict[str, Any] = {
    f"{prefix}_{option}": value
    for prefix in MYSQL_DIALECTS
    for option, value in (("charset", "utf8mb4"), ("collate", "utf8mb4_bin"))
}
TYPE_INDEX = "ix_geneva_drive_workflows_type"
WORKFLOW_INDEXES = (
    ("ix_geneva_drive_workflows_created", ["created_at", "id"]),
    ("ix_geneva_drive_workflows_state_created", ["state", "created_at", "id"]),
)
PARTIAL_INDEXES = (
    ("ix_geneva_drive_step_executions_awaiting", ["awaiting_signal", "wait_deadline"], "waiting"),
    ("ix_geneva_drive_step_executions_failed", ["error_class_name", "workflow_id"], "failed"),
)


def _mysql() -> bool:
    return op.get_bind().dialect.name in MYSQL_DIALECTS


def _partial_index(name: str, columns: list[str], state: str) -> None:
    if _mysql():
        op.create_index(name, EXECUTIONS, ["state", *columns])
    else:
        where = sa.text(f"state = '{state}'")
        op.create_index(name, EXECUTIONS, columns, postgresql_where=where, sqlite_where=where)


def upgrade() -> None:
    if _mysql():
        # Before the generated unique-key column, where create_all() puts them too (it adds
        # that column after creating the table), so both paths build the same table.
        op.execute(
            f"ALTER TABLE {EXECUTIONS} "
            "ADD COLUMN awaiting_signal VARCHAR(255) NULL AFTER updated_at, "
            "ADD COLUMN wait_deadline DATETIME(6) NULL AFTER awaiting_signal"
        )
    else:
        op.add_column(EXECUTIONS, sa.Column("awaiting_signal", sa.String(255), nullable=True))
        op.add_column(EXECUTIONS, sa.Column("wait_deadline", _DATETIME, nullable=True))
    for name, columns, state in PARTIAL_INDEXES:
        _partial_index(name, columns, state)
    op.drop_index(TYPE_INDEX, table_name=WORKFLOWS)
    op.create_index(TYPE_INDEX, WORKFLOWS, ["type", "created_at", "id"])
    for name, columns in WORKFLOW_INDEXES:
        op.create_index(name, WORKFLOWS, columns)
    op.create_table(
        ACTIONS,
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("workflow_id", Id, nullable=False),
        sa.Column("execution_id", Id, nullable=True),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("reason", LongText, nullable=True),
        sa.Column("at", _DATETIME, nullable=False),
        sa.Column("detail", Json, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_geneva_drive_operator_actions")),
        sa.ForeignKeyConstraint(
            ["workflow_id"],
            [f"{WORKFLOWS}.id"],
            name=op.f("fk_geneva_drive_operator_actions_workflow_id_geneva_drive_workflows"),
            ondelete="CASCADE",
        ),
        **TABLE_OPTIONS,
    )
    op.create_index("ix_geneva_drive_operator_actions_workflow_at", ACTIONS, ["workflow_id", "at"])


def downgrade() -> None:
    op.drop_table(ACTIONS)
    for name, _ in WORKFLOW_INDEXES:
        op.drop_index(name, table_name=WORKFLOWS)
    op.drop_index(TYPE_INDEX, table_name=WORKFLOWS)
    op.create_index(TYPE_INDEX, WORKFLOWS, ["type"])
    for name, _, _ in PARTIAL_INDEXES:
        op.drop_index(name, table_name=EXECUTIONS)
    # Plain ALTER TABLE … DROP COLUMN, SQLite's too (3.35+), once no index names the columns.
    op.drop_column(EXECUTIONS, "wait_deadline")
    op.drop_column(EXECUTIONS, "awaiting_signal")

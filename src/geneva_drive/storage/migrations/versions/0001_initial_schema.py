"""Initial schema: workflows, step executions, signals.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Written by hand and frozen: it spells out the schema instead of importing the models, so that
later changes to the models can only reach existing databases through new migrations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WORKFLOWS = "geneva_drive_workflows"
EXECUTIONS = "geneva_drive_step_executions"
SIGNALS = "geneva_drive_signals"

# As models.Id: SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
MYSQL_DIALECTS = ("mysql", "mariadb")
# As models.Json (on MariaDB, JSON is LONGTEXT with a json_valid() check).
Json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
# As models.LongText: MySQL's TEXT stops at 64 KiB.
LongText = sa.Text().with_variant(mysql.LONGTEXT(), *MYSQL_DIALECTS)
# models.UTCDateTime stores naive UTC in a plain DATETIME / TIMESTAMP WITHOUT TIME ZONE; on
# MySQL/MariaDB with microseconds (DATETIME alone drops them).
_DATETIME = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), *MYSQL_DIALECTS)
# As models.MYSQL_TABLE_OPTIONS (ignored by other dialects).
TABLE_OPTIONS: dict[str, Any] = {
    f"{prefix}_{option}": value
    for prefix in MYSQL_DIALECTS
    for option, value in (("charset", "utf8mb4"), ("collate", "utf8mb4_bin"))
}


def DateTime() -> sa.types.TypeEngine[Any]:  # stands in for sa.DateTime
    return _DATETIME


def _mysql() -> bool:
    return op.get_bind().dialect.name in MYSQL_DIALECTS


def _where(condition: str) -> dict[str, Any]:
    """A partial index's condition, for every dialect that supports one."""
    return {"postgresql_where": sa.text(condition), "sqlite_where": sa.text(condition)}


def _generated_key(name: str, type_: sa.types.TypeEngine[Any], expression: str) -> list[Any]:
    """MySQL/MariaDB only: a STORED generated column standing in for a partial unique index.

    It is NULL except on the rows the uniqueness rule covers; a unique index over it then
    enforces the rule (NULLs never collide). Elsewhere: nothing (partial indexes do the job).
    """
    if not _mysql():
        return []
    return [sa.Column(name, type_, sa.Computed(expression, persisted=True), nullable=True)]


def _partial_index(name: str, table: str, columns: list[str], state: str) -> None:
    """A non-unique index over the rows in ``state``; on MySQL/MariaDB over (state, *columns)."""
    if _mysql():
        op.create_index(name, table, ["state", *columns])
    else:
        op.create_index(name, table, columns, **_where(f"state = '{state}'"))


def _timestamps() -> list[sa.Column[Any]]:
    return [
        sa.Column("created_at", DateTime(), nullable=False),
        sa.Column("updated_at", DateTime(), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        WORKFLOWS,
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("type", sa.String(255), nullable=False),
        sa.Column("hero_type", sa.String(255), nullable=True),
        sa.Column("hero_id", sa.String(255), nullable=True),
        sa.Column("state", sa.String(32), server_default="ready", nullable=False),
        sa.Column("current_step_name", sa.String(255), nullable=True),
        sa.Column("next_step_name", sa.String(255), nullable=True),
        sa.Column("allow_multiple", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("started_at", DateTime(), nullable=True),
        sa.Column("transitioned_at", DateTime(), nullable=True),
        sa.Column("metadata", Json, nullable=True),
        *_timestamps(),
        # 3 × 255 + 2 separators; 767 utf8mb4 characters = 3068 bytes, within InnoDB's 3072.
        *_generated_key(
            "ongoing_unique_key",
            sa.String(767),
            "CASE WHEN state NOT IN ('finished', 'canceled') AND allow_multiple = 0 "
            "THEN CONCAT(type, '-', hero_type, '-', hero_id) END",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_geneva_drive_workflows")),
        **TABLE_OPTIONS,
    )
    op.create_index("ix_geneva_drive_workflows_type", WORKFLOWS, ["type"])
    op.create_index(
        "ix_geneva_drive_workflows_state_transitioned", WORKFLOWS, ["state", "transitioned_at"]
    )
    op.create_index("ix_geneva_drive_workflows_hero", WORKFLOWS, ["hero_type", "hero_id"])
    # One ongoing workflow per (class, hero). MySQL/MariaDB have no partial indexes: there it
    # is a unique index over the generated column, which is NULL unless the row is ongoing.
    if _mysql():
        op.create_index(
            "ix_geneva_drive_workflows_unique_ongoing",
            WORKFLOWS,
            ["ongoing_unique_key"],
            unique=True,
        )
    else:
        op.create_index(
            "ix_geneva_drive_workflows_unique_ongoing",
            WORKFLOWS,
            ["type", "hero_type", "hero_id"],
            unique=True,
            **_where("state NOT IN ('finished', 'canceled') AND allow_multiple = false"),
        )

    op.create_table(
        EXECUTIONS,
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("workflow_id", Id, nullable=False),
        sa.Column("step_name", sa.String(255), nullable=False),
        sa.Column("state", sa.String(32), server_default="scheduled", nullable=False),
        sa.Column("outcome", sa.String(32), nullable=True),
        sa.Column("scheduled_for", DateTime(), nullable=False),
        sa.Column("started_at", DateTime(), nullable=True),
        sa.Column("completed_at", DateTime(), nullable=True),
        sa.Column("failed_at", DateTime(), nullable=True),
        sa.Column("canceled_at", DateTime(), nullable=True),
        sa.Column("skipped_at", DateTime(), nullable=True),
        sa.Column("finished_at", DateTime(), nullable=True),
        sa.Column("error_class_name", sa.String(255), nullable=True),
        sa.Column("error_message", LongText, nullable=True),
        sa.Column("error_backtrace", LongText, nullable=True),
        sa.Column("job_id", sa.String(255), nullable=True),
        sa.Column("metadata", Json, nullable=True),
        sa.Column("cursor", Json, nullable=True),
        sa.Column("continues_from_id", Id, nullable=True),
        sa.Column("signal_id", Id, nullable=True),
        sa.Column("waiting_since", DateTime(), nullable=True),
        sa.Column("queue", sa.String(255), server_default="default", nullable=False),
        sa.Column("priority", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("lease_owner", sa.String(255), nullable=True),
        sa.Column("lease_expires_at", DateTime(), nullable=True),
        *_timestamps(),
        *_generated_key(
            "active_unique_key",
            sa.BigInteger(),
            "CASE WHEN state IN ('scheduled', 'in_progress') THEN workflow_id END",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_geneva_drive_step_executions")),
        # 66 characters: PostgreSQL (63) and MySQL (64) get SQLAlchemy's truncated-with-hash
        # form, exactly as the models' naming convention produces it.
        sa.ForeignKeyConstraint(
            ["workflow_id"],
            [f"{WORKFLOWS}.id"],
            name=op.f("fk_geneva_drive_step_executions_workflow_id_geneva_drive_workflows"),
            ondelete="CASCADE",
        ),
        **TABLE_OPTIONS,
    )
    for name, columns in [
        ("ix_geneva_drive_step_executions_workflow_id", ["workflow_id"]),
        ("ix_geneva_drive_step_executions_state", ["state"]),
        ("ix_geneva_drive_step_executions_scheduled_for", ["scheduled_for"]),
        ("ix_geneva_drive_step_executions_finished_at", ["finished_at"]),
        ("ix_geneva_drive_step_executions_scheduled", ["state", "scheduled_for"]),
        ("ix_geneva_drive_step_executions_workflow_created", ["workflow_id", "created_at"]),
        ("ix_geneva_drive_step_executions_workflow_state", ["workflow_id", "state"]),
        ("ix_geneva_drive_step_executions_continues_from_id", ["continues_from_id"]),
        ("ix_geneva_drive_step_executions_signal_id", ["signal_id"]),
    ]:
        op.create_index(name, EXECUTIONS, columns)
    # At most one scheduled/in-progress execution per workflow. MySQL/MariaDB: unique index over
    # the generated column (workflow_id when active, else NULL).
    if _mysql():
        op.create_index(
            "ix_geneva_drive_step_executions_one_active",
            EXECUTIONS,
            ["active_unique_key"],
            unique=True,
        )
    else:
        op.create_index(
            "ix_geneva_drive_step_executions_one_active",
            EXECUTIONS,
            ["workflow_id"],
            unique=True,
            **_where("state IN ('scheduled', 'in_progress')"),
        )
    _partial_index(
        "ix_geneva_drive_step_executions_in_progress_started_at",
        EXECUTIONS,
        ["started_at"],
        state="in_progress",
    )
    _partial_index(
        "ix_geneva_drive_step_executions_due",
        EXECUTIONS,
        ["queue", "priority", "scheduled_for"],
        state="scheduled",
    )
    _partial_index(
        "ix_geneva_drive_step_executions_due_any",
        EXECUTIONS,
        ["priority", "scheduled_for"],
        state="scheduled",
    )
    _partial_index(
        "ix_geneva_drive_step_executions_lease",
        EXECUTIONS,
        ["lease_expires_at"],
        state="in_progress",
    )

    op.create_table(
        SIGNALS,
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("workflow_id", Id, nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("state", sa.String(32), server_default="pending", nullable=False),
        sa.Column("payload", Json, nullable=True),
        sa.Column("claimed_at", DateTime(), nullable=True),
        sa.Column("consumed_at", DateTime(), nullable=True),
        sa.Column("claimed", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("consumed", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        *_timestamps(),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_geneva_drive_signals")),
        sa.ForeignKeyConstraint(
            ["workflow_id"],
            [f"{WORKFLOWS}.id"],
            name=op.f("fk_geneva_drive_signals_workflow_id_geneva_drive_workflows"),
            ondelete="CASCADE",
        ),
        **TABLE_OPTIONS,
    )
    op.create_index(
        "ix_geneva_drive_signals_dedup",
        SIGNALS,
        ["workflow_id", "name", "idempotency_key"],
        unique=True,
    )
    op.create_index("ix_geneva_drive_signals_workflow_state", SIGNALS, ["workflow_id", "state"])


def downgrade() -> None:
    # Dropping a table drops its indexes; children first, for the foreign keys.
    op.drop_table(SIGNALS)
    op.drop_table(EXECUTIONS)
    op.drop_table(WORKFLOWS)

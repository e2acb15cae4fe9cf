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
from sqlalchemy.dialects import postgresql

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
# As models.Json.
Json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
# models.UTCDateTime stores naive UTC in a plain DATETIME / TIMESTAMP WITHOUT TIME ZONE.
DateTime = sa.DateTime


def _where(condition: str) -> dict[str, Any]:
    """A partial index's condition, for every dialect that supports one."""
    return {"postgresql_where": sa.text(condition), "sqlite_where": sa.text(condition)}


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
        sa.PrimaryKeyConstraint("id", name=op.f("pk_geneva_drive_workflows")),
    )
    op.create_index("ix_geneva_drive_workflows_type", WORKFLOWS, ["type"])
    op.create_index("ix_geneva_drive_workflows_state", WORKFLOWS, ["state"])
    op.create_index("ix_geneva_drive_workflows_hero", WORKFLOWS, ["hero_type", "hero_id"])
    # One ongoing workflow per (class, hero). MySQL/MariaDB have no partial indexes: there this
    # will become a unique index over a generated column that is NULL unless the row is ongoing
    # (added together with MySQL support; not implemented yet).
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
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("error_backtrace", sa.Text(), nullable=True),
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
        sa.PrimaryKeyConstraint("id", name=op.f("pk_geneva_drive_step_executions")),
        # 66 characters: PostgreSQL (63) and MySQL (64) get SQLAlchemy's truncated-with-hash
        # form, exactly as the models' naming convention produces it.
        sa.ForeignKeyConstraint(
            ["workflow_id"],
            [f"{WORKFLOWS}.id"],
            name=op.f("fk_geneva_drive_step_executions_workflow_id_geneva_drive_workflows"),
            ondelete="CASCADE",
        ),
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
    # a generated column (workflow_id when active, else NULL) — added with MySQL support.
    op.create_index(
        "ix_geneva_drive_step_executions_one_active",
        EXECUTIONS,
        ["workflow_id"],
        unique=True,
        **_where("state IN ('scheduled', 'in_progress')"),
    )
    # Non-unique partial indexes: on MySQL/MariaDB they will simply be full indexes.
    op.create_index(
        "ix_geneva_drive_step_executions_in_progress_started_at",
        EXECUTIONS,
        ["started_at"],
        **_where("state = 'in_progress'"),
    )
    op.create_index(
        "ix_geneva_drive_step_executions_due",
        EXECUTIONS,
        ["queue", "priority", "scheduled_for"],
        **_where("state = 'scheduled'"),
    )
    op.create_index(
        "ix_geneva_drive_step_executions_lease",
        EXECUTIONS,
        ["lease_expires_at"],
        **_where("state = 'in_progress'"),
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

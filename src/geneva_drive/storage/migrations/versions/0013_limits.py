"""Concurrency and rate limits: the key locks, the slots, the waiters, the start log.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05

Four small tables of their own (``engine.limits``), none of them touched by a workflow that
declares no limit: the executions table is unchanged, so the claim of an unlimited step reads
and writes exactly what it did. Written by hand and frozen like 0001.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# revision identifiers, used by Alembic.
revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MYSQL_DIALECTS = ("mysql", "mariadb")
# As in 0001 (and models): ids and naive-UTC datetimes with microseconds.
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_DATETIME = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), *MYSQL_DIALECTS)
TABLE_OPTIONS: dict[str, Any] = {
    f"{prefix}_{option}": value
    for prefix in MYSQL_DIALECTS
    for option, value in (("charset", "utf8mb4"), ("collate", "utf8mb4_bin"))
}
KEYS = "geneva_drive_limit_keys"
SLOTS = "geneva_drive_limit_slots"
WAITERS = "geneva_drive_limit_waiters"
STARTS = "geneva_drive_rate_starts"


def upgrade() -> None:
    op.create_table(
        KEYS,
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("created_at", _DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("kind", "key", name=op.f(f"pk_{KEYS}")),
        **TABLE_OPTIONS,
    )
    op.create_table(
        SLOTS,
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("slot", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("execution_id", Id, nullable=True),
        sa.Column("workflow_id", Id, nullable=True),
        sa.Column("taken_at", _DATETIME, nullable=True),
        sa.PrimaryKeyConstraint("key", "slot", name=op.f(f"pk_{SLOTS}")),
        **TABLE_OPTIONS,
    )
    op.create_index(f"ix_{SLOTS}_execution", SLOTS, ["execution_id"], unique=True)
    op.create_table(
        WAITERS,
        sa.Column("execution_id", Id, autoincrement=False, nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("since", _DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("execution_id", name=op.f(f"pk_{WAITERS}")),
        **TABLE_OPTIONS,
    )
    op.create_index(f"ix_{WAITERS}_key", WAITERS, ["key", "priority", "since", "execution_id"])
    op.create_table(
        STARTS,
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("started_at", _DATETIME, nullable=False),
        sa.Column("execution_id", Id, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{STARTS}")),
        **TABLE_OPTIONS,
    )
    op.create_index(f"ix_{STARTS}_key", STARTS, ["key", "started_at"])


def downgrade() -> None:
    for table in (STARTS, WAITERS, SLOTS, KEYS):
        op.drop_table(table)

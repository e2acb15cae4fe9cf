"""Drop the index of in-progress executions by start time.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04

Its one reader is housekeeping's stuck in-progress sweep (in-progress rows started before a
cut-off, oldest first). The lease index covers the same rows — every in-progress execution,
and nothing else — and there are only as many of those as steps running, so the sweep reads
them all there and sorts them. On MySQL/MariaDB the two are full indexes led by ``state``, and
``state = 'in_progress'`` is a prefix of the lease index just the same.

Why: each index on the executions table is paid for by every statement that writes an
execution, written to or not: PostgreSQL opens it and prepares its predicate, and a step
writes an execution three times (inserted, started, completed) without a HOT update. This one
was also written at every start. Counted by ``benchmarks/server_instructions.py``: 553,600 →
532,500 instructions of the PostgreSQL backend per no-op step (−3.8 %). Written by hand and
frozen like 0001.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EXECUTIONS = "geneva_drive_step_executions"
NAME = "ix_geneva_drive_step_executions_in_progress_started_at"


def upgrade() -> None:
    op.drop_index(NAME, table_name=EXECUTIONS)


def downgrade() -> None:
    if op.get_bind().dialect.name in ("mysql", "mariadb"):
        op.create_index(NAME, EXECUTIONS, ["state", "started_at"])
        return
    where = sa.text("state = 'in_progress'")
    op.create_index(NAME, EXECUTIONS, ["started_at"], postgresql_where=where, sqlite_where=where)

"""Workflows and signals keep the trace context they were created or sent in.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05

A nullable ``trace_context`` column (a W3C traceparent) on ``geneva_drive_workflows`` and
``geneva_drive_signals``: with OpenTelemetry set up, ``create()`` and ``signal()`` store the
span active when they run, and each step's span continues that trace (issue 38). Nullable
and without a default, so adding it rewrites no rows on any of the three databases. Written
by hand and frozen like 0001.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("geneva_drive_workflows", "geneva_drive_signals")


def upgrade() -> None:
    bind = op.get_bind()
    for table in TABLES:
        if bind.dialect.name in ("mysql", "mariadb"):
            _add_before_generated_keys(bind, table)
        else:
            op.add_column(table, sa.Column("trace_context", sa.String(128), nullable=True))


def _add_before_generated_keys(bind: sa.Connection, table: str) -> None:
    """MariaDB: the models' columns come before the generated unique keys (``*_unique_key``,
    added by DDL after the table), so that a migrated table reads as ``create_all`` builds it."""
    names = [c["name"] for c in sa.inspect(bind).get_columns(table)]
    ours = [n for n in names if not n.endswith("_unique_key")]
    op.execute(f"ALTER TABLE {table} ADD COLUMN trace_context VARCHAR(128) NULL AFTER {ours[-1]}")


def downgrade() -> None:
    for table in TABLES:
        op.drop_column(table, "trace_context")

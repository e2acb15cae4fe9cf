"""A step execution's attempt: which run of its step in its workflow it is, stored when it is
scheduled.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05

- ``attempt`` on executions: 1 for a step's first run in its workflow, one more for each
  later run (reattempts, a resumable step's next run, a step come back to); 0 on a signal
  timeout's timer, which is not a run. The span of a step reads it from the row it already
  holds, with no statement in the step's transaction (``engine.tracing``). NULL on the rows
  written before this migration, and on a later run of a step that has such a row: those are
  counted when needed, as before (``queries.attempt_number``).

Written by hand and frozen like 0001.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EXECUTIONS = "geneva_drive_step_executions"
MYSQL_DIALECTS = ("mysql", "mariadb")


def upgrade() -> None:
    if op.get_bind().dialect.name in MYSQL_DIALECTS:
        # Before the generated unique-key columns, where create_all() puts them too.
        op.execute(f"ALTER TABLE {EXECUTIONS} ADD COLUMN attempt INTEGER NULL AFTER fair_key")
    else:
        op.add_column(EXECUTIONS, sa.Column("attempt", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column(EXECUTIONS, "attempt")

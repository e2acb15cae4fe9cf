"""Drop three execution indexes that other indexes already serve.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

Every execution row is written three to four times in its life (inserted, started,
completed), and all but one of those writes change ``state``, so PostgreSQL cannot make them
HOT updates: each one adds an entry to every index on the table. Three of the gem's indexes
are the leading column of a wider index that stays, so no query loses its index:

- ``(workflow_id)``: ``(workflow_id, created_at)`` and ``(workflow_id, state)`` lead with it;
- ``(state)``: ``(state, scheduled_for)`` leads with it;
- ``(scheduled_for)``: every query on it also filters on ``state``, and uses
  ``(state, scheduled_for)`` or the partial "due" indexes.

Measured (benchmarks/HISTORY.md): PostgreSQL's CPU per no-op step falls by about a quarter.
Written by hand and frozen like 0001.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EXECUTIONS = "geneva_drive_step_executions"
DROPPED = (
    ("ix_geneva_drive_step_executions_workflow_id", ["workflow_id"]),
    ("ix_geneva_drive_step_executions_state", ["state"]),
    ("ix_geneva_drive_step_executions_scheduled_for", ["scheduled_for"]),
)


def upgrade() -> None:
    for name, _ in DROPPED:
        op.drop_index(name, table_name=EXECUTIONS)


def downgrade() -> None:
    for name, columns in DROPPED:
        op.create_index(name, EXECUTIONS, columns)

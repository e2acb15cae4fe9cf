"""The hero index is led by the hero id.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05

The hero-id search — the dashboard's one search box, ``list --where hero_id=``, the admin
API's ``hero_id`` filter — sends the id alone. Over ``(hero_type, hero_id)`` that is no prefix,
so PostgreSQL before 18, SQLite and MariaDB read the whole workflows table for it: at
1,000,000 workflows 168 ms p50 on stock PostgreSQL 15, growing with the history (issue 42).
Over ``(hero_id, hero_type)`` the id alone is the prefix, and the lookups of one hero's
workflows, which give both, still read it whole. Reordered rather than a second index, so
that no insert pays for the search. Written by hand and frozen like 0001.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WORKFLOWS = "geneva_drive_workflows"
NAME = "ix_geneva_drive_workflows_hero"


def upgrade() -> None:
    op.drop_index(NAME, table_name=WORKFLOWS)
    op.create_index(NAME, WORKFLOWS, ["hero_id", "hero_type"])


def downgrade() -> None:
    op.drop_index(NAME, table_name=WORKFLOWS)
    op.create_index(NAME, WORKFLOWS, ["hero_type", "hero_id"])

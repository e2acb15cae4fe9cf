"""MySQL/MariaDB: the one-active unique key in descending order.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

On MySQL/MariaDB the rule "at most one scheduled or in-progress execution per workflow" is a
unique index over a generated column (``active_unique_key``: the workflow id while the row is
active, NULL after). It becomes a descending index; PostgreSQL and SQLite, whose rule is a
partial unique index, are not touched.

Why: InnoDB's duplicate check on an insert S-locks the index record after the new key's own,
and NULLs sort first. In ascending order that record belongs to the next workflow, and the NULL
a completed row gets is inserted just before the smallest key, so three neighbouring workflows
completing a step and inserting the next one at once could wait for each other in a ring — a
deadlock InnoDB broke by rolling one back, and the executor then ran that step again (seen
about once in 40 runs of the multi-process worker test under load). In descending order each
insert waits only for a smaller key and the NULLs are at the far end, so no ring can close;
``tests/test_mariadb.py`` drives the three transactions into the old ring. MariaDB before
10.8 parses ``DESC`` and ignores it, as before this revision. Written by hand and frozen like
0001.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EXECUTIONS = "geneva_drive_step_executions"
INDEX = "ix_geneva_drive_step_executions_one_active"


def _reindex(order: str) -> None:
    if op.get_bind().dialect.name not in ("mysql", "mariadb"):
        return
    # One statement: the rule is never without its index, even for a moment.
    op.execute(
        f"ALTER TABLE {EXECUTIONS} DROP INDEX {INDEX}, "
        f"ADD UNIQUE INDEX {INDEX} (active_unique_key{order})"
    )


def upgrade() -> None:
    _reindex(" DESC")


def downgrade() -> None:
    _reindex("")

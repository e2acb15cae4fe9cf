"""The hero-id search — the dashboard's search box, ``list --where hero_id=``, the admin API —
reads an index, never the whole workflows table, on every database (issue 42).

It sends the hero id alone: the index led by the hero type could not serve it, and at a
million workflows each search read them all (168 ms, growing with the history). The hero
index is led by the hero id (migration 0009), so the id alone is its prefix and the
``(hero_type, hero_id)`` lookups still use it whole.

The table holds 20,000 finished workflows of 1,000 hero types — so that PostgreSQL 18's skip
scan over the old index's leading hero type cannot pass for it either —, analysed on
PostgreSQL and MariaDB so the planner knows how few rows one hero id has.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from geneva_drive import admin
from geneva_drive.admin import WorkflowFilter
from tests.admin.test_admin_plans import _postgres_plan, _sqlite_plan, _statements

WORKFLOWS = 20_000
TABLE = "geneva_drive_workflows"
HERO_INDEX = "ix_geneva_drive_workflows_hero"


def _seed(gd: Any, db_backend: str) -> None:
    from sqlalchemy import insert

    from geneva_drive.definition.workflow import Workflow

    start = datetime(2026, 11, 1, tzinfo=UTC)
    rows = [
        {
            "type": "HeroSearched",
            "state": "finished",
            "hero_type": f"Hero{i % 1000}",
            "hero_id": str(i),
            "allow_multiple": True,
            "transitioned_at": start + timedelta(seconds=i),
            "created_at": start + timedelta(seconds=i),
            "updated_at": start + timedelta(seconds=i),
        }
        for i in range(1, WORKFLOWS + 1)
    ]
    with gd.engine.begin() as conn:
        conn.execute(insert(Workflow), rows)
    with gd.engine.begin() as conn:
        if db_backend == "postgresql":
            conn.execute(text(f"ANALYZE {TABLE}"))
        elif db_backend == "mariadb":
            conn.execute(text(f"ANALYZE TABLE {TABLE}"))


def _mariadb_plan(gd: Any, statement: str, parameters: Any) -> str:
    """MariaDB's EXPLAIN, one line per table: its access type, then the index it reads."""
    raw = gd.engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("EXPLAIN " + statement, parameters)
        columns = [c[0] for c in cursor.description]
        lines = []
        for row in cursor.fetchall():
            entry = dict(zip(columns, row, strict=True))
            lines.append(f"{entry['table']} type={entry['type']} key={entry['key']}")
        return "\n".join(lines)
    finally:
        raw.rollback()
        raw.close()


def _plans(gd: Any, db_backend: str, call: Callable[[], Any]) -> list[str]:
    explain = {"postgresql": _postgres_plan, "sqlite": _sqlite_plan, "mariadb": _mariadb_plan}
    return [explain[db_backend](gd, sql, params) for sql, params in _statements(gd, call)]


def _reads_the_hero_index(plan: str, db_backend: str) -> None:
    if db_backend == "postgresql":
        assert f"Seq Scan on {TABLE}" not in plan, plan
        assert re.search(rf"Index (Only )?Scan using {HERO_INDEX}|{HERO_INDEX}", plan), plan
    elif db_backend == "sqlite":
        assert re.search(rf"SEARCH {TABLE} USING (COVERING )?INDEX {HERO_INDEX}", plan), plan
    else:
        line = next(line for line in plan.splitlines() if line.startswith(TABLE))
        assert f"key={HERO_INDEX}" in line and "type=ALL" not in line, plan


@pytest.mark.parametrize(
    "where",
    [WorkflowFilter(hero_id="4242"), WorkflowFilter(hero_type="Hero242", hero_id="4242")],
    ids=["hero id alone", "hero type and id"],
)
def test_a_hero_search_reads_the_hero_index_for_its_page_and_its_count(
    gd, session, db_backend, where
):
    _seed(gd, db_backend)

    page = _plans(gd, db_backend, lambda: admin.find(session, where))
    count = _plans(gd, db_backend, lambda: admin.count(session, where, cap=1000))

    # The page's first statement is the workflows' (then their waits and errors by id).
    for plan in (page[0], *count):
        _reads_the_hero_index(plan, db_backend)
    found = admin.find(session, where)
    assert [item.hero_id for item in found.items] == ["4242"]

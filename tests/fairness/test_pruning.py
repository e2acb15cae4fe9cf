"""Housekeeping deletes the rows of fairness keys that no ongoing workflow has, so a key's
turn does not look at every tenant that ever ran; a key that is still needed keeps its row,
or gets it back."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive.runtime import housekeeping
from geneva_drive.storage.models import FairKey
from geneva_drive.storage.queries import fairness
from geneva_drive.testing import speedrun
from tests.fairness.apps import FairCharge
from tests.fairness.test_fair_claim_plans import _fair_statements
from tests.support.app import Account
from tests.worker.test_claim_plans import _buffers

KEYS: Any = FairKey.__table__


def _start(session: Session, tenant: str, n: int = 1) -> list[FairCharge]:
    heroes = [Account(id=f"{tenant}-{i}", email=f"u{i}@{tenant}") for i in range(n)]
    session.add_all(heroes)
    session.flush()
    started = [FairCharge.create(session, hero=hero) for hero in heroes]
    session.commit()
    return started


def _idle_keys(session: Session, count: int, prefix: str = "idle") -> None:
    """Rows of keys whose workflows are gone (cleaned up): never served, nothing due."""
    rows = [{"key": f"{prefix}-{i:05}.example", "served_at": fairness.NEVER} for i in range(count)]
    session.execute(sa.insert(KEYS), rows)
    session.commit()


def _keys(session: Session) -> set[str]:
    session.commit()  # a fresh read (SQLite's snapshot)
    return set(session.scalars(select(KEYS.c.key)))


def test_housekeeping_deletes_the_keys_no_ongoing_workflow_has(gd, session):
    [finished] = _start(session, "done.example")
    speedrun(finished)
    _start(session, "busy.example")
    _idle_keys(session, 3)

    result = housekeeping.run(gd)

    assert result["fair_keys_pruned"] == 4  # done.example and the three idle ones
    assert _keys(session) == {"busy.example"}
    assert housekeeping.run(gd)["fair_keys_pruned"] == 0


def test_a_key_a_claim_holds_is_left_for_the_next_pass(gd, session, db_backend):
    if db_backend == "sqlite":
        pytest.skip("one writer: no claim holds a key while housekeeping runs")
    _idle_keys(session, 2)
    with gd.engine.connect() as claim:
        held = select(KEYS.c.key).where(KEYS.c.key == "idle-00000.example")
        claim.execute(held.with_for_update()).all()

        assert housekeeping.run(gd)["fair_keys_pruned"] == 1  # never waits for the claim

        claim.rollback()
    assert _keys(session) == {"idle-00000.example"}
    assert housekeeping.run(gd)["fair_keys_pruned"] == 1
    assert _keys(session) == set()


def test_a_create_that_commits_after_the_pass_looked_keeps_its_keys_row(gd, session):
    _idle_keys(session, 1, prefix="late")  # a key whose workflows are gone...
    with gd.engine.begin() as conn, Session(conn) as looking:
        ongoing = fairness.keys_of_ongoing_workflows(looking)
        candidates = [key for key in fairness.every_key(looking) if key not in ongoing]
    assert candidates == ["late-00000.example"]
    hero = Account(id="late-1", email="u@late-00000.example")
    session.add(hero)
    session.flush()
    FairCharge.create(session, hero=hero)  # ...used again, committed before the deletion
    session.commit()

    with gd.engine.begin() as conn, Session(conn) as pruning:
        assert fairness.prune_idle_keys(pruning, candidates) == 0

    assert _keys(session) == {"late-00000.example"}


def test_an_ongoing_workflows_key_without_a_row_gets_it_back(gd, session):
    # What a create() that read its key's row before a deletion and committed after it
    # leaves behind (see fairness.prune_idle_keys).
    [workflow] = _start(session, "raced.example")
    session.execute(sa.delete(KEYS))
    session.commit()

    housekeeping.run(gd)

    session.commit()
    assert list(session.execute(select(KEYS.c.key, KEYS.c.served_at))) == [
        ("raced.example", fairness.NEVER)
    ]
    speedrun(workflow)  # and its key's turn serves it


def test_with_ten_thousand_idle_keys_pruned_a_keys_turn_costs_what_it_did_without_them(
    gd, session, clock, db_backend
):
    if db_backend != "postgresql":
        pytest.skip("buffer counts are PostgreSQL's")
    _start(session, "a.example", 3)
    _start(session, "b.example", 3)
    without = _buffers(gd, *_fair_statements(gd, session, clock)["key"])
    _idle_keys(session, 10_000, prefix="0-idle")  # before a. and b. in the keys' order
    with_idle = _buffers(gd, *_fair_statements(gd, session, clock)["key"])

    assert housekeeping.run(gd)["fair_keys_pruned"] == 10_000
    with gd.engine.connect() as conn:  # what autovacuum does after a delete of this size
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
            "VACUUM geneva_drive_fair_keys"
        )
    pruned = _buffers(gd, *_fair_statements(gd, session, clock)["key"])

    assert with_idle > 10 * without, (without, with_idle)  # each idle key was looked at
    assert pruned <= 2 * without, (without, pruned)


def _workflow_reads(gd: Any) -> list[str]:
    """The statements of one housekeeping pass that read the workflows' fairness keys."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "fair_key" in statement and "geneva_drive_workflows" in statement:
            seen.append(statement)

    sa.event.listen(gd.engine, "before_cursor_execute", record)
    try:
        housekeeping.run(gd)
    finally:
        sa.event.remove(gd.engine, "before_cursor_execute", record)
    return seen


def test_a_pass_where_fairness_is_unused_reads_no_workflow(gd, session):
    # Looking for ongoing workflows' keys walks every ongoing workflow: an application that
    # uses no fairness key must not pay that on every pass.
    assert _workflow_reads(gd) == []
    _start(session, "busy.example")
    assert _workflow_reads(gd) != []  # a key in use: its rows are looked after

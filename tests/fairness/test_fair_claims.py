"""Fair claims: a worker's claims rotate among fairness keys, on every database."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event, select
from sqlalchemy.orm import Session

from geneva_drive import StepExecution
from geneva_drive.engine.prepare import Prepared, phase1
from geneva_drive.runtime.loaded import claim_scope
from geneva_drive.storage.db import session_factory
from geneva_drive.storage.models import FairKey
from geneva_drive.storage.queries.claims import ClaimScope
from geneva_drive.storage.queries.fairness import NEVER
from geneva_drive.testing import speedrun
from tests.fairness.apps import FairCharge, PlainCharge, TwoSteps
from tests.limits._support import OPTIONS
from tests.support.app import Account


def _accounts(session: Session, tenant: str, n: int) -> list[Account]:
    accounts = [Account(id=f"{tenant}-{i}", email=f"user{i}@{tenant}") for i in range(n)]
    session.add_all(accounts)
    session.flush()
    return accounts


def _burst_then_two(gd: Any, session: Session, cls: type[Any]) -> tuple[list[int], list[int]]:
    """Tenant a starts 8 workflows; a second later, tenant b starts 2. Their ids."""
    a = [cls.create(session, hero=h).id for h in _accounts(session, "a.example", 8)]
    session.commit()
    gd.clock.advance(seconds=1)
    b = [cls.create(session, hero=h).id for h in _accounts(session, "b.example", 2)]
    session.commit()
    gd.clock.advance(seconds=1)
    return a, b


def _claim_order(gd: Any, scope: ClaimScope, limit: int = 100) -> list[int]:
    """The workflow of each claim, claim after claim (each started and left in progress),
    the clock a millisecond on after each."""
    order: list[int] = []
    options = replace(OPTIONS)  # one step thread's runs: its own turns (engine.fair_turns)
    while len(order) < limit:
        with session_factory(gd)() as session:
            started = phase1(session, options, gd, scope=scope)
            if not isinstance(started, Prepared):
                return order
            order.append(started.workflow.id)
        gd.clock.advance(seconds=0.001)
    return order


def test_a_later_tenant_is_claimed_within_a_turn_of_each_other_key(gd, session):
    a, b = _burst_then_two(gd, session, FairCharge)
    scope = claim_scope(None)
    assert scope.fair

    order = _claim_order(gd, scope)

    assert sorted(order) == sorted(a + b)
    # Turns: the ordinary order (any row: a's oldest, which stamps a too), b, the ordinary
    # order (a), b: each key gets every other claim while both have due rows.
    assert [order.index(w) for w in b] == [1, 3]
    assert order == [a[0], b[0], a[1], b[1], *a[2:]]


def test_without_a_key_the_order_is_the_ordinary_one(gd, session):
    a, b = _burst_then_two(gd, session, PlainCharge)

    order = _claim_order(gd, claim_scope(None))

    assert order == a + b  # b's first step waits for every one of a's


def test_a_claim_without_fair_classes_never_reads_the_fair_keys(gd, session):
    _burst_then_two(gd, session, PlainCharge)
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(gd.engine, "before_cursor_execute", seen)
    try:
        # A worker that loads no keyed class: the ordinary claim.
        order = _claim_order(gd, replace(claim_scope(None), fair=False))
    finally:
        event.remove(gd.engine, "before_cursor_execute", seen)

    assert len(order) == 10
    assert statements and not any("fair_keys" in s for s in statements)


def test_each_key_is_stamped_when_served_and_its_executions_carry_it(gd, session):
    _burst_then_two(gd, session, FairCharge)
    rows = session.scalars(select(StepExecution).order_by(StepExecution.id)).all()
    assert [r.fair_key for r in rows] == ["a.example"] * 8 + ["b.example"] * 2
    assert {k.key for k in session.scalars(select(FairKey))} == {"a.example", "b.example"}

    _claim_order(gd, claim_scope(None), limit=2)  # a's turn, then b's

    session.commit()  # a new read transaction (SQLite's keeps its snapshot until then)
    served = {k.key: k.served_at for k in session.scalars(select(FairKey))}
    assert served["b.example"] > served["a.example"] > NEVER


def test_create_many_stores_each_heros_key_and_keeps_the_given_order(gd, session):
    heroes = _accounts(session, "a.example", 3) + _accounts(session, "b.example", 2)
    heroes = [heroes[3], heroes[0], heroes[4], heroes[1], heroes[2]]

    result = FairCharge.create_many(session, heroes=heroes)
    session.commit()

    assert [hero for hero, _ in result.created] == heroes
    keys = dict(session.execute(sa.select(StepExecution.workflow_id, StepExecution.fair_key)).all())
    assert [keys[w] for w in result.workflow_ids] == [
        "b.example",
        "a.example",
        "b.example",
        "a.example",
        "a.example",
    ]


def test_a_keyed_workflows_next_steps_carry_its_key(gd, session):
    [hero] = _accounts(session, "c.example", 1)
    workflow = TwoSteps.create(session, hero=hero)
    session.commit()

    speedrun(workflow)

    keys = session.scalars(
        select(StepExecution.fair_key).where(StepExecution.workflow_id == workflow.id)
    ).all()
    assert keys == ["c.example", "c.example"]


def test_with_every_key_locked_by_other_claims_a_claim_still_serves_the_keys_in_order(
    gd, session, db_backend
):
    if db_backend == "sqlite":
        return  # one writer: no other claim holds a key while this one runs
    _, b = _burst_then_two(gd, session, FairCharge)
    keys: Any = FairKey.__table__
    served = sa.update(keys).where(keys.c.key == "a.example").values(served_at=gd.clock.now())
    session.execute(served)  # a served just now, b never
    session.commit()
    with gd.engine.connect() as other:
        # Another worker's claims, in flight: every key's row locked.
        other.execute(sa.select(keys.c.key).with_for_update()).all()

        order = _claim_order(gd, claim_scope(None), limit=1)

        other.rollback()
    assert order == [b[0]]  # b's (served longest ago), not a[0], due first


def test_with_every_key_locked_a_threads_successive_claims_take_the_keys_in_turn(
    gd, session, db_backend
):
    if db_backend == "sqlite":
        return  # one writer: no other claim holds a key while this one runs
    a, b = _burst_then_two(gd, session, FairCharge)
    keys: Any = FairKey.__table__
    session.execute(
        sa.update(keys).where(keys.c.key == "a.example").values(served_at=gd.clock.now())
    )
    session.commit()
    with gd.engine.connect() as other:
        # Other threads' claims, in flight: every key's row locked, their stamps not committed.
        other.execute(sa.select(keys.c.key).with_for_update()).all()

        order = _claim_order(gd, claim_scope(None), limit=3)

        other.rollback()
    # Not b's two and then a's: every thread taking the first key of the served order, they
    # all took the same key at once.
    assert order == [b[0], a[0], b[1]]


def test_with_nothing_due_in_the_usual_order_a_threads_claims_go_to_the_keys_first(gd, session):
    _burst_then_two(gd, session, FairCharge)
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(gd.engine, "before_cursor_execute", seen)
    try:
        order = _claim_order(gd, claim_scope(None))
    finally:
        event.remove(gd.engine, "before_cursor_execute", seen)

    assert len(order) == 10
    # The first claim's ordinary turn found nothing: the thread's next claims are keys' turns
    # (and the one that finds nothing at the end tries the usual order again).
    assert sum("fair_key IS NULL" in s for s in statements) == 2

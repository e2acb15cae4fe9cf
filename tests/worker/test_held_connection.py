"""A claim and the steps chained after it run on one connection, checked out once.

Each transaction of a session bound to the engine checked a connection out of the pool and
gave it back (with the pool's reset) — four times for a chain of three steps. The step thread
now keeps one for the whole run; what the pool's reset did on the way back it does itself
when a transaction fails (``executor._reset_held_connection``: without it, the hand-back after
a refused COMMIT on SQLite failed, ``tests/engine/test_transient_errors.py``).
"""

from __future__ import annotations

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from geneva_drive import Workflow, step
from geneva_drive.engine.executor import RunOptions, claim_and_run
from tests.budgets._support import cost_of
from tests.engine._support import reload
from tests.support.app import AuditEntry
from tests.worker.apps import WorkerScaleThreeSteps

CHAINED = RunOptions(worker_id="test", chain=lambda queue: True)


def test_a_claim_and_its_chained_steps_check_out_one_connection(gd, session):
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()

    with cost_of(gd.engine) as cost:
        assert claim_and_run(None, CHAINED, gd)

    assert reload(session, wf).state == "finished"
    assert cost.commits == 4  # the claim with the first start, then three completions
    assert cost.checkouts == 1


class QueryingSteps(Workflow):
    may_proceed_without_hero = True

    @step
    def one(self) -> None:
        self.session.execute(select(func.count()).select_from(AuditEntry))

    @step
    def two(self) -> None:
        self.session.add(AuditEntry(note="two"))
        self.session.flush()


def test_the_step_bodies_queries_run_on_the_held_connection(gd, session, db_backend):
    wf = QueryingSteps.create(session)
    session.commit()

    with cost_of(gd.engine) as cost:
        assert claim_and_run(None, CHAINED, gd)

    assert reload(session, wf).state == "finished"
    assert session.scalars(select(AuditEntry.note)).all() == ["two"]
    if db_backend == "sqlite":
        # A transaction begins with BEGIN IMMEDIATE there, so none is begun before a body
        # (it would hold the write lock through it): a body that queries checks one out.
        assert cost.checkouts == 3
    else:
        assert cost.checkouts == 1


_SEEN_BINDS: list[object] = []


class SideSessionThenFail(Workflow):
    may_proceed_without_hero = True

    @step
    def one(self) -> None:
        bind = self.session.get_bind()
        _SEEN_BINDS.append(bind)
        with Session(bind) as side:  # a transaction of its own, as with any engine
            side.add(AuditEntry(note="kept"))
            side.commit()
        self.session.add(AuditEntry(note="rolled back"))
        raise RuntimeError("the step fails after its side session committed")


def test_a_session_opened_on_the_step_sessions_bind_is_a_transaction_of_its_own(gd, session):
    _SEEN_BINDS.clear()
    SideSessionThenFail.create(session)
    session.commit()

    assert claim_and_run(None, CHAINED, gd)

    assert all(isinstance(bind, Engine) for bind in _SEEN_BINDS) and _SEEN_BINDS
    # Bound to the held connection, the side session would have joined the step's
    # transaction (its commit doing nothing) and lost its row with the step's rollback.
    assert session.scalars(select(AuditEntry.note)).all() == ["kept"]

"""What starting a workflow costs the caller's transaction: its inserts, one commit (the
caller's), one connection — and on PostgreSQL the wake-up travels with that commit.

A web request pays for ``create()`` and ``signal()``, so their budgets are asserted like the
worker's step budget: a statement or a commit more is a regression.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from psycopg import pq
from sqlalchemy import func, select

from geneva_drive import StepExecution, Workflow, step
from geneva_drive.testing import assert_waiting_for_signal, perform_next_step
from tests.budgets._support import cost_of, listening
from tests.engine._support import executions, reload
from tests.support.app import Order

pytestmark = pytest.mark.usefixtures("gd")


class BudgetTwoSteps(Workflow):
    @step
    def first(self) -> None:
        pass

    @step
    def second(self) -> None:
        pass


class BudgetHeroless(Workflow):
    may_proceed_without_hero = True

    @step
    def only(self) -> None:
        pass


class BudgetLater(Workflow):
    may_proceed_without_hero = True

    @step(wait=timedelta(hours=1))
    def later(self) -> None:
        pass


class BudgetOtherQueue(Workflow):
    may_proceed_without_hero = True
    job_options = {"queue": "reports"}

    @step
    def only(self) -> None:
        pass


class BudgetAwaitsSignal(Workflow):
    @step(wait_for="approved")
    def approve(self) -> None:
        pass


def _orders(session, count):
    orders = [Order() for _ in range(count)]
    session.add_all(orders)
    session.commit()
    return orders


def _inserts_only(db_backend: str) -> list[str]:
    # PostgreSQL: the workflow's INSERT, its first execution's and the NOTIFY as one statement.
    return ["WITH"] if db_backend == "postgresql" else ["INSERT", "INSERT"]


# -- create() -------------------------------------------------------------------------------


def test_create_sends_only_its_inserts_in_the_callers_transaction(session, engine, db_backend):
    (order,) = _orders(session, 1)
    session.connection()  # the caller's transaction has begun (SQLite: BEGIN IMMEDIATE)

    with cost_of(engine) as cost:
        BudgetTwoSteps.create(session, hero=order)

    # No look-up of a duplicate, no savepoint, no lock of the new row, no UPDATE, no sweep.
    assert cost.first_words == _inserts_only(db_backend)
    assert cost.checkouts == 0
    session.rollback()


def test_create_and_commit_cost_one_commit_and_one_connection(session, engine, db_backend):
    (order,) = _orders(session, 1)

    with cost_of(engine) as cost:
        wf = BudgetTwoSteps.create(session, hero=order)
        session.commit()

    assert cost.commits == 1  # the caller's own; the wake-up sends none
    assert cost.checkouts == 1  # no second connection after commit for the NOTIFY
    assert cost.notifies == (1 if db_backend == "postgresql" else 0)
    assert wf.current_execution.step_name == "first"


def test_a_refused_create_costs_its_insert_and_the_look_up_of_the_holder(
    session, engine, db_backend
):
    (order,) = _orders(session, 1)
    BudgetTwoSteps.create(session, hero=order)
    session.commit()
    session.connection()

    with cost_of(engine) as cost, pytest.raises(Exception, match="already exists"):
        BudgetTwoSteps.create(session, hero=order)

    expected = "WITH" if db_backend == "postgresql" else "INSERT"
    assert cost.first_words == [expected, "SELECT"]
    session.rollback()


@pytest.mark.postgres
def test_the_wakeup_arrives_with_the_callers_commit_and_not_before(session, engine, db_backend):
    if db_backend != "postgresql":
        pytest.skip("NOTIFY is PostgreSQL's")
    with listening(engine) as listener:
        BudgetHeroless.create(session)
        callers_backend = session.execute(select(func.pg_backend_pid())).scalar_one()
        assert listener.received_before_a_sentinel() == []  # not while uncommitted

        session.commit()

        # Sent by the caller's own connection: its transaction carried it.
        assert listener.received_before_a_sentinel() == [("default", callers_backend)]


@pytest.mark.postgres
def test_a_rolled_back_start_wakes_nobody(session, engine, db_backend):
    if db_backend != "postgresql":
        pytest.skip("NOTIFY is PostgreSQL's")
    with listening(engine) as listener:
        BudgetHeroless.create(session)
        session.rollback()

        assert listener.received_before_a_sentinel() == []


def test_many_creates_in_one_transaction_send_one_notify_per_queue(session, engine, db_backend):
    with listening(engine) if db_backend == "postgresql" else _no_listener() as listener:
        with cost_of(engine) as cost:
            for _ in range(20):
                BudgetHeroless.create(session)
            BudgetOtherQueue.create(session)
            BudgetLater.create(session)  # due in an hour: idle workers already sleep until it
            session.commit()

        assert cost.commits == 1 and cost.checkouts == 1
        if db_backend == "postgresql":
            assert cost.notifies == 2
            payloads = [payload for payload, _ in listener.received_before_a_sentinel()]
            assert sorted(payloads) == ["default", "reports"]
        else:
            assert cost.notifies == 0


def test_a_notify_rolled_back_with_a_savepoint_is_sent_again_by_the_next_start(
    session, engine, db_backend
):
    if db_backend != "postgresql":
        pytest.skip("NOTIFY is PostgreSQL's")
    with listening(engine) as listener:
        with cost_of(engine) as cost:
            savepoint = session.begin_nested()
            BudgetHeroless.create(session)
            savepoint.rollback()
            BudgetHeroless.create(session)
            session.commit()

        assert cost.notifies == 2
        assert [payload for payload, _ in listener.received_before_a_sentinel()] == ["default"]


# -- signal() ----------------------------------------------------------------------------


def test_signal_wakes_the_worker_with_the_callers_commit_and_no_connection_of_its_own(
    session, engine, db_backend
):
    (order,) = _orders(session, 1)
    wf = BudgetAwaitsSignal.create(session, hero=order)
    session.commit()
    perform_next_step(wf)
    assert_waiting_for_signal(wf, "approved")

    with cost_of(engine) as cost:
        wf.signal("approved")
        session.commit()

    assert cost.commits == 1
    assert cost.checkouts == 1
    if db_backend == "postgresql":
        assert cost.notifies == 1  # inside the transaction (the checkout count says so)


def _parked(session):
    (order,) = _orders(session, 1)
    wf = BudgetAwaitsSignal.create(session, hero=order)
    session.commit()
    perform_next_step(wf)
    return wf


def test_signal_on_postgresql_is_the_lock_and_one_statement_that_also_wakes(
    session, engine, db_backend
):
    if db_backend != "postgresql":
        pytest.skip("the one-statement delivery is PostgreSQL's")
    wf = _parked(session)

    with cost_of(engine) as cost:
        wf.signal("approved", idempotency_key="k-1")
        session.commit()

    # The workflow row lock, then the signal's INSERT, the wake-up and the NOTIFY together.
    assert cost.first_words == ["SELECT", "WITH"], cost.first_words
    assert cost.notifies == 1 and "pg_notify" in cost.statements[1]
    assert cost.commits == 1
    assert current_state(session, wf) == "scheduled"


def test_signal_on_postgresql_takes_one_round_trip(session, db_backend, tmp_path):
    # Unobserved (no listener: the short path), the lock and the delivery go to the server
    # together, in psycopg's pipeline mode: one Sync for both. libpq's own trace counts the
    # messages; a cursor listener would force SQLAlchemy's path and hide the difference.
    if db_backend != "postgresql":
        pytest.skip("the one-statement delivery is PostgreSQL's")
    wf = _parked(session)
    assert reload(session, wf).state == "ready"  # parked; and this transaction is under way
    pgconn = session.connection().connection.driver_connection.pgconn
    trace = tmp_path / "libpq.trace"
    with trace.open("w") as out:
        pgconn.trace(out.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            wf.signal("approved", idempotency_key="k-1")
        finally:
            pgconn.untrace()
    # Frontend messages: "F<tab>length<tab>type…" (a statement's text spans lines of its own).
    sent = re.findall(r"^F\t\d+\t(\w+)", trace.read_text(), flags=re.MULTILINE)
    assert sent.count("Execute") == 2, sent  # the lock, then the delivery
    assert sent.count("Sync") == 1, sent  # one round trip
    session.commit()
    assert [e.state for e in executions(session, wf)][-1] == "scheduled"  # woken


def test_a_signal_without_idempotency_key_takes_one_savepoint_not_two(session, db_backend):
    if db_backend == "postgresql":
        pytest.skip("PostgreSQL delivers in one statement, without a savepoint")
    # Only a keyed signal can lose a race on the dedup index, so only it needs the inner
    # savepoint that keeps such a loss from aborting the caller's transaction.
    wf = _parked(session)
    with cost_of(session.get_bind()) as plain:
        wf.signal("approved")
        session.commit()
    wf2 = _parked(session)
    with cost_of(session.get_bind()) as keyed:
        wf2.signal("approved", idempotency_key="k-1")
        session.commit()

    assert plain.first_words.count("SAVEPOINT") == 1, plain.first_words
    assert keyed.first_words.count("SAVEPOINT") == 2, keyed.first_words
    assert len(plain.first_words) == len(keyed.first_words) - 3  # the key's look-up too


def current_state(session, wf):
    return session.execute(
        select(StepExecution.state)
        .where(StepExecution.workflow_id == wf.id)
        .order_by(StepExecution.id.desc())
        .limit(1)
    ).scalar_one()


# -- create_many() -----------------------------------------------------------------------


def test_a_bulk_start_of_500_is_one_statement_on_postgresql_and_two_inserts_elsewhere(
    session, engine, db_backend
):
    orders = _orders(session, 500)

    with cost_of(engine) as cost:
        result = BudgetTwoSteps.create_many(session, heroes=orders)
        session.commit()

    assert len(result.created) == 500
    words = cost.first_words
    if db_backend == "postgresql":
        assert words == ["WITH"]
        assert cost.notifies == 1
    elif db_backend == "sqlite":
        assert words == ["INSERT", "INSERT"]
    else:  # MariaDB: the heroes already taken are looked up first (no ON CONFLICT)
        assert words == ["SELECT", "INSERT", "INSERT"]
    assert cost.commits == 1 and cost.checkouts == 1
    executions = session.execute(select(StepExecution.step_name)).scalars().all()
    assert executions == ["first"] * 500


def test_a_bulk_start_grows_by_a_statement_per_chunk_not_per_workflow(session, engine, db_backend):
    with cost_of(engine) as cost:
        result = BudgetHeroless.create_many(session, count=2500)
        session.commit()

    assert len(result.created) == 2500
    # PostgreSQL: 10,000 per statement; elsewhere 1,000 rows per multi-row INSERT, per table.
    expected = 1 if db_backend == "postgresql" else 6
    assert len([w for w in cost.first_words if w in ("INSERT", "WITH")]) == expected
    assert cost.commits == 1


class _no_listener:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False

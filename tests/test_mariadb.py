"""What is particular to MariaDB: the private test server, connection settings, the claim's locks.

Everything else runs on MariaDB as on every backend (the `db_backend` fixtures); these tests
only make sense there, so they use the session's `mariadb_server` directly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import geneva_drive
from geneva_drive.storage import queries
from geneva_drive.storage.db import engine_for_workers
from tests.support.mariadb import MariaDBServer, unique_database_name

pytestmark = pytest.mark.mariadb

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def mariadb_url(mariadb_server: MariaDBServer, _mariadb_template: str) -> Iterator[str]:
    """A fresh MariaDB database with the geneva-drive schema installed."""
    name = unique_database_name()
    yield mariadb_server.create_database(name, template=_mariadb_template)
    mariadb_server.drop_database(name)


@pytest.fixture
def mariadb_engine(mariadb_url: str) -> Iterator[sa.Engine]:
    engine = geneva_drive.create_engine(mariadb_url)
    yield engine
    engine.dispose()


# --- the server and its databases -------------------------------------------------------------


def test_the_mariadb_server_is_recent_enough_for_skip_locked(mariadb_server: MariaDBServer):
    major, minor = (int(part) for part in mariadb_server.version.split(".")[:2])
    assert (major, minor) >= (10, 6)
    assert "MariaDB" in mariadb_server.version


def test_a_mariadb_database_is_dropped_even_with_a_transaction_left_open(
    mariadb_server: MariaDBServer,
):
    name = unique_database_name()
    engine = sa.create_engine(mariadb_server.create_database(name))
    leaked = engine.connect()  # a test that forgets to close must not block the drop
    try:
        leaked.execute(sa.text("CREATE TABLE gd_mariadb_marker (id INT PRIMARY KEY)"))
        leaked.execute(sa.text("INSERT INTO gd_mariadb_marker VALUES (1)"))  # open transaction
        assert name in mariadb_server.database_names()
        mariadb_server.drop_database(name)
        assert name not in mariadb_server.database_names()
    finally:
        leaked.invalidate()
        engine.dispose()


# --- connection settings --------------------------------------------------------------------


def _session_settings(connection: sa.Connection) -> tuple[str, str]:
    isolation, charset = connection.execute(
        sa.text("SELECT @@SESSION.tx_isolation, @@SESSION.character_set_connection")
    ).one()
    return isolation, charset


def test_geneva_drive_engines_read_committed_in_utf8mb4(mariadb_engine: sa.Engine):
    with mariadb_engine.connect() as conn:
        assert _session_settings(conn) == ("READ-COMMITTED", "utf8mb4")


def test_geneva_drive_sessions_read_committed_even_on_an_applications_own_engine(
    mariadb_url: str,
):
    # An application engine left at InnoDB's default REPEATABLE READ: its own transactions keep
    # it; geneva-drive's sessions (engine_for_workers) run at READ COMMITTED.
    app_engine = sa.create_engine(mariadb_url)
    try:
        with app_engine.connect() as conn:
            assert _session_settings(conn)[0] == "REPEATABLE-READ"
        with Session(engine_for_workers(app_engine)) as session:
            assert _session_settings(session.connection())[0] == "READ-COMMITTED"
        with app_engine.connect() as conn:
            assert _session_settings(conn)[0] == "REPEATABLE-READ"
    finally:
        app_engine.dispose()


# --- the worker's claim ----------------------------------------------------------------------


def _due_workflows(engine: sa.Engine, count: int) -> list[tuple[int, int]]:
    """``count`` ready workflows, each with one due scheduled execution: (execution, workflow)."""
    naive = NOW.replace(tzinfo=None) - timedelta(minutes=1)
    pairs = []
    with engine.begin() as conn:
        for n in range(count):
            workflow_id = conn.execute(
                sa.text(
                    "INSERT INTO geneva_drive_workflows "
                    "(type, hero_type, hero_id, state, allow_multiple, created_at, updated_at) "
                    "VALUES ('MariaDBClaimFlow', 'Order', :n, 'ready', 0, :at, :at)"
                ),
                {"n": str(n), "at": naive},
            ).lastrowid
            execution_id = conn.execute(
                sa.text(
                    "INSERT INTO geneva_drive_step_executions "
                    "(workflow_id, step_name, state, scheduled_for, priority, "
                    "created_at, updated_at) "
                    "VALUES (:wf, 'one', 'scheduled', :at, :n, :at, :at)"
                ),
                {"wf": workflow_id, "n": n, "at": naive},
            ).lastrowid
            pairs.append((execution_id, workflow_id))
    return pairs


def _locked(engine: sa.Engine, table: str, row_id: int) -> bool:
    """Whether another transaction holds ``row_id`` of ``table`` (asked with NOWAIT)."""
    with engine.connect() as conn:
        try:
            conn.execute(
                sa.text(f"SELECT id FROM {table} WHERE id = :id FOR UPDATE NOWAIT"), {"id": row_id}
            )
        except sa.exc.OperationalError:
            return True
        finally:
            conn.rollback()
    return False


def test_concurrent_claims_take_different_workflows_and_lock_only_the_workflow_rows(
    mariadb_engine: sa.Engine,
):
    (first_execution, first_workflow), (second_execution, second_workflow) = _due_workflows(
        mariadb_engine, 2
    )
    workers = engine_for_workers(mariadb_engine)
    with Session(workers) as one, Session(workers) as two:
        # Priority 0 comes first; the second claimer passes over the locked workflow.
        assert queries.claim_due_execution(one, NOW) == (first_execution, first_workflow)
        assert queries.claim_due_execution(two, NOW) == (second_execution, second_workflow)
        assert _locked(mariadb_engine, "geneva_drive_workflows", first_workflow)
        assert _locked(mariadb_engine, "geneva_drive_workflows", second_workflow)
        # Lock order is workflow first: the claim holds no execution row (MariaDB's join
        # FOR UPDATE would lock both, in the plan's order).
        assert not _locked(mariadb_engine, "geneva_drive_step_executions", first_execution)
        assert not _locked(mariadb_engine, "geneva_drive_step_executions", second_execution)
        # Everything claimable is taken: a third claimer finds nothing and waits for nothing.
        with Session(workers) as three:
            assert queries.claim_due_execution(three, NOW) is None
        one.rollback()
        two.rollback()
    assert not _locked(mariadb_engine, "geneva_drive_workflows", first_workflow)


def test_a_claim_of_an_execution_no_longer_due_leaves_its_workflow_unlocked(
    mariadb_engine: sa.Engine,
):
    ((execution_id, workflow_id),) = _due_workflows(mariadb_engine, 1)
    with mariadb_engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE geneva_drive_step_executions SET state = 'completed' WHERE id = :id"),
            {"id": execution_id},
        )
    with Session(engine_for_workers(mariadb_engine)) as session:
        assert queries.claim_execution(session, execution_id, NOW) is None
        # The workflow row failed the claim's condition, so InnoDB released it at once.
        assert not _locked(mariadb_engine, "geneva_drive_workflows", workflow_id)


# --- the one-active unique key under neighbouring completions -----------------------------------


class _Transaction:
    """One connection's transaction, whose statements run on a thread of their own, so that a
    statement InnoDB makes wait does not stop the test from driving the others."""

    def __init__(self, engine: sa.Engine) -> None:
        self.connection = engine.connect()
        self.errors: list[BaseException] = []
        self.thread: threading.Thread | None = None

    def run(self, sql: str, params: dict[str, Any]) -> None:
        assert self.thread is None or not self.thread.is_alive()

        def target() -> None:
            try:
                self.connection.execute(sa.text(sql), params)
            except BaseException as error:  # the deadlock victim's error, kept for the assert
                self.errors.append(error)

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    @property
    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


def _lock_waits(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM information_schema.INNODB_TRX "
                    "WHERE trx_state = 'LOCK WAIT'"
                )
            ).scalar_one()
        )


def _settle(engine: sa.Engine, transactions: list[_Transaction]) -> None:
    """Until every running statement has either returned or is waiting for a lock."""
    deadline = time.monotonic() + 20
    while sum(t.busy for t in transactions) != _lock_waits(engine):
        assert time.monotonic() < deadline, (
            "statements neither returned nor waited for a lock: "
            f"{[(t.busy, t.errors) for t in transactions]}, {_lock_waits(engine)} waiting"
        )
        # Polling a condition with a deadline, no faster: InnoDB refreshes what INNODB_TRX
        # shows only once it has gone unread for 0.1 s, so polls closer than that see the
        # same stale answer for ever.
        time.sleep(0.15)


def test_neighbouring_workflows_completing_at_once_do_not_deadlock_on_the_one_active_key(
    mariadb_engine: sa.Engine,
):
    # Three workflows with consecutive ids, each completing its step and inserting its next
    # one as phase 3 does, its workflow row locked first. InnoDB's duplicate check on the
    # one-active unique key S-locks the index record after the key's own, and a completed
    # row's key becomes NULL. With the index ascending, the record after a workflow's key is
    # the next workflow's, and the NULLs are inserted just before the smallest key: A waits
    # for B, C's completion for A, and B's insert for C — a ring InnoDB breaks by rolling one
    # back, whose step then runs again. Found under load by
    # test_several_worker_processes_run_every_step_exactly_once_and_never_overlap. Descending
    # (migration 0007), each waits only for a smaller key, and the NULLs are at the far end.
    (a, wa), (b, wb), (c, wc) = _due_workflows(mariadb_engine, 3)
    at = NOW.replace(tzinfo=None)
    complete = "UPDATE geneva_drive_step_executions SET state = 'completed' WHERE id = :id"
    insert_next = (
        "INSERT INTO geneva_drive_step_executions "
        "(workflow_id, step_name, state, scheduled_for, created_at, updated_at) "
        "VALUES (:wf, 'two', 'scheduled', :at, :at, :at)"
    )
    lock = "SELECT id FROM geneva_drive_workflows WHERE id = :wf FOR UPDATE"
    one, two, three = transactions = [_Transaction(mariadb_engine) for _ in range(3)]
    try:
        for transaction, workflow_id in zip(transactions, (wa, wb, wc), strict=True):
            transaction.connection.execute(sa.text(lock), {"wf": workflow_id})
        for transaction, sql, params in (
            (two, complete, {"id": b}),
            (one, complete, {"id": a}),
            (one, insert_next, {"wf": wa, "at": at}),  # ascending: waits for B
            (three, complete, {"id": c}),  # ascending: waits for A
            (two, insert_next, {"wf": wb, "at": at}),  # ascending: waits for C, the ring
        ):
            transaction.run(sql, params)
            _settle(mariadb_engine, transactions)
        errors = [list(map(str, t.errors)) for t in transactions]  # now, not at the report
        assert errors == [[], [], []]
        three.run(insert_next, {"wf": wc, "at": at})
        # Commit each as its statement returns; the waiting ones then proceed in turn.
        pending = list(transactions)
        deadline = time.monotonic() + 20
        while pending:
            assert time.monotonic() < deadline, "transactions still waiting for each other"
            for transaction in [t for t in pending if not t.busy]:
                assert transaction.errors == []
                transaction.connection.commit()
                pending.remove(transaction)
            time.sleep(0.01)  # polling a condition with a deadline
    finally:
        for transaction in transactions:
            if transaction.thread is not None:
                transaction.thread.join(20)
            transaction.connection.close()
    with mariadb_engine.connect() as conn:
        nexts = conn.execute(
            sa.text(
                "SELECT workflow_id FROM geneva_drive_step_executions "
                "WHERE step_name = 'two' ORDER BY workflow_id"
            )
        ).scalars()
        assert list(nexts) == [wa, wb, wc]

"""What is particular to MariaDB: the private test server, connection settings, the claim's locks.

Everything else runs on MariaDB as on every backend (the `db_backend` fixtures); these tests
only make sense there, so they use the session's `mariadb_server` directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import geneva_drive
from geneva_drive import queries
from geneva_drive.engine import engine_for_workers
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

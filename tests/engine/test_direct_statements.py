"""The executor's hot statements run on the DBAPI cursor, and nothing a user relies on changes.

Unobserved, they skip SQLAlchemy's execution layer (``geneva_drive.direct``); observed — SQL
logging, cursor events — they go through it, so every statement is still seen. Either way
they write the same values and raise SQLAlchemy's own errors.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy import Integer, bindparam, literal_column, select, text, update
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session

from geneva_drive import StepExecution
from geneva_drive.core.states import ExecutionState
from geneva_drive.storage import queries
from geneva_drive.storage.dialects import dialect_of
from geneva_drive.storage.queries import bypass
from geneva_drive.storage.queries import executions as execution_queries
from geneva_drive.testing import perform_next_step
from tests.engine._support import executions
from tests.support.statements import first_words
from tests.worker.apps import WorkerScaleThreeSteps


def _direct_runs() -> int:
    """How often a statement was looked up for the direct path (only unobserved ones are)."""
    info = bypass._plan.cache_info()
    return info.hits + info.misses


def _update_shape(*keys: str, expected: tuple[str, ...] = ()) -> Any:
    return bypass.update_by_id(sa_inspect(StepExecution), keys, expected)


def test_an_unobserved_step_writes_through_the_dbapi_cursor(gd, session):
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()
    before = _direct_runs()

    perform_next_step(wf)

    # Start (execution and workflow; one statement on PostgreSQL), completion (workflow,
    # execution), the next step's INSERT.
    assert _direct_runs() - before >= 4
    dialect = gd.engine.dialect
    completion = _update_shape(
        "state",
        "outcome",
        "completed_at",
        "finished_at",
        "lease_owner",
        "lease_expires_at",
        "updated_at",
        expected=("state",),
    )
    assert bypass._plan(completion, dialect) is not None
    assert [(e.step_name, e.state) for e in executions(session, wf)] == [
        ("one", "completed"),
        ("two", "scheduled"),
    ]


def test_cursor_listeners_see_every_statement_of_a_step(gd, session):
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()
    before = _direct_runs()

    with first_words(gd.engine) as seen:
        perform_next_step(wf)

    assert _direct_runs() == before  # nothing bypassed the listener
    # Start (on PostgreSQL one WITH statement for both rows), completion, next INSERT.
    assert seen.count("UPDATE") + 2 * seen.count("WITH") >= 4
    assert seen.count("INSERT") == 1


def test_sql_logging_sees_every_statement_of_a_step(gd, session, caplog):
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()
    before = _direct_runs()

    with caplog.at_level(logging.INFO, logger="sqlalchemy.engine"):
        perform_next_step(wf)

    assert _direct_runs() == before
    logged = [r.getMessage().split()[0].upper() for r in caplog.records if r.getMessage()]
    assert logged.count("UPDATE") + 2 * logged.count("WITH") >= 4
    assert "INSERT" in logged


def test_direct_writes_store_what_sqlalchemy_stores(gd, session, clock):
    """Bind processors are applied by hand: a timestamp the executor writes directly
    (``started_at``) is stored exactly like one the ORM writes (``created_at``)."""
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()
    before = _direct_runs()
    perform_next_step(wf)
    assert _direct_runs() > before

    raw = session.execute(
        text(
            "SELECT created_at, started_at, state FROM geneva_drive_step_executions "
            "WHERE workflow_id = :id AND step_name = 'one'"
        ),
        {"id": wf.id},
    ).one()
    assert type(raw.started_at) is type(raw.created_at)
    assert raw.started_at == raw.created_at  # the frozen clock did not move
    assert raw.state == "completed"  # the enum went in as its value
    first = executions(session, wf)[0]
    assert first.started_at == first.created_at == clock.now()


def test_a_constraint_violation_is_raised_as_sqlalchemys_integrity_error(gd, session, clock):
    wf = WorkerScaleThreeSteps.create(session)  # its first execution is scheduled: the one active
    session.commit()
    before = _direct_runs()

    if gd.engine.dialect.insert_returning:
        insert = execution_queries._insert_stmt(
            returning=True, counts_attempt=dialect_of(gd.engine).counts_attempt_on_insert
        )
        assert bypass._plan(insert, gd.engine.dialect) is not None
    with pytest.raises(IntegrityError) as raised:
        queries.insert_execution(
            session,
            {
                "workflow_id": wf.id,
                "step_name": "two",
                "scheduled_for": clock.now(),
                "created_at": clock.now(),
            },
        )
    assert _direct_runs() > before
    assert not raised.value.connection_invalidated
    assert not queries.is_transient(raised.value)
    session.rollback()

    # The database is unchanged and the session usable.
    assert [(e.step_name, e.state) for e in executions(session, wf)] == [("one", "scheduled")]


def test_a_lock_timeout_in_a_direct_statement_is_transient(gd, session, db_backend):
    if db_backend == "sqlite":
        pytest.skip("SQLite has no row locks: its lock wait happens at BEGIN IMMEDIATE")
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()
    execution = executions(session, wf)[0]

    with Session(gd.engine) as holder, Session(gd.engine) as waiter:
        holder.execute(
            update(StepExecution).where(StepExecution.id == execution.id).values(priority=1)
        )  # holds the row lock until rolled back
        if db_backend == "postgresql":
            waiter.execute(text("SET LOCAL lock_timeout = '50ms'"))
        else:
            waiter.execute(text("SET SESSION innodb_lock_wait_timeout = 1"))
        mine = waiter.get(StepExecution, execution.id)
        assert bypass._plan(_update_shape("state", "updated_at"), gd.engine.dialect) is not None
        with pytest.raises(OperationalError) as raised:
            queries.write_through(
                waiter, mine, {"state": ExecutionState.CANCELED, "updated_at": execution.created_at}
            )
        assert queries.is_transient(raised.value)
        waiter.rollback()
        holder.rollback()


def test_statements_with_expanding_parameters_take_sqlalchemys_path(gd, session):
    table: Any = StepExecution.__table__
    stmt = (
        update(table)
        .where(table.c.state.in_([ExecutionState.WAITING, ExecutionState.SCHEDULED]))
        .values(priority=7)
    )
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()

    assert bypass._plan(stmt, gd.engine.dialect) is None
    assert bypass._plan(_update_shape("state"), gd.engine.dialect) is None  # onupdate default
    assert bypass.execute_direct(session.connection(), stmt, {}) == 1
    session.commit()
    assert executions(session, wf)[0].priority == 7


def _many_parameters() -> Any:
    """A statement of 60 parameters, one of them bound twice, with a literal ``%``: more
    than psycopg keeps the parsing of (50), so it is sent with numbered placeholders."""
    values = [bindparam(f"p{i}", type_=Integer) for i in range(60)]
    return select(*values, values[0] + 1, literal_column("'100%'"))


def test_a_statement_psycopg_would_parse_at_every_execution_is_sent_numbered(gd, session):
    stmt = _many_parameters()
    plan = bypass._plan(stmt, gd.engine.dialect)
    assert plan is not None
    # Only where psycopg would parse it every time: elsewhere its own cache is as cheap.
    assert plan.raw is (gd.engine.dialect.driver == "psycopg")
    assert bypass._plan(_update_shape("priority", "updated_at"), gd.engine.dialect).raw is False

    row = bypass.execute_direct(session.connection(), stmt, {f"p{i}": i * 10 for i in range(60)})

    assert row == (*[i * 10 for i in range(60)], 1, "100%")


def test_numbered_placeholders_keep_one_number_per_name_and_unescape_percent_signs():
    sql, names = bypass._numbered("SELECT %(a)s, %(b)s::INT, %(a)s, '5%%' WHERE x LIKE 'y%%'")

    assert sql == "SELECT $1, $2::INT, $1, '5%' WHERE x LIKE 'y%'"
    assert names == ("a", "b")


@pytest.mark.parametrize("undo", ["savepoint", "transaction"])
def test_an_execution_inserted_in_a_rolled_back_transaction_is_forgotten_by_the_session(
    gd, session, undo
):
    # The direct path brings the inserted row into the session as already persistent; a
    # rollback must take it out again, or the next row to get its id (SQLite reuses it)
    # cannot enter the session ("another instance with key … is already present").
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()

    if undo == "savepoint":
        with session.begin_nested() as savepoint:
            wf.skip()  # inserts the next step's execution
            kept = wf.current_execution
            savepoint.rollback()
    else:
        wf.skip()
        kept = wf.current_execution
        session.rollback()
    wf.skip()
    session.commit()

    assert kept is not None and kept not in session
    states = [row.state for row in executions(session, wf)]
    assert states.count(ExecutionState.SCHEDULED) == 1, states


def test_a_connection_lost_before_its_first_direct_statement_is_reported_as_lost(gd, session):
    # A connection the short path has not used yet has no cursor of its own: making one is
    # where a closed connection fails first, and that error too must come as SQLAlchemy's,
    # with the connection invalidated, or the executor never hands the step back.
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()
    execution = executions(session, wf)[0]
    with Session(gd.engine) as other:
        mine = other.get(StepExecution, execution.id)
        fairy = other.connection().connection
        fairy.info.pop(bypass._CURSOR, None)
        fairy.dbapi_connection.close()  # as a dead server, or a closed file, leaves it
        values = {"state": ExecutionState.CANCELED, "updated_at": execution.created_at}
        assert bypass._plan(_update_shape(*values), gd.engine.dialect) is not None
        with pytest.raises(DBAPIError) as raised:
            queries.write_through(other, mine, values)
        assert raised.value.connection_invalidated
        other.rollback()
    assert [(e.step_name, e.state) for e in executions(session, wf)] == [("one", "scheduled")]

"""A chained step's completion as a transaction of its own (PostgreSQL).

When a step's body wrote nothing and its successor starts directly, the completion and that
start are one statement, the transaction's only one. psycopg would still wrap it in a BEGIN
and a COMMIT of its own, two more round trips; run in autocommit mode the statement is the
transaction (``queries.bypass.execute_alone``). What makes that safe is that the statement
writes all three rows or none: the workflow's navigation only while the execution is still
in progress, with that row locked as the guard reads it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, event, select, text
from sqlalchemy.exc import OperationalError

from geneva_drive import DatabaseBackend, Workflow, step
from geneva_drive.engine.executor import RunOptions, claim_and_run
from geneva_drive.runtime.configure import configured
from geneva_drive.storage.models import StepExecution
from tests.engine._support import history, reload
from tests.worker._support import someone_waits_for_a_lock, wait_until_true
from tests.worker.apps import WorkerScaleThreeSteps

CHAINED = RunOptions(worker_id="test", chain=lambda queue: True)

pytestmark = pytest.mark.postgres


@pytest.fixture(autouse=True)
def _postgresql_only(db_backend: str) -> None:
    if db_backend != "postgresql":
        pytest.skip("transactions of one statement are PostgreSQL's (data-modifying CTEs)")


@contextmanager
def protocol_trace(engine: Engine, path: Path) -> Iterator[None]:
    """libpq's trace of every message the connections checked out meanwhile send."""
    out = path.open("w")
    flags = psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE

    def on_checkout(dbapi_connection: Any, *_: Any) -> None:
        pgconn = dbapi_connection.pgconn
        pgconn.trace(out.fileno())
        pgconn.set_trace_flags(flags)

    def on_checkin(dbapi_connection: Any, *_: Any) -> None:
        if dbapi_connection is not None and not dbapi_connection.closed:
            dbapi_connection.pgconn.untrace()  # flushes libpq's buffer

    event.listen(engine.pool, "checkout", on_checkout)
    event.listen(engine.pool, "checkin", on_checkin)
    try:
        yield
    finally:
        event.remove(engine.pool, "checkout", on_checkout)
        event.remove(engine.pool, "checkin", on_checkin)
        out.close()


def sent(trace: Path, command: str) -> int:
    """How many messages from the client (F: the frontend) began with ``command``."""
    return sum(
        1
        for line in trace.read_text().splitlines()
        if line.startswith("F") and f'"{command}' in line
    )


def test_a_direct_successors_start_rides_in_a_transaction_of_one_statement(gd, session, tmp_path):
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()
    trace = tmp_path / "libpq.trace"

    with protocol_trace(gd.engine, trace):
        assert claim_and_run(None, CHAINED, gd)

    assert reload(session, wf).state == "finished"
    # Four transactions: the claim with step one's start, one's completion with two's start,
    # two's with three's, three's (finishing the workflow). The middle two are statements of
    # their own; psycopg began and committed only the first and the last.
    assert sent(trace, "BEGIN") == 2
    assert sent(trace, "COMMIT") == 2
    rows = session.execute(
        select(StepExecution.step_name, StepExecution.state)
        .where(StepExecution.workflow_id == wf.id)
        .order_by(StepExecution.id)
    ).all()
    assert rows == [("one", "completed"), ("two", "completed"), ("three", "completed")]


def test_an_engine_set_to_another_isolation_level_keeps_the_ordinary_transaction(
    gd, session, tmp_path, clock
):
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()
    repeatable = gd.engine.execution_options(isolation_level="REPEATABLE READ")
    trace = tmp_path / "libpq.trace"

    with (
        configured(engine=repeatable, clock=clock, backend=DatabaseBackend()) as settings,
        protocol_trace(gd.engine, trace),
    ):
        assert claim_and_run(None, CHAINED, settings)

    assert reload(session, wf).state == "finished"
    # Run alone, the completions would run at the server's default level instead.
    assert sent(trace, "BEGIN ISOLATION LEVEL REPEATABLE READ") == 4
    assert sent(trace, "COMMIT") == 4


class TakenFromItself(Workflow):
    """Its first step's execution is taken from it while the body runs, by a writer that
    leaves the workflow row as phase 1 left it (no taker in the library does that; the
    statement must not rely on it)."""

    may_proceed_without_hero = True

    @step
    def one(self) -> None:
        engine = self.session.get_bind()
        assert isinstance(engine, Engine)
        with engine.connect() as other, other.begin():  # a transaction of its own
            other.execute(
                text(
                    "UPDATE geneva_drive_step_executions SET state = 'completed', "
                    "outcome = 'recovered' WHERE workflow_id = :id AND state = 'in_progress'"
                ),
                {"id": self.id},
            )

    @step
    def two(self) -> None:
        pass


def test_a_completion_whose_execution_was_taken_commits_nothing(gd, session):
    wf = TakenFromItself.create(session)
    session.commit()

    assert claim_and_run(None, CHAINED, gd)

    reload(session, wf)
    # Written alone without the execution's guard, the workflow would have moved on to
    # step two (committed with the statement) while its execution was not ours to complete.
    assert (wf.state, wf.current_step_name, wf.next_step_name) == ("performing", "one", "one")
    assert session.execute(
        select(StepExecution.step_name, StepExecution.outcome).where(
            StepExecution.workflow_id == wf.id
        )
    ).all() == [("one", "recovered")]


class Taker(threading.Thread):
    """What a recovery does, at the worst moment: lock the workflow row, wait until the
    completion statement waits for it (holding its shared lock on the execution), then lock
    the execution — the cycle the statement's guard can close, against the lock order."""

    def __init__(self, engine: Engine, workflow_id: int) -> None:
        super().__init__(name="taker", daemon=True)
        self.engine, self.workflow_id = engine, workflow_id
        self.locked = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.engine.connect() as conn, conn.begin():
                # The completion's deadlock check (the default 1 s) runs first and breaks it.
                conn.execute(text("SET LOCAL deadlock_timeout = '60s'"))
                conn.execute(
                    text("SELECT 1 FROM geneva_drive_workflows WHERE id = :id FOR UPDATE"),
                    {"id": self.workflow_id},
                )
                self.locked.set()
                wait_until_true(lambda: someone_waits_for_a_lock(self.engine), "the completion")
                conn.execute(
                    text(
                        "SELECT 1 FROM geneva_drive_step_executions "
                        "WHERE workflow_id = :id AND state = 'in_progress' FOR UPDATE"
                    ),
                    {"id": self.workflow_id},
                )
        except BaseException as error:  # reported by the test
            self.error = error


_TAKERS: list[Taker] = []


class RacedByATaker(Workflow):
    may_proceed_without_hero = True

    @step
    def one(self) -> None:
        engine = self.session.get_bind()
        assert isinstance(engine, Engine)
        taker = Taker(engine, self.id)
        _TAKERS.append(taker)
        taker.start()
        assert taker.locked.wait(30)

    @step
    def two(self) -> None:
        pass


def test_a_deadlock_with_a_taker_is_transient_and_leaves_the_connection_as_it_was(gd, session):
    _TAKERS.clear()
    wf = RacedByATaker.create(session)
    session.commit()

    with pytest.raises(OperationalError, match="deadlock"):
        claim_and_run(None, CHAINED, gd)
    _TAKERS[0].join(30)

    assert _TAKERS[0].error is None
    # Nothing of the completion was committed; the hand-back ran once the taker let go.
    assert history(session, wf) == [("one", "completed", "recovered"), ("one", "scheduled", None)]
    reload(session, wf)
    assert (wf.state, wf.current_step_name) == ("ready", None)
    # The held connection went back to the pool out of autocommit mode: a transaction on it
    # is a transaction again.
    pooled = [gd.engine.connect() for _ in range(gd.engine.pool.checkedin())]
    try:
        assert pooled
        assert [c.connection.driver_connection.autocommit for c in pooled] == [False] * len(pooled)
    finally:
        for conn in pooled:
            conn.close()

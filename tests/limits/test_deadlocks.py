"""A deadlock while a step takes a slot is the database's trouble, never the step's.

InnoDB answers a deadlock by rolling back the victim's *whole* transaction, savepoints
included (PostgreSQL aborts only up to the savepoint). A slot taken inside a savepoint used
to surface on MariaDB as "SAVEPOINT sa_savepoint_1 does not exist" — an error phase 1 then
recorded on the step, pausing its workflow. Here a real deadlock is forced between the claim
and a second connection: the claim must be abandoned (rolled back, nothing recorded, nothing
counted), and the next claim starts the step.
"""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

import pytest
import sqlalchemy as sa
from sqlalchemy import event, select

from geneva_drive import ConcurrencyLimit, Workflow, step
from geneva_drive.engine.limits import PARKED_UNTIL
from geneva_drive.engine.prepare import Prepared
from geneva_drive.storage.models import LimitSlot, LimitWaiter, StepExecution
from geneva_drive.storage.queries import is_transient
from tests.limits._support import claim_and_start, counts, finish, rows, start_all
from tests.limits.apps import BodyRun, TwoAtATime

DEADLINE = 60.0
KEY = "TwoAtATime.work"  # a step-level limit with a constant key: its owner's name


@pytest.fixture
def server_only(db_backend: str) -> None:
    if db_backend == "sqlite":
        pytest.skip("one writer: SQLite transactions never deadlock on row locks")


def _waiting_for_a_lock(engine: sa.Engine) -> bool:
    """Whether a statement waits for a row lock (MariaDB's INNODB_TRX needs the PROCESS
    privilege; its process list shows the claim's INSERT running, which here means waiting)."""
    if engine.dialect.name == "postgresql":
        query = "SELECT count(*) FROM pg_locks WHERE NOT granted"
    else:
        query = (
            "SELECT count(*) FROM information_schema.processlist WHERE command = 'Query' "
            "AND info LIKE 'INSERT INTO geneva_drive_limit_slots%%'"
        )
    with engine.connect() as connection:
        return int(connection.execute(sa.text(query)).scalar_one()) > 0


def _wait_until_blocked(engine: sa.Engine, outcome: dict[str, Any]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not _waiting_for_a_lock(engine):
        assert time.monotonic() < deadline, f"the claim never waited for the lock: {outcome}"
        time.sleep(0.01)  # polling a condition with a deadline


@pytest.mark.usefixtures("server_only")
def test_a_deadlock_while_creating_a_keys_slots_abandons_the_claim(gd, session):
    workflow = TwoAtATime.create(session)
    session.commit()
    other = gd.engine.connect()
    other_tx = other.begin()
    fired = threading.Event()

    def before_slot_insert(conn: Any, cursor: Any, statement: str, *_args: Any) -> None:
        # The moment the claim creates the key's slot rows (none exist: the key's first use),
        # another transaction has just inserted slot 1, uncommitted: the claim inserts slot 0
        # and waits for slot 1.
        if conn is other or fired.is_set():
            return
        if statement.lstrip().upper().startswith("INSERT INTO GENEVA_DRIVE_LIMIT_SLOTS"):
            fired.set()
            # Heavier than the claim, so that InnoDB picks the claim as the victim.
            other.execute(
                sa.insert(BodyRun),
                [{"key": "ballast", "began": 0.0, "ended": 0.0} for _ in range(200)],
            )
            other.execute(sa.insert(LimitSlot), [{"key": KEY, "slot": 1}])

    event.listen(gd.engine, "before_cursor_execute", before_slot_insert)
    outcome: dict[str, Any] = {}

    def claim() -> None:
        try:
            outcome["started"] = claim_and_start(gd)
        except Exception as error:  # what phase 1 lets out, asserted below
            outcome["error"] = error

    claimer = threading.Thread(target=claim)
    try:
        claimer.start()
        _wait_until_blocked(gd.engine, outcome)
        # Now close the cycle, as two workers creating a key's slots at once may: the other
        # inserts slot 0, which the claim holds, while the claim waits for its slot 1.
        other.execute(sa.insert(LimitSlot), [{"key": KEY, "slot": 0}])
        claimer.join(DEADLINE)
        other_tx.rollback()
    finally:
        event.remove(gd.engine, "before_cursor_execute", before_slot_insert)
        other.close()
    assert fired.is_set()

    error = outcome.get("error")
    assert error is not None, f"phase 1 did not fail: {outcome.get('started')}"
    assert "deadlock" in str(error).lower(), error  # forced: not a lock wait timeout
    assert is_transient(error), f"not seen as the database's trouble: {error!r}"
    # Nothing was recorded: the execution is as the claim found it, its workflow ready.
    (execution,) = rows(session, [workflow])
    assert execution.state == "scheduled"
    assert execution.error_class_name is None
    assert execution.read_metadata("reattempt_reason") is None
    assert session.scalar(select(sa.func.count()).select_from(StepExecution)) == 1
    session.refresh(workflow)
    assert workflow.state == "ready"
    assert counts(session)[:2] == (0, 0)
    # The next claim starts it.
    step_session, started = claim_and_start(gd)
    assert isinstance(started, Prepared)
    finish(gd, step_session, started)
    assert [e.outcome for e in rows(session, [workflow])] == ["success"]


def test_the_error_of_a_savepoint_a_deadlock_undid_is_transient_too():
    pymysql = pytest.importorskip("pymysql")
    deadlock = sa.exc.OperationalError(
        "INSERT …", {}, pymysql.err.OperationalError(1213, "Deadlock found")
    )
    lost = sa.exc.OperationalError(
        "ROLLBACK TO SAVEPOINT sa_savepoint_1",
        {},
        pymysql.err.OperationalError(1305, "SAVEPOINT sa_savepoint_1 does not exist"),
    )
    assert not is_transient(lost)  # alone: a programming error, the step's to report
    lost.__context__ = deadlock
    assert is_transient(lost)


# -- phase 3: the transaction that records a step's outcome and frees its slot ------------------


class OneAtATime(Workflow):
    """A global limit of 1; counts its bodies' runs outside any transaction (a rolled-back
    run still ran)."""

    may_proceed_without_hero = True
    runs: ClassVar[dict[int, int]] = {}

    @step(concurrency=ConcurrencyLimit(1))
    def work(self) -> None:
        OneAtATime.runs[self.id] = OneAtATime.runs.get(self.id, 0) + 1


def _waiting_for_an_execution(engine: sa.Engine) -> bool:
    if engine.dialect.name == "postgresql":
        query = "SELECT count(*) FROM pg_locks WHERE NOT granted"
    else:
        query = (
            "SELECT count(*) FROM information_schema.processlist WHERE command = 'Query' "
            "AND info LIKE 'UPDATE geneva_drive_step_executions%%'"
        )
    with engine.connect() as connection:
        return int(connection.execute(sa.text(query)).scalar_one()) > 0


@pytest.mark.usefixtures("server_only")
def test_a_claim_of_a_parked_row_racing_the_release_that_wakes_it_never_reruns_the_body(
    gd, session
):
    """The cycle: phase 3 frees the slot and locks the key's first waiter row, then wants its
    execution row, to make it due; a claim of that very execution (an operator made it due)
    holds the execution row and wants the waiter row, to drop it. Phase 3 must not wait for
    the execution row: the claim takes the freed slot itself."""
    OneAtATime.runs.clear()
    holder, waiter = OneAtATime.create(session), OneAtATime.create(session)
    session.commit()
    holding, started = claim_and_start(gd)
    assert isinstance(started, Prepared) and started.workflow_id == holder.id
    parked_session, parked = claim_and_start(gd)
    parked_session.close()
    assert not isinstance(parked, Prepared)
    (waiting,) = rows(session, [waiter])
    assert counts(session)[:2] == (1, 1)

    other = gd.engine.connect()
    other_tx = other.begin()
    fired = threading.Event()

    def after_waiter_lookup(conn: Any, cursor: Any, statement: str, *_args: Any) -> None:
        # Phase 3 has just freed the slot and locked the waiter row: now the claim of the
        # parked row locks it (and weighs more, so that InnoDB would pick phase 3 as victim).
        if conn is other or fired.is_set():
            return
        if "geneva_drive_limit_waiters" in statement and "SKIP LOCKED" in statement.upper():
            fired.set()
            other.execute(
                sa.insert(BodyRun),
                [{"key": "ballast", "began": 0.0, "ended": 0.0} for _ in range(200)],
            )
            other.execute(
                select(StepExecution.id).where(StepExecution.id == waiting.id).with_for_update()
            )

    event.listen(gd.engine, "after_cursor_execute", after_waiter_lookup)
    outcome: dict[str, Any] = {}

    def phase3() -> None:
        try:
            finish(gd, holding, started)
        except Exception as error:  # what phase 3 lets out, asserted below
            outcome["error"] = error

    finisher = threading.Thread(target=phase3)
    try:
        finisher.start()
        deadline = time.monotonic() + DEADLINE
        while finisher.is_alive() and not _waiting_for_an_execution(gd.engine):
            assert time.monotonic() < deadline, "phase 3 neither ended nor waited"
            time.sleep(0.01)  # polling a condition with a deadline
        # The claim drops the waiter row (closing the cycle if phase 3 waits for it), then
        # takes the slot phase 3 freed: here, it makes the row due for the next claim.
        other.execute(sa.delete(LimitWaiter).where(LimitWaiter.execution_id == waiting.id))
        other.execute(
            sa.update(StepExecution)
            .where(StepExecution.id == waiting.id)
            .values(scheduled_for=gd.clock.now())
        )
        finisher.join(DEADLINE)
        other.execute(sa.delete(BodyRun).where(BodyRun.key == "ballast"))
        other_tx.commit()
    finally:
        event.remove(gd.engine, "after_cursor_execute", after_waiter_lookup)
        other.close()
    assert fired.is_set()
    assert not finisher.is_alive()

    assert "error" not in outcome, f"phase 3 failed: {outcome['error']!r}"
    (done,) = rows(session, [holder])
    assert (done.state, done.outcome) == ("completed", "success")
    # The waiter starts on the freed slot, and the holder's body never runs again.
    for step_session, prepared in start_all(gd):
        finish(gd, step_session, prepared)
    assert [e.outcome for e in rows(session, [holder, waiter])] == ["success", "success"]
    assert OneAtATime.runs == {holder.id: 1, waiter.id: 1}
    assert counts(session)[:2] == (0, 0)


@pytest.mark.usefixtures("server_only")
def test_a_release_wakes_the_next_waiter_when_another_transaction_holds_the_first(gd, session):
    OneAtATime.runs.clear()
    holder, first, second = (OneAtATime.create(session) for _ in range(3))
    session.commit()
    holding, started = claim_and_start(gd)
    assert isinstance(started, Prepared) and started.workflow_id == holder.id
    for _ in range(2):
        parked_session, _parked = claim_and_start(gd)
        parked_session.close()
    held_waiter, next_waiter = rows(session, [first, second])
    assert counts(session)[:2] == (1, 2)

    other = gd.engine.connect()
    other_tx = other.begin()
    finisher = threading.Thread(target=finish, args=(gd, holding, started))
    try:
        # Another transaction holds the first waiter's execution (a claim, an operator).
        other.execute(
            select(StepExecution.id).where(StepExecution.id == held_waiter.id).with_for_update()
        )
        finisher.start()
        finisher.join(DEADLINE / 4)  # a deadline for the failure only: it never waits
        waited = finisher.is_alive()
    finally:
        other_tx.rollback()
        other.close()
        finisher.join(DEADLINE)
    assert not waited, "phase 3 waited for a lock after it freed the slot"

    held_waiter, next_waiter = rows(session, [first, second])
    assert held_waiter.scheduled_for == PARKED_UNTIL  # left to the other transaction
    assert next_waiter.scheduled_for == gd.clock.now()  # woken instead
    waiting = session.scalars(select(LimitWaiter.execution_id)).all()
    assert waiting == [held_waiter.id]  # its waiter row kept: the next release wakes it
    while runs := start_all(gd):
        for step_session, prepared in runs:
            if isinstance(prepared, Prepared):
                finish(gd, step_session, prepared)
            else:
                step_session.close()
    assert [e.outcome for e in rows(session, [holder, first, second])] == ["success"] * 3
    assert OneAtATime.runs == {holder.id: 1, first.id: 1, second.id: 1}
    assert counts(session)[:2] == (0, 0)

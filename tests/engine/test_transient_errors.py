"""A deadlock or lock timeout is the database's trouble, not the step's."""

from __future__ import annotations

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.exc import OperationalError

from geneva_drive import Workflow, step
from geneva_drive.engine.executor import RunOptions, run_execution
from geneva_drive.storage.db import session_factory
from geneva_drive.storage.queries import is_transient
from tests.engine._support import history
from tests.support.app import AuditEntry


class _Deadlock(Exception):
    sqlstate = "40P01"


class _MySQLDeadlock(Exception):
    pass


def _operational(orig: Exception) -> OperationalError:
    return OperationalError("COMMIT", None, orig)


def test_deadlocks_lock_timeouts_and_busy_sqlite_are_transient():
    assert is_transient(_operational(_Deadlock()))
    assert is_transient(_operational(_MySQLDeadlock(1213, "Deadlock found")))
    assert is_transient(_operational(_MySQLDeadlock(1205, "Lock wait timeout")))
    assert is_transient(_operational(Exception("database is locked")))


def test_ordinary_errors_are_not_transient():
    assert not is_transient(ValueError("boom"))
    assert not is_transient(_operational(Exception("no such table: x")))


class TransientFinalize(Workflow):
    may_proceed_without_hero = True

    @step
    def write(self) -> None:
        self.session.add(AuditEntry(note="body"))
        self.session.info["fail_next_commit"] = True


def test_a_deadlock_while_recording_the_outcome_hands_the_step_back_to_run_again(gd, session):
    wf = TransientFinalize.create(session)
    session.commit()
    execution_id = wf.current_execution.id
    session.commit()

    def fail_once(connection) -> None:
        sessions = [s for s in list(_open_sessions) if s.info.pop("fail_next_commit", False)]
        if sessions:
            raise _operational(_Deadlock("deadlock detected"))

    _open_sessions: list = []
    factory = session_factory(gd)
    event.listen(factory, "after_begin", lambda s, *_: _open_sessions.append(s))
    event.listen(gd.engine, "commit", fail_once)
    try:
        with pytest.raises(OperationalError):
            run_execution(execution_id, options=RunOptions(worker_id="w1"))
    finally:
        event.remove(gd.engine, "commit", fail_once)

    assert session.execute(select(func.count()).select_from(AuditEntry)).scalar_one() == 0
    assert history(session, wf) == [
        ("write", "completed", "recovered"),
        ("write", "scheduled", None),
    ]

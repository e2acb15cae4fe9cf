"""A connection lost after the body, before phase 3 commits, hands the step back to run again."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from geneva_drive import Workflow, step
from geneva_drive.engine.executor import RunOptions, run_execution
from tests.engine._support import history, reload
from tests.support.app import AuditEntry
from tests.support.connections import lose_connection

_KILLS_LEFT: list[int] = []


class CutBeforeCommit(Workflow):
    may_proceed_without_hero = True

    @step
    def write(self) -> None:
        self.session.add(AuditEntry(note="once"))
        self.session.flush()  # the connection phase 3 goes on to use
        if _KILLS_LEFT:
            _KILLS_LEFT.pop()
            lose_connection(self.session)  # from another connection, as a restart would

    @step
    def after(self) -> None:
        self.session.add(AuditEntry(note="after"))


def _current_id(session: Session, wf: Workflow) -> int:
    current = reload(session, wf).current_execution
    assert current is not None
    execution_id = int(current.id)
    session.commit()
    return execution_id


def test_a_connection_lost_before_the_outcome_commits_hands_the_step_back(session):
    wf = CutBeforeCommit.create(session)
    session.commit()
    _KILLS_LEFT[:] = [1]

    with pytest.raises(DBAPIError) as raised:
        run_execution(_current_id(session, wf), options=RunOptions(worker_id="w1"))

    assert raised.value.connection_invalidated
    assert history(session, wf) == [
        ("write", "completed", "recovered"),
        ("write", "scheduled", None),
    ]
    # A worker running again finishes it, and the body's write landed exactly once.
    run_execution(_current_id(session, wf), options=RunOptions(worker_id="w2"))
    run_execution(_current_id(session, wf), options=RunOptions(worker_id="w2"))
    assert reload(session, wf).state == "finished"
    notes = session.scalars(select(AuditEntry.note).order_by(AuditEntry.id)).all()
    assert notes == ["once", "after"]
    assert session.scalar(select(func.count()).select_from(AuditEntry)) == 2

"""Children ending at once: the parent counts each once and wakes once."""

from __future__ import annotations

import threading

import pytest

from geneva_drive import Workflow, step
from geneva_drive.engine.executor import RunOptions, claim_and_run
from geneva_drive.testing import perform_next_step
from tests.children._support import children_of, counters, reload, run_due
from tests.engine._support import history
from tests.support.app import AuditEntry

# Both children's bodies meet here, so both reach their end (phase 3) at the same moment.
_MEET = threading.Barrier(2, timeout=60)


class RcChild(Workflow):
    may_proceed_without_hero = True

    @step
    def work(self):
        _MEET.wait()


class RcParent(Workflow):
    may_proceed_without_hero = True

    @step
    def split(self):
        for key in ("a", "b"):
            self.start_child(RcChild, key=key)

    @step(wait_for_children="all")
    def close(self):
        self.session.add(AuditEntry(note=f"closed {self.children_ended}/{self.children_started}"))


class RcCanceledMeanwhile(Workflow):
    may_proceed_without_hero = True

    @step
    def split(self):
        self.start_child(RcChild, key="late")
        # An operator cancels this workflow while the step runs (another connection).
        operator = threading.Thread(target=_cancel_from_outside, args=(self.id,))
        operator.start()
        operator.join(timeout=60)


def _cancel_from_outside(workflow_id: int) -> None:
    from geneva_drive.core.settings import settings
    from geneva_drive.storage.db import session_factory

    with session_factory(settings())() as other:
        other.get(Workflow, workflow_id).cancel()
        other.commit()


def test_a_child_started_by_a_step_that_runs_while_its_parent_is_canceled_is_canceled(
    gd, session, db_backend
):
    if db_backend == "sqlite":
        pytest.skip("SQLite runs one writer at a time: the cancel would wait for the step")
    parent = RcCanceledMeanwhile.create(session)
    session.commit()

    perform_next_step(parent)

    assert reload(session, parent).state == "canceled"
    (child,) = children_of(session, parent)
    assert child.state == "canceled"


def test_two_children_ending_at_once_are_both_counted_and_wake_the_parent_once(
    gd, session, db_backend
):
    if db_backend == "sqlite":
        pytest.skip("SQLite runs one writer at a time: its children cannot end at once")
    _MEET.reset()
    parent = RcParent.create(session)
    session.commit()
    perform_next_step(parent)  # split
    perform_next_step(parent)  # close parks
    errors: list[BaseException] = []

    def run_one() -> None:
        try:
            assert claim_and_run(None, RunOptions())
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run_one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert errors == []
    assert {k.state for k in children_of(session, parent)} == {"finished"}
    assert counters(session, parent) == (2, 2, 0)
    assert history(session, parent)[-1] == ("close", "scheduled", None)

    run_due(session)

    assert [n for (n,) in session.query(AuditEntry.note)] == ["closed 2/2"]
    assert [(name, state) for name, state, _ in history(session, parent)] == [
        ("split", "completed"),
        ("close", "completed"),
    ]
    assert reload(session, parent).state == "finished"

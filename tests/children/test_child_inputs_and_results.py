"""start_child(input=…) and child_results(): a child's input in, its last step's result out."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event

from geneva_drive import (
    InputTooLargeError,
    InvalidStateError,
    SerializationError,
    Workflow,
    configure,
    step,
)
from geneva_drive.testing import perform_next_step
from tests.children._support import children_of, counters, reload, run_due
from tests.engine._support import history
from tests.support.app import AuditEntry


class CrChild(Workflow):
    may_proceed_without_hero = True

    @step
    def weigh(self):
        if self.child_key == "bad":
            self.cancel()
        if self.child_key == "quiet":
            return None
        return {"kg": self.input["kg"] * 2, "key": self.child_key}

    @step
    def label(self):
        if self.child_key == "slow":
            self.reattempt(wait=timedelta(days=1))
        if self.child_key != "quiet":
            return f"label-{self.child_key}"
        return None


class _Splits(Workflow):
    """Starts a child per key of its class, each with its own input."""

    may_proceed_without_hero = True
    keys: tuple[str, ...] = ("a", "b")

    @step
    def split(self):
        for n, key in enumerate(self.keys):
            self.start_child(CrChild, key=key, input={"kg": n + 1}, allow_multiple=True)

    def _note_results(self):
        self.session.add(AuditEntry(note=repr(sorted(self.child_results().items()))))


class CrParent(_Splits):
    @step(wait_for_children="all")
    def close(self):
        self._note_results()


class CrQuietChild(_Splits):
    keys = ("a", "quiet")

    @step(wait_for_children="all")
    def close(self):
        self._note_results()


class CrTwo(_Splits):
    """Reads the results while a child is still running, and after one was canceled."""

    keys = ("a", "slow", "bad")

    @step(wait_for_children=2, on_exception="skip")
    def close(self):
        self._note_results()

    @step
    def after(self):
        self._note_results()


class CrNoChildren(Workflow):
    may_proceed_without_hero = True

    @step
    def close(self):
        self.session.add(AuditEntry(note=repr(self.child_results())))


_INPUT: list[Any] = []


class CrBadInput(Workflow):
    may_proceed_without_hero = True

    @step(on_exception="pause")
    def split(self):
        self.start_child(CrChild, key="ok", input={"kg": 1})
        self.start_child(CrChild, key="x", input=_INPUT[0])


def _start(session, cls):
    wf = cls.create(session)
    session.commit()
    return wf


def _notes(session):
    session.commit()
    return [n for (n,) in session.query(AuditEntry.note).order_by(AuditEntry.id)]


# -- start_child(input=…) ------------------------------------------------------------------------


def test_a_child_reads_the_input_its_parent_gave_it(gd, session):
    parent = _start(session, CrParent)

    perform_next_step(parent)

    kids = children_of(session, parent)
    assert [(k.child_key, k.input) for k in kids] == [("a", {"kg": 1}), ("b", {"kg": 2})]


def test_a_childs_input_json_cannot_store_is_refused_naming_the_parent_and_step(gd, session):
    _INPUT[:] = [{"when": object()}]
    parent = _start(session, CrBadInput)

    with pytest.raises(
        SerializationError, match=r"CrBadInput id=\d+\.step 'split': start_child\(CrChild"
    ):
        perform_next_step(parent)

    assert children_of(session, parent) == []  # the first child went with the failed step
    assert counters(session, parent) == (0, 0, 0)
    assert history(session, parent)[-1][1] == "failed"


def test_an_oversized_child_input_is_refused_with_the_limit_and_nothing_is_written(gd, session):
    configure(max_value_size=1024)
    _INPUT[:] = [{"blob": "x" * 2000}]
    parent = _start(session, CrBadInput)

    with pytest.raises(
        InputTooLargeError,
        match=r"CrBadInput id=\d+\.step 'split': start_child\(CrChild, key='x'\).*"
        r"max_value_size=1024",
    ):
        perform_next_step(parent)

    assert children_of(session, parent) == []
    assert counters(session, parent) == (0, 0, 0)


def test_start_child_with_input_outside_a_step_is_refused_and_writes_nothing(gd, session):
    parent = _start(session, CrParent)

    with pytest.raises(InvalidStateError, match=r"CrParent id=\d+.*inside a running step"):
        parent.start_child(CrChild, key="x", input={"kg": 1})
    session.rollback()

    assert children_of(session, parent) == []


# -- child_results() -----------------------------------------------------------------------------


def test_child_results_maps_each_key_to_its_childs_last_successful_steps_result(gd, session):
    parent = _start(session, CrParent)

    run_due(session)

    assert reload(session, parent).state == "finished"
    assert _notes(session) == [repr([("a", "label-a"), ("b", "label-b")])]


def test_a_child_whose_last_step_returned_nothing_maps_to_none(gd, session):
    _start(session, CrQuietChild)

    run_due(session)

    assert _notes(session) == [repr([("a", "label-a"), ("quiet", None)])]


def test_running_and_canceled_children_map_to_their_result_so_far_and_none(gd, session):
    parent = _start(session, CrTwo)

    # a finishes, slow waits a day in its second step, bad cancels itself: close's ChildFailed
    # is skipped by its policy, and after reads the results.
    run_due(session)

    assert reload(session, parent).state == "finished"
    slow = {"kg": 4, "key": "slow"}  # its first step's: the last that succeeded so far
    assert _notes(session) == [repr([("a", "label-a"), ("bad", None), ("slow", slow)])]


def test_child_results_of_a_workflow_without_children_is_empty(gd, session):
    _start(session, CrNoChildren)

    run_due(session)

    assert _notes(session) == ["{}"]


def test_child_results_reads_every_child_in_one_statement(gd, session, engine):
    parent = _start(session, CrParent)
    run_due(session)
    reload(session, parent)
    statements: list[str] = []

    def count(conn, cursor, statement, *args):
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        results = parent.child_results()
    finally:
        event.remove(engine, "before_cursor_execute", count)

    assert results == {"a": "label-a", "b": "label-b"}
    assert len(statements) == 1


def test_child_results_outside_a_session_is_refused():
    with pytest.raises(InvalidStateError, match=r"CrParent id=None: .*not attached to a session"):
        CrParent().child_results()

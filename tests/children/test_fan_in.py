"""wait_for_children: the step parks without polling and wakes when enough children ended."""

from __future__ import annotations

from datetime import timedelta

import pytest

from geneva_drive import ChildFailed, StepConfigurationError, Workflow, step
from geneva_drive.testing import perform_next_step
from tests.children._support import children_of, counters, reload, run_due
from tests.engine._support import executions, history
from tests.support.app import AuditEntry


class FiChild(Workflow):
    may_proceed_without_hero = True

    @step
    def work(self):
        if self.child_key == "bad":
            raise RuntimeError("the carrier refused the parcel")
        if self.child_key == "slow":
            self.reattempt(wait=timedelta(days=1))


class _Parent(Workflow):
    """Starts the children its class lists, then closes after them."""

    may_proceed_without_hero = True
    keys: tuple[str, ...] = ("a", "b", "c")

    @step
    def split(self):
        for key in self.keys:
            self.start_child(FiChild, key=key, allow_multiple=True)

    def _note(self):
        self.session.add(
            AuditEntry(
                note=f"{self.current_step_name}:{self.children_ended}/{self.children_started}"
            )
        )


class FiAll(_Parent):
    @step(wait_for_children="all")
    def close(self):
        self._note()


class FiAny(_Parent):
    keys = ("a", "slow")

    @step(wait_for_children="any")
    def close(self):
        self._note()


class FiTwo(_Parent):
    keys = ("a", "b", "slow")

    @step(wait_for_children=2)
    def close(self):
        self._note()


class FiNone(_Parent):
    keys = ()

    @step(wait_for_children="all")
    def close(self):
        self._note()


class FiLate(_Parent):
    """A step between the fan-out and the fan-in: the children end before it is reached."""

    @step(wait=timedelta(hours=1))
    def middle(self):
        pass

    @step(wait_for_children="all")
    def close(self):
        self._note()


class FiFails(_Parent):
    keys = ("a", "bad")

    @step(wait_for_children="all")
    def close(self):
        self._note()


class FiFailsSkips(_Parent):
    keys = ("bad",)

    @step(wait_for_children="all", on_exception="skip")
    def close(self):
        self._note()

    @step
    def after(self):
        self._note()


def _start(session, cls):
    wf = cls.create(session)
    session.commit()
    return wf


def _notes(session):
    session.commit()
    return [n for (n,) in session.query(AuditEntry.note).order_by(AuditEntry.id)]


def test_an_all_step_parks_until_every_child_ended_then_runs(gd, session):
    parent = _start(session, FiAll)
    perform_next_step(parent)  # split
    perform_next_step(parent)  # close: parks

    assert history(session, parent)[-1] == ("close", "waiting", None)
    assert executions(session, parent)[-1].awaiting_signal == "children:all"

    run_due(session)  # the three children, then the woken parent

    assert {k.state for k in children_of(session, parent)} == {"finished"}
    assert _notes(session) == ["close:3/3"]
    assert reload(session, parent).state == "finished"
    assert counters(session, parent) == (3, 3, 0)


def test_children_that_end_before_the_parent_reaches_the_step_count(gd, session, clock):
    parent = _start(session, FiLate)
    perform_next_step(parent)  # split; middle is due in an hour
    run_due(session)  # the children run and end first

    clock.advance(hours=1)
    run_due(session)

    assert _notes(session) == ["close:3/3"]
    # The fan-in step never parked: it found its children ended.
    assert [(name, state) for name, state, _ in history(session, parent)] == [
        ("split", "completed"),
        ("middle", "completed"),
        ("close", "completed"),
    ]


def test_an_any_step_runs_when_the_first_child_ended(gd, session):
    parent = _start(session, FiAny)
    run_due(session)

    assert _notes(session) == ["close:1/2"]
    states = {k.child_key: k.state for k in children_of(session, parent)}
    assert states == {"a": "finished", "slow": "ready"}


def test_a_number_waits_for_that_many_children(gd, session):
    _start(session, FiTwo)
    run_due(session)

    assert _notes(session) == ["close:2/3"]


def test_a_step_waiting_for_all_of_no_children_runs_at_once(gd, session):
    parent = _start(session, FiNone)
    run_due(session)

    assert _notes(session) == ["close:0/0"]
    assert reload(session, parent).state == "finished"


def test_a_canceled_child_raises_child_failed_in_the_waiting_step(gd, session):
    parent = _start(session, FiFails)
    run_due(session)
    bad = next(k for k in children_of(session, parent) if k.child_key == "bad")
    bad.cancel()
    session.commit()
    run_due(session)

    assert _notes(session) == []
    last = executions(session, parent)[-1]
    assert (last.step_name, last.state) == ("close", "failed")
    assert last.error_class_name == "geneva_drive.core.errors.ChildFailed"
    assert f"child FiChild id={bad.id} (key 'bad') ended canceled" in last.error_message
    assert "RuntimeError: the carrier refused the parcel" in last.error_message
    assert reload(session, parent).state == "paused"  # the default policy
    assert counters(session, parent) == (2, 2, 1)


def test_the_parents_exception_policy_decides_what_a_child_failure_does(gd, session):
    parent = _start(session, FiFailsSkips)
    run_due(session)
    (bad,) = children_of(session, parent)
    bad.cancel()
    session.commit()
    run_due(session)

    assert [(n, s, o) for n, s, o in history(session, parent)][-2:] == [
        ("close", "skipped", "skipped"),
        ("after", "completed", "success"),
    ]
    assert reload(session, parent).state == "finished"


def test_child_failed_carries_the_child_its_class_key_and_error(gd, session):
    parent = _start(session, FiFails)
    run_due(session)
    bad = next(k for k in children_of(session, parent) if k.child_key == "bad")
    bad.cancel()
    session.commit()
    reload(session, parent)

    from geneva_drive.engine.children import child_failed

    error = child_failed(session, parent, FiFails.steps.named("close"))

    assert isinstance(error, ChildFailed)
    assert (error.child_id, error.child_class, error.child_key) == (bad.id, "FiChild", "bad")
    assert error.child_error == "RuntimeError: the carrier refused the parcel"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"wait_for_children": "some"}, "takes 'all', 'any' or how many"),
        ({"wait_for_children": 0}, "an int >= 1"),
        ({"wait_for_children": True}, "an int >= 1"),
        ({"wait_for_children": "all", "wait_for": "go"}, "cannot be combined with wait_for="),
    ],
)
def test_a_bad_wait_for_children_is_refused_when_the_class_is_defined(options, expected):
    with pytest.raises(StepConfigurationError, match=rf"FiBad\.step 'close': .*{expected}"):

        class FiBad(Workflow):
            @step(**options)
            def close(self):
                pass

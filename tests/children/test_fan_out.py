"""start_child: a child exists only if its parent's step commits, and once per key."""

from __future__ import annotations

from typing import Any

import pytest

from geneva_drive import InvalidStateError, Workflow, step
from geneva_drive.testing import perform_next_step
from tests.children._support import children_of, counters, reload, run_due
from tests.engine._support import history
from tests.support.app import AuditEntry, Order


class FoChild(Workflow):
    may_proceed_without_hero = True

    @step
    def work(self):
        pass


class FoHeroChild(Workflow):
    @step
    def work(self):
        self.session.add(AuditEntry(order_id=self.hero.id, note=f"child of {self.parent_id}"))


class FoParent(Workflow):
    may_proceed_without_hero = True

    @step
    def split(self):
        for n in range(3):
            self.start_child(FoChild, key=f"part-{n}")


_FAILURES: list[int] = []  # how many more times FoFailsAfterStarting.split fails


class FoFailsAfterStarting(Workflow):
    may_proceed_without_hero = True

    @step(on_exception="reattempt", max_reattempts=3)
    def split(self):
        self.start_child(FoChild, key="only")
        if _FAILURES:
            _FAILURES.pop()
            raise RuntimeError("boom after starting a child")


class FoReattemptsAfterStarting(Workflow):
    may_proceed_without_hero = True

    @step
    def split(self):
        child = self.start_child(FoChild, key="only")
        self.session.add(AuditEntry(note=f"got child {child.id}"))
        if len(self.execution_history) < 2:
            self.reattempt()  # flow control: the step's writes commit, the step runs again


class FoDuplicateKey(Workflow):
    may_proceed_without_hero = True

    @step(on_exception="pause")
    def split(self):
        self.start_child(FoChild, key="same")
        self.start_child(FoChild, key="same")


_BAD_KEY: list[Any] = []


class FoBadKey(Workflow):
    may_proceed_without_hero = True

    @step
    def split(self):
        self.start_child(FoChild, key=_BAD_KEY[0])


class FoWithHero(Workflow):
    @step
    def split(self):
        self.start_child(FoHeroChild, key="h", hero=self.hero)


def _start(session, cls, **kwargs):
    wf = cls.create(session, **kwargs)
    session.commit()
    return wf


def test_children_start_with_the_step_and_know_their_parent_and_key(gd, session):
    parent = _start(session, FoParent)

    perform_next_step(parent)

    kids = children_of(session, parent)
    assert [(k.type, k.child_key, k.parent_id, k.state) for k in kids] == [
        ("FoChild", f"part-{n}", parent.id, "ready") for n in range(3)
    ]
    assert kids[0].parent.id == parent.id
    assert counters(session, parent) == (3, 0, 0)


def test_a_step_that_fails_after_starting_a_child_leaves_no_child(gd, session):
    _FAILURES[:] = [1]
    parent = _start(session, FoFailsAfterStarting)

    perform_next_step(parent, raise_errors=False)

    assert children_of(session, parent) == []
    assert counters(session, parent) == (0, 0, 0)


def test_a_retried_step_that_started_children_starts_them_exactly_once(gd, session, clock):
    _FAILURES[:] = [1, 1]
    parent = _start(session, FoFailsAfterStarting)

    for _ in range(3):  # two failures, then success
        perform_next_step(parent, raise_errors=False)
        clock.advance(hours=1)

    assert [h[1:] for h in history(session, parent)] == [
        ("completed", "reattempted"),
        ("completed", "reattempted"),
        ("completed", "success"),
    ]
    assert [k.child_key for k in children_of(session, parent)] == ["only"]
    assert counters(session, parent) == (1, 0, 0)


def test_a_step_that_runs_again_gets_the_child_it_started_before(gd, session):
    parent = _start(session, FoReattemptsAfterStarting)

    perform_next_step(parent)  # starts the child, then reattempts: its writes commit
    perform_next_step(parent)  # runs again: the same key finds the same child

    (child,) = children_of(session, parent)
    notes = [n for (n,) in session.query(AuditEntry.note).order_by(AuditEntry.id)]
    assert notes == [f"got child {child.id}", f"got child {child.id}"]
    assert counters(session, parent) == (1, 0, 0)
    assert reload(session, parent).state == "finished"


def test_a_duplicate_key_in_one_step_is_refused_naming_it_and_nothing_is_written(gd, session):
    parent = _start(session, FoDuplicateKey)

    with pytest.raises(ValueError, match=r"FoDuplicateKey id=\d+\.step 'split'.*key 'same'"):
        perform_next_step(parent)

    assert children_of(session, parent) == []
    assert counters(session, parent) == (0, 0, 0)
    assert history(session, parent)[-1][1] == "failed"


def test_start_child_outside_a_step_is_refused_and_writes_nothing(gd, session):
    parent = _start(session, FoParent)

    with pytest.raises(InvalidStateError, match=r"FoParent id=\d+.*inside a running step"):
        parent.start_child(FoChild, key="x")
    session.rollback()

    assert children_of(session, parent) == []


@pytest.mark.parametrize(
    ("key", "expected"),
    [("", "non-blank str"), (7, "non-blank str"), ("x" * 256, "at most 255")],
)
def test_a_bad_key_is_refused_naming_the_class_and_step(gd, session, key, expected):
    _BAD_KEY[:] = [key]
    parent = _start(session, FoBadKey)

    with pytest.raises(ValueError, match=rf"FoBadKey id=\d+\.step 'split'.*{expected}"):
        perform_next_step(parent)
    assert children_of(session, parent) == []


def test_a_child_may_have_a_hero_and_run_like_any_workflow(gd, session):
    order = Order()
    session.add(order)
    parent = _start(session, FoWithHero, hero=order)

    run_due(session)

    (child,) = children_of(session, parent)
    assert (child.type, child.hero_id, child.state) == ("FoHeroChild", str(order.id), "finished")
    notes = [n for (n,) in session.query(AuditEntry.note)]
    assert notes == [f"child of {parent.id}"]

"""Successor chains (gem-spec E.1, E.4), signal pins, and the testing helpers (B.13, E.8)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from geneva_drive import Workflow, resumable_step, step
from geneva_drive.testing import (
    assert_cursor,
    assert_step_has_successor,
    perform_next_step,
    run_iterations,
    speedrun,
    speedrun_current_step,
)
from tests.engine._support import current, history
from tests.resumable._support import chain, notes, reload, start
from tests.support.app import AuditEntry

ITEMS = list(range(6))
PAYLOADS: list[Any] = []


@pytest.fixture(autouse=True)
def _clear_payloads() -> None:
    PAYLOADS.clear()


class ResumableChainSignal(Workflow):
    @resumable_step(wait_for="go", max_iterations=2)
    def walk(self, it: Any) -> None:
        PAYLOADS.append(self.received_signal.payload if self.received_signal else None)
        for item in it.iterate_over(ITEMS):
            self.session.add(AuditEntry(order_id=self.hero.id, note=f"item {item}"))

    @step
    def after(self) -> None:
        pass


class ResumableChainLimited(Workflow):
    @resumable_step(max_iterations=2, max_runtime=timedelta(seconds=1))
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            self.session.add(AuditEntry(order_id=self.hero.id, note=f"item {item}"))

    @step
    def after(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="after"))


class ResumableChainSuspends(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            if item in (2, 4) and it.iterations > 0:
                self.suspend(wait=timedelta(days=1))  # once at 2 and once at 4
            self.session.add(AuditEntry(order_id=self.hero.id, note=f"item {item}"))

    @step
    def after(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="after"))


class ResumableChainSkipsTo(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        if it.cursor is None:
            it.skip_to(4, wait=timedelta(days=1))
        for item in it.iterate_over(ITEMS):
            self.session.add(AuditEntry(order_id=self.hero.id, note=f"item {item}"))

    @step
    def after(self) -> None:
        pass


ALL = [f"item {i}" for i in ITEMS]


# -- chains and pins ------------------------------------------------------------------------


def test_a_successor_carries_the_cursor_the_signal_pin_and_its_predecessor(session):
    wf, _ = start(session, ResumableChainSignal)
    wf.signal("go", payload={"batch": 7})
    session.commit()

    perform_next_step(wf)

    first, successor = chain(session, wf, "walk")
    assert first.signal_id is not None
    assert (successor.continues_from_id, successor.signal_id) == (first.id, first.signal_id)
    assert successor.cursor_value == 2


def test_a_continuation_runs_with_its_pinned_signal_without_parking_again(session):
    wf, _ = start(session, ResumableChainSignal)
    wf.signal("go", payload={"batch": 7})
    session.commit()

    for _ in range(4):  # 2 items per execution; the 4th finds nothing left
        perform_next_step(wf)

    # Every execution of the chain received the one signal; none parked waiting for another.
    assert PAYLOADS == [{"batch": 7}] * 4
    assert [e.outcome for e in chain(session, wf, "walk")] == ["continued"] * 3 + ["success"]
    assert notes(session) == ALL


# -- speedrun and friends ------------------------------------------------------------------


def test_speedrun_runs_a_resumable_step_in_one_execution_without_interruption(session):
    wf, _ = start(session, ResumableChainLimited)

    speedrun(wf)

    assert [e.outcome for e in chain(session, wf, "walk")] == ["success"]
    assert notes(session) == [*ALL, "after"]
    assert reload(session, wf).state == "finished"


def test_speedrun_follows_successors_created_by_suspend(session):
    wf, _ = start(session, ResumableChainSuspends)

    speedrun(wf)

    assert [e.outcome for e in chain(session, wf, "walk")] == ["continued", "continued", "success"]
    assert notes(session) == [*ALL, "after"]


def test_speedrun_follows_successors_created_by_skip_to(session):
    wf, _ = start(session, ResumableChainSkipsTo)

    speedrun(wf)

    assert [e.cursor_value for e in chain(session, wf, "walk")] == [4, 6]
    assert notes(session) == ALL[4:]
    assert reload(session, wf).state == "finished"


def test_speedrun_current_step_runs_only_the_current_step_through_its_successors(session):
    wf, _ = start(session, ResumableChainSuspends)

    last = speedrun_current_step(wf)

    assert last is not None
    assert (last.step_name, last.state, last.outcome) == ("walk", "completed", "success")
    assert notes(session) == ALL  # not "after"
    assert history(session, wf)[-1] == ("after", "scheduled", None)


def test_speedrun_current_step_returns_none_when_nothing_is_current(session):
    wf, _ = start(session, ResumableChainLimited)
    speedrun(wf)

    assert speedrun_current_step(wf) is None


def test_run_iterations_runs_one_execution_for_that_many_checkpoints(session):
    wf, _ = start(session, ResumableChainSuspends)

    execution = run_iterations(wf, 1)

    assert (execution.state, execution.outcome, execution.cursor_value) == (
        "completed",
        "continued",
        1,
    )
    assert_cursor(wf, 1)
    assert_step_has_successor(wf, "walk")
    assert notes(session) == ALL[:1]


def test_run_iterations_refuses_when_there_is_no_current_execution(session):
    wf, _ = start(session, ResumableChainLimited)
    speedrun(wf)

    with pytest.raises(
        AssertionError, match=r"ResumableChainLimited id=\d+: no current step execution to run"
    ):
        run_iterations(wf, 1)


def test_assert_cursor_fails_with_both_values(session):
    wf, _ = start(session, ResumableChainLimited)
    run_iterations(wf, 2)

    assert_cursor(wf, 2)
    with pytest.raises(AssertionError, match="expected cursor 3, got 2"):
        assert_cursor(wf, 3)


def test_assert_step_has_successor_fails_when_the_step_completed_without_one(session):
    wf, _ = start(session, ResumableChainLimited)
    speedrun_current_step(wf)

    with pytest.raises(AssertionError, match="no completed execution with a scheduled successor"):
        assert_step_has_successor(wf, "walk")
    assert current(session, wf).step_name == "after"

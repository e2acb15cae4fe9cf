"""Every row of the resumable-step outcome table (gem-spec E.5) and the interruption rules (E.3).

Each step walks ten items and writes one audit row per item, so "every item exactly once"
is checked on the rows the steps committed.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from geneva_drive import ExceptionPolicy, Workflow, resumable_step, step
from geneva_drive.engine.executor import RunOptions, run_execution
from geneva_drive.testing import perform_next_step
from tests.engine._support import current, history
from tests.resumable._support import (
    advance_clock,
    chain,
    notes,
    other_cancel,
    other_pause,
    reload,
    start,
    summary,
)
from tests.support.app import AuditEntry

ITEMS = list(range(10))
ALL_ITEMS = [f"item {i}" for i in ITEMS]


def _write(wf: Workflow, item: Any) -> None:
    wf.session.add(AuditEntry(order_id=wf.hero.id, note=f"item {item}"))


class ResumableOutcomeWalk(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            _write(self, item)

    @step
    def after(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="after"))


class ResumableOutcomeMaxIterations(Workflow):
    @resumable_step(max_iterations=4)
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            _write(self, item)

    @step
    def after(self) -> None:
        pass


class ResumableOutcomeMaxRuntime(Workflow):
    @resumable_step(max_runtime=timedelta(seconds=60))
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            _write(self, item)
            advance_clock(seconds=25)  # each item "takes" 25 s of frozen time


class ResumableOutcomeSkipTo(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        if it.cursor is None:
            it.skip_to(6, wait=timedelta(hours=1))
        for item in it.iterate_over(ITEMS):
            _write(self, item)


class ResumableOutcomeSuspend(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            if item == 3 and not it.resumed:
                self.suspend(wait=timedelta(minutes=10))
            _write(self, item)


class ResumableOutcomeSuspendBatched(Workflow):
    @resumable_step(checkpoint_every=5)
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            if item == 3 and not it.resumed:
                self.suspend()
            _write(self, item)


class ResumableOutcomePause(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            if item == 4 and not it.resumed:
                self.pause()
            _write(self, item)

    @step
    def after(self) -> None:
        pass


class ResumableOutcomePauseThenFailingStep(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            if item == 4 and not it.resumed:
                self.pause()
            _write(self, item)

    @step
    def after(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="after"))
        _fail_once(("after", self.id))


class ResumableOutcomeExternalPause(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            _write(self, item)
            if item == 2 and not it.resumed:
                # Between two checkpoints (no transaction open): an operator pauses.
                other_pause(self.id)


class ResumableOutcomeExternalCancel(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            _write(self, item)
            if item == 2:
                other_cancel(self.id)

    @step
    def after(self) -> None:
        pass


class ResumableOutcomeReattempt(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            if item == 5 and not it.resumed:
                self.reattempt(wait=timedelta(minutes=1))
            _write(self, item)


class ResumableOutcomeRewind(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            if item == 5 and not it.resumed:
                self.reattempt(rewind=True)
            _write(self, item)


FAIL_ONCE: set[Any] = set()


@pytest.fixture(autouse=True)
def _forget_failures() -> None:
    FAIL_ONCE.clear()  # workflow ids repeat from one fresh database to the next


def _fail_once(key: Any) -> None:
    if key not in FAIL_ONCE:
        FAIL_ONCE.add(key)
        raise RuntimeError(f"transient failure at {key!r}")


class ResumableOutcomeRaisesReattempt(Workflow):
    @resumable_step(on_exception="reattempt")
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            _write(self, item)  # written, then rolled back when the item fails
            if item == 6:
                _fail_once(("reattempt", self.id))


class ResumableOutcomeRaisesPause(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            _write(self, item)
            if item == 6:
                _fail_once(("pause", self.id))

    @step
    def after(self) -> None:
        pass


class ResumableOutcomeRaisesTerminalSkip(Workflow):
    @resumable_step(
        on_exception=ExceptionPolicy("reattempt", max_reattempts=1, terminal_action="skip")
    )
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            _write(self, item)
            if item == 6:
                raise RuntimeError("always fails at item 6")

    @step
    def after(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="after"))


class ResumableOutcomeCancel(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            if item == 3:
                self.cancel()
            _write(self, item)

    @step
    def after(self) -> None:
        pass


class ResumableOutcomeSkip(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            if item == 3:
                self.skip()
            _write(self, item)

    @step
    def after(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="after"))


class ResumableOutcomeFinish(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            if item == 3:
                self.finish()
            _write(self, item)

    @step
    def after(self) -> None:
        pass


class ResumableOutcomeSkipIfOnContinuation(Workflow):
    @resumable_step(max_iterations=3, skip_if=lambda wf: wf.hero.status == "skip-the-rest")
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            _write(self, item)

    @step
    def after(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="after"))


class ResumableOutcomeReattemptCap(Workflow):
    # One reattempt allowed in a row; a failure at item 2 and one at item 5 are each
    # retried, because the "continued" completion in between resets the count.
    @resumable_step(max_iterations=2, on_exception="reattempt", max_reattempts=1)
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            if item in (2, 5):
                _fail_once(("cap", self.id, item))
            _write(self, item)


class ResumableOutcomeReattemptCapWithoutProgress(Workflow):
    @resumable_step(on_exception="reattempt", max_reattempts=1)
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            if item in (2, 5):
                _fail_once(("nocap", self.id, item))
            _write(self, item)


def _run_to_end(wf: Workflow, limit: int = 20) -> None:
    """Run step after step, through the failures the test is about, until none is left."""
    for _ in range(limit):
        if perform_next_step(wf, raise_errors=False) is None:
            return
    raise AssertionError("workflow did not settle")


# -- E.5: normal completion ---------------------------------------------------------------


def test_a_resumable_step_that_returns_completes_with_success_and_schedules_the_next_step(
    session,
):
    wf, _ = start(session, ResumableOutcomeWalk)

    perform_next_step(wf)

    assert summary(session, wf) == [
        ("walk", "completed", "success", 10),
        ("after", "scheduled", None, None),
    ]
    assert reload(session, wf).state == "ready"
    assert notes(session) == ALL_ITEMS


# -- E.3 / E.5: interruption ------------------------------------------------------------------


def test_max_iterations_completes_the_execution_as_continued_with_a_successor_due_now(
    session, clock
):
    wf, _ = start(session, ResumableOutcomeMaxIterations)

    perform_next_step(wf)

    first, successor = chain(session, wf, "walk")
    assert (first.state, first.outcome, first.cursor_value) == ("completed", "continued", 4)
    assert successor.state == "scheduled"
    assert successor.continues_from_id == first.id
    assert successor.cursor_value == 4
    assert successor.scheduled_for == clock.now()
    assert reload(session, wf).state == "ready"
    assert reload(session, wf).next_step_name == "walk"
    assert notes(session) == ALL_ITEMS[:4]


def test_max_iterations_counts_per_execution_and_the_chain_does_every_item_once(session):
    wf, _ = start(session, ResumableOutcomeMaxIterations)

    _run_to_end(wf)

    walk = chain(session, wf, "walk")
    assert [(e.outcome, e.cursor_value) for e in walk] == [
        ("continued", 4),
        ("continued", 8),
        ("success", 10),
    ]
    assert [e.continues_from_id for e in walk] == [None, walk[0].id, walk[1].id]
    assert notes(session) == ALL_ITEMS
    assert reload(session, wf).state == "finished"


def test_max_runtime_interrupts_at_the_first_checkpoint_past_the_limit(session):
    wf, _ = start(session, ResumableOutcomeMaxRuntime)

    perform_next_step(wf)

    # 25 s per item: 75 s have passed after item 2, the first checkpoint over 60 s.
    first, successor = chain(session, wf, "walk")
    assert (first.outcome, first.cursor_value) == ("continued", 3)
    assert successor.cursor_value == 3
    assert notes(session) == ALL_ITEMS[:3]


def test_a_worker_shutdown_interrupts_at_the_next_checkpoint(session):
    wf, _ = start(session, ResumableOutcomeWalk)
    execution = current(session, wf)
    checks: list[int] = []

    def should_exit() -> bool:  # the worker is told to stop during the third item
        checks.append(1)
        return len(checks) >= 3

    run_execution(execution.id, options=RunOptions(should_exit=should_exit))

    first, successor = chain(session, wf, "walk")
    assert (first.state, first.outcome, first.cursor_value) == ("completed", "continued", 3)
    assert (successor.state, successor.cursor_value) == ("scheduled", 3)
    assert notes(session) == ALL_ITEMS[:3]


def test_a_non_interruptible_run_ignores_limits_and_shutdown(session):
    wf, _ = start(session, ResumableOutcomeMaxIterations)
    execution = current(session, wf)

    run_execution(execution.id, options=RunOptions(interruptible=False, should_exit=lambda: True))

    assert [e.outcome for e in chain(session, wf, "walk")] == ["success"]
    assert notes(session) == ALL_ITEMS


# -- E.5: skip_to and suspend -----------------------------------------------------------------


def test_skip_to_stores_the_cursor_and_continues_after_the_wait(session, clock):
    wf, _ = start(session, ResumableOutcomeSkipTo)

    perform_next_step(wf)

    first, successor = chain(session, wf, "walk")
    assert (first.state, first.outcome, first.cursor_value) == ("completed", "continued", 6)
    assert successor.cursor_value == 6
    assert successor.scheduled_for == clock.now() + timedelta(hours=1)
    assert reload(session, wf).state == "ready"

    clock.advance(hours=1)
    perform_next_step(wf)
    assert notes(session) == ALL_ITEMS[6:]


def test_suspend_completes_as_continued_and_the_successor_waits(session, clock):
    wf, _ = start(session, ResumableOutcomeSuspend)

    perform_next_step(wf)

    first, successor = chain(session, wf, "walk")
    assert (first.state, first.outcome, first.cursor_value) == ("completed", "continued", 3)
    assert successor.scheduled_for == clock.now() + timedelta(minutes=10)
    assert successor.cursor_value == 3

    _run_to_end(wf)
    assert notes(session) == ALL_ITEMS


def test_flow_control_keeps_the_cursor_of_the_work_it_keeps_with_batched_checkpoints(session):
    # checkpoint_every=5: no checkpoint committed before item 3, but suspend() keeps the
    # writes of items 0..2, so the successor must start at 3, not at the stale stored cursor.
    wf, _ = start(session, ResumableOutcomeSuspendBatched)

    perform_next_step(wf)

    assert chain(session, wf, "walk")[0].cursor_value == 3
    _run_to_end(wf)
    assert notes(session) == ALL_ITEMS


# -- E.5: pause, inside and from outside ------------------------------------------------------


def test_pause_inside_completes_as_workflow_paused_and_resume_continues_from_the_cursor(
    session,
):
    wf, _ = start(session, ResumableOutcomePause)

    perform_next_step(wf)

    assert summary(session, wf) == [("walk", "completed", "workflow_paused", 4)]
    assert reload(session, wf).state == "paused"

    wf.resume()
    session.commit()
    paused, successor = chain(session, wf, "walk")
    assert successor.continues_from_id == paused.id
    assert (successor.state, successor.cursor_value) == ("scheduled", 4)

    _run_to_end(wf)
    assert notes(session) == ALL_ITEMS
    assert reload(session, wf).state == "finished"


def test_resume_ignores_a_paused_resumable_step_that_an_operator_skipped_past(session):
    wf, _ = start(session, ResumableOutcomePauseThenFailingStep)
    perform_next_step(wf)  # walk pauses itself at item 4
    wf.skip()  # the operator gives up on the rest of the walk
    session.commit()
    with pytest.raises(RuntimeError, match="transient failure"):
        perform_next_step(wf)  # "after" fails once: paused by the default policy
    assert reload(session, wf).state == "paused"

    execution = wf.resume()
    session.commit()

    assert execution is not None
    assert execution.step_name == "after"  # not a successor of the abandoned walk
    perform_next_step(wf)
    assert [e.outcome for e in chain(session, wf, "walk")] == ["workflow_paused"]
    assert notes(session) == [*ALL_ITEMS[:4], "after"]
    assert reload(session, wf).state == "finished"


def test_an_external_pause_is_observed_at_the_next_checkpoint_and_resume_continues(session):
    wf, _ = start(session, ResumableOutcomeExternalPause)

    perform_next_step(wf)

    # Paused while item 2 ran: item 2's checkpoint commits it, then sees the pause.
    assert summary(session, wf) == [("walk", "completed", "workflow_paused", 3)]
    assert reload(session, wf).state == "paused"
    assert notes(session) == ALL_ITEMS[:3]

    wf.resume()
    session.commit()
    _run_to_end(wf)
    assert notes(session) == ALL_ITEMS
    assert [e.outcome for e in chain(session, wf, "walk")] == ["workflow_paused", "success"]


def test_an_external_cancel_is_observed_at_the_next_checkpoint(session):
    wf, _ = start(session, ResumableOutcomeExternalCancel)

    perform_next_step(wf)

    assert history(session, wf) == [("walk", "canceled", "canceled")]
    assert reload(session, wf).state == "canceled"
    assert notes(session) == ALL_ITEMS[:3]


# -- E.5: reattempt, with and without rewind --------------------------------------------------


def test_reattempt_completes_as_reattempted_and_the_successor_keeps_the_cursor(session, clock):
    wf, _ = start(session, ResumableOutcomeReattempt)

    perform_next_step(wf)

    first, successor = chain(session, wf, "walk")
    assert (first.state, first.outcome, first.cursor_value) == ("completed", "reattempted", 5)
    assert first.reattempt_reason == "flow_control"
    assert (successor.continues_from_id, successor.cursor_value) == (first.id, 5)
    assert successor.scheduled_for == clock.now() + timedelta(minutes=1)

    _run_to_end(wf)
    assert notes(session) == ALL_ITEMS


def test_reattempt_with_rewind_clears_the_cursor_and_the_successor_starts_over_resumed(session):
    wf, _ = start(session, ResumableOutcomeRewind)

    perform_next_step(wf)

    first, successor = chain(session, wf, "walk")
    assert (first.outcome, first.cursor) == ("reattempted", None)
    assert successor.continues_from_id == first.id
    assert successor.cursor is None
    assert successor.resuming

    _run_to_end(wf)
    assert notes(session) == ALL_ITEMS[:5] + ALL_ITEMS


# -- E.5: exceptions ----------------------------------------------------------------------------


def test_an_exception_with_a_reattempt_policy_reruns_the_interrupted_item_from_the_checkpoint(
    session,
):
    wf, _ = start(session, ResumableOutcomeRaisesReattempt)

    with pytest.raises(RuntimeError, match="transient failure"):
        perform_next_step(wf)

    first, successor = chain(session, wf, "walk")
    assert (first.state, first.outcome, first.cursor_value) == ("completed", "reattempted", 6)
    assert first.reattempt_reason == "exception_policy"
    assert successor.cursor_value == 6
    assert notes(session) == ALL_ITEMS[:6]  # item 6's write rolled back

    _run_to_end(wf)
    assert notes(session) == ALL_ITEMS  # item 6 re-run, once


def test_an_exception_with_the_default_pause_keeps_the_cursor_and_resume_continues(session):
    wf, _ = start(session, ResumableOutcomeRaisesPause)

    with pytest.raises(RuntimeError, match="transient failure"):
        perform_next_step(wf)

    assert summary(session, wf) == [("walk", "failed", "failed", 6)]
    assert reload(session, wf).state == "paused"
    assert reload(session, wf).next_step_name == "walk"

    wf.resume()
    session.commit()
    failed, successor = chain(session, wf, "walk")
    assert (successor.continues_from_id, successor.cursor_value) == (failed.id, 6)

    _run_to_end(wf)
    assert notes(session) == ALL_ITEMS
    assert [e.step_name for e in chain(session, wf, "after")] == ["after"]


def test_an_exception_whose_reattempts_run_out_with_terminal_skip_skips_to_the_next_step(
    session,
):
    wf, _ = start(session, ResumableOutcomeRaisesTerminalSkip)

    _run_to_end(wf)

    assert [(e.state, e.outcome) for e in chain(session, wf, "walk")] == [
        ("completed", "reattempted"),
        ("skipped", "skipped"),
    ]
    assert notes(session) == [*ALL_ITEMS[:6], "after"]
    assert reload(session, wf).state == "finished"


def test_a_continued_completion_resets_the_consecutive_reattempt_count(session):
    wf, _ = start(session, ResumableOutcomeReattemptCap)

    _run_to_end(wf)

    assert reload(session, wf).state == "finished"
    assert notes(session) == ALL_ITEMS
    outcomes = [e.outcome for e in chain(session, wf, "walk")]
    assert outcomes.count("reattempted") == 2


def test_without_a_continued_completion_between_failures_the_reattempt_cap_applies(session):
    wf, _ = start(session, ResumableOutcomeReattemptCapWithoutProgress)

    _run_to_end(wf)

    assert reload(session, wf).state == "paused"
    assert [e.outcome for e in chain(session, wf, "walk")] == ["reattempted", "failed"]


# -- E.5: cancel, skip, finish, skip_if ----------------------------------------------------------


def test_cancel_inside_cancels_the_execution_and_the_workflow(session):
    wf, _ = start(session, ResumableOutcomeCancel)

    perform_next_step(wf)

    assert history(session, wf) == [("walk", "canceled", "canceled")]
    assert reload(session, wf).state == "canceled"


def test_skip_inside_skips_the_execution_and_schedules_the_next_step(session):
    wf, _ = start(session, ResumableOutcomeSkip)

    perform_next_step(wf)

    assert history(session, wf) == [
        ("walk", "skipped", "skipped"),
        ("after", "scheduled", None),
    ]
    assert reload(session, wf).state == "ready"


def test_finish_inside_completes_with_success_and_finishes_the_workflow(session):
    wf, _ = start(session, ResumableOutcomeFinish)

    perform_next_step(wf)

    assert history(session, wf) == [("walk", "completed", "success")]
    assert reload(session, wf).state == "finished"


def test_skip_if_is_checked_again_on_a_continuation(session, clock):
    wf, order = start(session, ResumableOutcomeSkipIfOnContinuation)

    perform_next_step(wf)
    order.status = "skip-the-rest"
    session.commit()
    perform_next_step(wf)

    assert history(session, wf) == [
        ("walk", "completed", "continued"),
        ("walk", "skipped", "skipped"),
        ("after", "scheduled", None),
    ]
    perform_next_step(wf)
    assert notes(session) == [*ALL_ITEMS[:3], "after"]
    assert reload(session, wf).state == "finished"

"""A checkpoint commits the work done since the previous checkpoint together with the cursor."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from geneva_drive import Workflow, resumable_step
from geneva_drive.testing import perform_next_step
from tests.resumable._support import advance_clock, chain, counting_commits, notes, reload, start
from tests.support.app import AuditEntry

TWENTY = list(range(20))


def _walk_twenty(wf: Workflow, it: Any) -> None:
    for item in it.iterate_over(TWENTY):
        wf.session.add(AuditEntry(order_id=wf.hero.id, note=f"item {item}"))
        if wf.hero.status == "fail at 7" and item == 7:
            raise RuntimeError("item 7 is broken")


class ResumableUowPerItem(Workflow):
    walk = resumable_step(_walk_twenty)


class ResumableUowEveryFive(Workflow):
    walk = resumable_step(_walk_twenty, checkpoint_every=5)


class ResumableUowEveryThree(Workflow):
    walk = resumable_step(_walk_twenty, checkpoint_every=3)


class ResumableUowInterval(Workflow):
    @resumable_step(checkpoint_interval=timedelta(seconds=5))
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(TWENTY):
            self.session.add(AuditEntry(order_id=self.hero.id, note=f"item {item}"))
            advance_clock(seconds=1)


def test_a_failure_leaves_exactly_the_rows_of_committed_checkpoints(session):
    wf, _ = start(session, ResumableUowEveryThree, status="fail at 7")

    with pytest.raises(RuntimeError, match="item 7 is broken"):
        perform_next_step(wf)

    # Checkpoints committed after items 2 and 5; items 6 and 7 rolled back with the failure.
    (failed,) = chain(session, wf, "walk")
    assert (failed.state, failed.cursor_value) == ("failed", 6)
    assert notes(session) == [f"item {i}" for i in range(6)]


def test_a_failure_with_per_item_checkpoints_keeps_every_item_before_it(session):
    wf, _ = start(session, ResumableUowPerItem, status="fail at 7")

    with pytest.raises(RuntimeError, match="item 7 is broken"):
        perform_next_step(wf)

    assert chain(session, wf, "walk")[0].cursor_value == 7
    assert notes(session) == [f"item {i}" for i in range(7)]


def test_resume_after_a_failure_continues_from_the_committed_checkpoint_without_duplicates(
    session,
):
    wf, order = start(session, ResumableUowEveryThree, status="fail at 7")
    with pytest.raises(RuntimeError, match="item 7 is broken"):
        perform_next_step(wf)

    order.status = "fixed"
    wf.resume()
    session.commit()
    perform_next_step(wf)

    assert notes(session) == [f"item {i}" for i in TWENTY]
    assert reload(session, wf).state == "finished"


def test_checkpoint_every_changes_the_number_of_commits_but_not_the_result(session):
    per_item, _ = start(session, ResumableUowPerItem)
    with counting_commits() as per_item_commits:
        perform_next_step(per_item)
    per_item_rows = notes(session)

    batched, _ = start(session, ResumableUowEveryFive)
    with counting_commits() as batched_commits:
        perform_next_step(batched)
    batched_rows = notes(session)[len(per_item_rows) :]

    # Same overhead around the body; 20 checkpoint commits against 4 (after items 4, 9, 14, 19).
    assert per_item_commits[0] - batched_commits[0] == 20 - 4
    assert per_item_rows == batched_rows == [f"item {i}" for i in TWENTY]
    assert chain(session, per_item, "walk")[0].cursor_value == 20
    assert chain(session, batched, "walk")[0].cursor_value == 20


def test_checkpoint_interval_commits_when_the_interval_has_passed(session):
    per_item, _ = start(session, ResumableUowPerItem)
    with counting_commits() as per_item_commits:
        perform_next_step(per_item)

    timed, _ = start(session, ResumableUowInterval)
    with counting_commits() as timed_commits:
        perform_next_step(timed)

    # One frozen second per item, a commit every 5 s: after items 4, 9, 14, 19.
    assert per_item_commits[0] - timed_commits[0] == 20 - 4
    assert chain(session, timed, "walk")[0].outcome == "success"

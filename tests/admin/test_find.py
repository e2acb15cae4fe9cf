"""admin.find / count / for_hero: every filter, keyset paging, capped counts, bad input."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from geneva_drive import Workflow, admin
from geneva_drive.admin import AdminInputError, WorkflowFilter
from geneva_drive.testing import perform_next_step
from tests.admin.apps import AdminFlaky, AdminThreeSteps, AdminWaits
from tests.admin.conftest import start
from tests.support.app import Order


def _ids(page: admin.Page) -> list[int]:
    return [item.id for item in page.items]


def test_find_lists_newest_first_and_pages_with_a_cursor_to_the_end(session, clock):
    made = []
    for _ in range(7):
        made.append(start(session, AdminThreeSteps).id)
        clock.advance(seconds=1)

    first = admin.find(session, limit=3)
    second = admin.find(session, limit=3, after=first.next_cursor)
    third = admin.find(session, limit=3, after=second.next_cursor)

    assert _ids(first) + _ids(second) + _ids(third) == made[::-1]
    assert third.next_cursor is None
    oldest = admin.find(session, limit=4, newest_first=False)
    rest = admin.find(session, limit=4, newest_first=False, after=oldest.next_cursor)
    assert _ids(oldest) + _ids(rest) == made
    assert rest.next_cursor is None


def test_workflows_created_in_the_same_instant_page_by_id_without_gaps_or_repeats(session):
    made = [start(session, AdminThreeSteps).id for _ in range(5)]  # the frozen clock: one time

    seen: list[int] = []
    cursor = None
    while True:
        page = admin.find(session, limit=2, after=cursor)
        seen += _ids(page)
        cursor = page.next_cursor
        if cursor is None:
            break

    assert seen == sorted(made, reverse=True)


def test_a_summary_carries_the_rows_plain_values(session, make):
    wf = make(AdminThreeSteps, run=1)

    (item,) = admin.find(session).items

    assert item == admin.WorkflowSummary(
        id=wf.id,
        workflow_type="AdminThreeSteps",
        state="ready",
        hero_type="Order",
        hero_id=wf.hero_id,
        current_step="second",
        next_step="second",
        created_at=wf.created_at,
        transitioned_at=None,
        updated_at=wf.updated_at,
        awaiting_signal=None,
        wait_deadline=None,
        last_error_class=None,
    )


def test_current_step_is_the_step_the_current_step_filter_matches_in_every_state(session, make):
    ready = make(AdminThreeSteps, run=1)  # ready at "second"
    paused = make(AdminFlaky, run=2)  # failed at "charge": paused
    waiting = make(AdminWaits, run=2)  # parked at "approve"
    canceled = make(AdminThreeSteps, run=1)
    admin.cancel(session, canceled.id, actor="ops")  # stopped at "second"
    finished = make(AdminThreeSteps, run="all")
    session.commit()

    steps = {item.id: item.current_step for item in admin.find(session).items}

    assert steps == {
        ready.id: "second",
        paused.id: "charge",
        waiting.id: "approve",
        canceled.id: "second",
        finished.id: None,
    }
    for workflow_id, step_name in steps.items():
        if step_name is not None:
            matching = _ids(admin.find(session, WorkflowFilter(current_step=step_name)))
            assert workflow_id in matching


def test_each_filter_selects_only_its_workflows(session, make, clock):
    plain = make(AdminThreeSteps, run=1)  # ready at "second"
    paused = make(AdminFlaky, run=2)  # failed at "charge": paused
    timed_out = make(AdminFlaky, status="timeout", run=2)
    waiting = make(AdminWaits, run=2)  # parked for "approved"
    clock.advance(hours=1)
    late = make(AdminThreeSteps)
    finished = make(AdminThreeSteps, run="all")
    late_at = late.created_at

    def found(**kwargs):
        return set(_ids(admin.find(session, WorkflowFilter(**kwargs))))

    assert found(workflow_type="AdminFlaky") == {paused.id, timed_out.id}
    assert found(workflow_type=("AdminFlaky", "AdminWaits")) == {
        paused.id,
        timed_out.id,
        waiting.id,
    }
    assert found(state="paused") == {paused.id, timed_out.id}
    assert found(state=("finished", "paused")) == {paused.id, timed_out.id, finished.id}
    assert found(hero_type="Order", hero_id=plain.hero_id) == {plain.id}
    assert found(current_step="charge") == {paused.id, timed_out.id}
    assert found(current_step="second") == {plain.id}
    assert found(error_class="RuntimeError") == {paused.id}
    assert found(error_class="TimeoutError") == {timed_out.id}
    assert found(awaiting_signal="approved") == {waiting.id}
    assert found(awaiting_signal="shipped") == set()
    assert found(created_after=late_at) == {late.id, finished.id}
    assert found(created_before=late_at) == {plain.id, paused.id, timed_out.id, waiting.id}
    assert found(transitioned_after=late_at) == {finished.id}
    assert found(transitioned_before=late_at) == {paused.id, timed_out.id}
    assert found(has_failed_execution=True) == {paused.id, timed_out.id}
    assert found(has_failed_execution=False) == {plain.id, waiting.id, late.id, finished.id}
    assert found(ids=(plain.id, late.id, 999_999)) == {plain.id, late.id}
    assert found(ids=()) == set()
    assert found(state="paused", error_class="TimeoutError") == {timed_out.id}


def test_the_error_filter_reads_the_latest_failure_only(session, make):
    wf = make(AdminFlaky, status="timeout", run=2)  # TimeoutError, paused
    order = session.get(Order, int(wf.hero_id))
    order.status = "declined"
    wf.resume()
    session.commit()
    perform_next_step(wf, raise_errors=False)  # RuntimeError now

    assert _ids(admin.find(session, WorkflowFilter(error_class="RuntimeError"))) == [wf.id]
    assert _ids(admin.find(session, WorkflowFilter(error_class="TimeoutError"))) == []
    (item,) = admin.find(session, WorkflowFilter(ids=(wf.id,))).items
    assert item.last_error_class == "RuntimeError"


def test_waiting_and_failed_filters_count_and_page_each_workflow_once(session, make, clock):
    twice = make(AdminFlaky, status="timeout", run=2)  # two failed executions, below
    order = session.get(Order, int(twice.hero_id))
    order.status = "declined"
    twice.resume()
    session.commit()
    perform_next_step(twice, raise_errors=False)
    clock.advance(seconds=1)
    once = make(AdminFlaky, run=2)
    waiting = []
    for _ in range(3):
        clock.advance(seconds=1)
        waiting.append(make(AdminWaits, run=2).id)

    def every_page(where: WorkflowFilter, newest_first: bool) -> list[int]:
        seen, cursor = [], None
        while True:
            page = admin.find(session, where, limit=1, newest_first=newest_first, after=cursor)
            seen += _ids(page)
            if (cursor := page.next_cursor) is None:
                return seen

    failed = WorkflowFilter(has_failed_execution=True)
    assert admin.count(session, failed) == admin.BoundedCount(2, exact=True)
    assert admin.count(session, failed, cap=1) == admin.BoundedCount(1, exact=False)
    assert every_page(failed, newest_first=True) == [once.id, twice.id]
    assert admin.count(session, replace(failed, hero_id=once.hero_id)).value == 1
    any_signal = WorkflowFilter(awaiting_signal="*")
    assert admin.count(session, any_signal).value == 3
    assert every_page(any_signal, newest_first=False) == waiting
    assert every_page(replace(any_signal, state="ready"), newest_first=True) == waiting[::-1]
    assert admin.count(session, replace(any_signal, state="paused")).value == 0


def test_a_waiting_workflow_shows_the_signal_it_waits_for_and_the_deadline(session, make, clock):
    wf = make(AdminWaits, run=2)

    (item,) = admin.find(session, WorkflowFilter(ids=(wf.id,))).items

    assert item.awaiting_signal == "approved"
    assert item.wait_deadline == clock.now() + timedelta(hours=2)


def test_count_is_exact_below_its_cap_and_says_so_above_it(session):
    for _ in range(5):
        start(session, AdminThreeSteps)

    assert admin.count(session) == admin.BoundedCount(5, exact=True)
    assert admin.count(session, cap=5) == admin.BoundedCount(5, exact=True)
    capped = admin.count(session, cap=3)
    assert capped == admin.BoundedCount(3, exact=False)
    assert str(capped) == "3+"
    assert admin.count(session, WorkflowFilter(state="paused")) == admin.BoundedCount(0, True)


def test_for_hero_and_ongoing_for_find_a_heros_workflows_without_hand_written_queries(
    session, make
):
    wf = make(AdminThreeSteps)
    order = session.get(Order, int(wf.hero_id))
    other = AdminFlaky.create(session, hero=order)
    session.commit()
    done = AdminWaits.create(session, hero=order)
    done.cancel()
    session.commit()

    assert [w.id for w in admin.for_hero(session, order)] == [wf.id, other.id, done.id]
    assert [w.id for w in admin.for_hero(session, order, ongoing_only=True)] == [wf.id, other.id]
    assert [w.id for w in Workflow.ongoing_for(order)] == [wf.id, other.id]
    assert [w.id for w in AdminFlaky.ongoing_for(order)] == [other.id]
    assert isinstance(Workflow.ongoing_for(order)[1], AdminFlaky)
    assert AdminWaits.ongoing_for(order, session) == []


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["stat=paused"], "did you mean 'state'"),
        (["paused"], "expected key=value"),
        (["state=stuck"], "'stuck' is not a workflow state"),
        (["created_after=yesterday"], "expected an ISO 8601 time"),
        (["failed=maybe"], "expected true or false"),
        (["ids=1,x"], "expected workflow ids"),
        (["hero=Order"], "hero= takes Type:id"),
        (["type="], "expected a value"),
    ],
)
def test_parse_refuses_what_it_cannot_use_and_says_how(items, message):
    with pytest.raises(AdminInputError, match=message):
        WorkflowFilter.parse(items)


def test_parse_reads_aliases_several_values_times_and_heroes():
    parsed = WorkflowFilter.parse(
        [
            "type=A,B",
            "state=paused",
            "hero=Order:42",
            "step=charge",
            "error=RuntimeError",
            "signal=approved",
            "created_after=2026-12-01T03:00",
            "transitioned_before=2026-12-01T04:00+01:00",
            "failed=yes",
            "ids=3,4",
        ]
    )

    assert parsed.workflow_type == ("A", "B")
    assert parsed.state == "paused"
    assert (parsed.hero_type, parsed.hero_id) == ("Order", "42")
    assert (parsed.current_step, parsed.error_class, parsed.awaiting_signal) == (
        "charge",
        "RuntimeError",
        "approved",
    )
    assert parsed.created_after is not None and parsed.created_after.utcoffset() == timedelta(0)
    assert parsed.transitioned_before is not None
    assert parsed.transitioned_before.utcoffset() == timedelta(hours=1)
    assert parsed.has_failed_execution is True
    assert parsed.ids == (3, 4)


def test_find_refuses_a_foreign_cursor_a_cursor_of_the_other_order_and_a_bad_limit(session):
    for _ in range(3):
        start(session, AdminThreeSteps)
    cursor = admin.find(session, limit=1).next_cursor

    with pytest.raises(AdminInputError, match="not a cursor this API gave out"):
        admin.find(session, after="garbage!")
    with pytest.raises(AdminInputError, match="keep the order"):
        admin.find(session, after=cursor, newest_first=False)
    with pytest.raises(AdminInputError, match="limit"):
        admin.find(session, limit=0)
    with pytest.raises(AdminInputError, match="timezone-aware"):
        WorkflowFilter(created_after=datetime(2026, 1, 1))

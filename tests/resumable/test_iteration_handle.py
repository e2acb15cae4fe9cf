"""The ``it`` handed to a resumable step: cursor, resumed/advanced, helpers (gem-spec E.2, E.6)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import select

from geneva_drive import CursorTooLargeError, Workflow, resumable_step, step
from geneva_drive.runtime.configure import configured
from geneva_drive.testing import perform_next_step, run_iterations
from tests.resumable._support import chain, notes, reload, start, summary
from tests.support.app import AuditEntry, Order

SEEN: list[tuple[Any, ...]] = []


@pytest.fixture(autouse=True)
def _clear_seen() -> None:
    SEEN.clear()


class ResumableHandleFlags(Workflow):
    @resumable_step(max_iterations=2)
    def walk(self, it: Any) -> None:
        SEEN.append(("start", it.name, it.cursor, it.resumed, it.advanced, it.iterations))
        if it.cursor is not None and it.cursor >= 4:
            return  # nothing left: finish without moving the cursor
        it.advance()
        SEEN.append(("after advance", it.cursor, it.advanced, it.iterations))
        it.advance()


class ResumableHandleAdvanceNeedsInt(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        it.set("abc")
        it.advance()


class ResumableHandleTypedCursor(Workflow):
    @resumable_step(max_iterations=1)
    def walk(self, it: Any) -> None:
        SEEN.append(("cursor", it.cursor))
        if it.cursor is None:
            it.set({"at": datetime(2030, 5, 1, 8, 30, tzinfo=UTC), "total": Decimal("1.50")})


class ResumableHandleIterateOverNeedsIterable(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        for _ in it.iterate_over(42):
            pass


class ResumableHandleRecords(Workflow):
    may_proceed_without_hero = True

    @resumable_step(max_iterations=3)
    def walk(self, it: Any) -> None:
        statement = select(Order).where(Order.status == "todo").order_by(Order.id.desc())
        for order in it.iterate_over_records(statement, batch_size=2):
            self.session.add(AuditEntry(order_id=order.id, note=f"order {order.id}"))


class ResumableHandleRecordsByColumn(Workflow):
    may_proceed_without_hero = True

    @resumable_step
    def walk(self, it: Any) -> None:
        statement = select(Order).where(Order.status != "skip")
        for order in it.iterate_over_records(statement, cursor_column=Order.counter):
            self.session.add(AuditEntry(order_id=order.id, note=f"counter {order.counter}"))


class ResumableHandleColumns(Workflow):
    may_proceed_without_hero = True

    @resumable_step
    def walk(self, it: Any) -> None:
        for row in it.iterate_over_records(select(Order.id, Order.status), batch_size=2):
            self.session.add(AuditEntry(note=f"{row.id}:{row.status}"))


class ResumableHandleBatches(Workflow):
    may_proceed_without_hero = True

    @resumable_step(max_iterations=2)
    def walk(self, it: Any) -> None:
        for batch in it.iterate_over_batches(select(Order), batch_size=3):
            ids = ",".join(str(o.id) for o in batch)
            self.session.add(AuditEntry(note=f"batch {ids}"))


class ResumableHandleHugeCursor(Workflow):
    @resumable_step
    def walk(self, it: Any) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="small"))
        it.set("small")
        self.session.add(AuditEntry(order_id=self.hero.id, note="huge"))
        it.set("x" * 500)

    @step
    def after(self) -> None:
        pass


def test_resumed_advanced_and_iterations_describe_this_execution(session):
    wf, _ = start(session, ResumableHandleFlags)

    perform_next_step(wf)  # cursor None → 2, interrupted at 2 iterations
    perform_next_step(wf)  # 2 → 4
    perform_next_step(wf)  # at 4: returns without advancing

    assert SEEN == [
        ("start", "walk", None, False, False, 0),
        ("after advance", 1, True, 1),
        ("start", "walk", 2, True, False, 0),
        ("after advance", 3, True, 1),
        ("start", "walk", 4, True, False, 0),
    ]
    assert [(e.outcome, e.cursor_value) for e in chain(session, wf, "walk")] == [
        ("continued", 2),
        ("continued", 4),
        ("success", 4),
    ]


def test_advance_refuses_a_cursor_that_is_not_an_integer(session):
    wf, _ = start(session, ResumableHandleAdvanceNeedsInt)

    with pytest.raises(TypeError, match="'abc'"):
        perform_next_step(wf)

    (execution,) = chain(session, wf, "walk")
    assert execution.state == "failed"
    assert execution.error_class_name == "TypeError"
    assert "'abc'" in execution.error_message
    assert execution.cursor_value == "abc"  # the last checkpoint stays


def test_iterate_over_refuses_something_that_is_not_iterable(session):
    wf, _ = start(session, ResumableHandleIterateOverNeedsIterable)

    with pytest.raises(TypeError):
        perform_next_step(wf)

    (execution,) = chain(session, wf, "walk")
    assert (execution.state, execution.error_class_name) == ("failed", "TypeError")


def test_a_typed_cursor_round_trips_to_the_successor(session):
    wf, _ = start(session, ResumableHandleTypedCursor)

    perform_next_step(wf)
    perform_next_step(wf)

    value = {"at": datetime(2030, 5, 1, 8, 30, tzinfo=UTC), "total": Decimal("1.50")}
    assert [("cursor", None), ("cursor", value)] == SEEN


def _orders(session, statuses: list[str], counters: list[int] | None = None) -> list[int]:
    orders = [
        Order(status=s, counter=(counters[i] if counters else 0)) for i, s in enumerate(statuses)
    ]
    session.add_all(orders)
    session.commit()
    return [o.id for o in orders]


def test_iterate_over_records_walks_in_ascending_key_order_and_resumes_after_the_cursor(
    session,
):
    statuses = ["todo", "done", "todo", "todo", "todo", "done", "done", "todo"]
    ids = _orders(session, statuses)
    todo = [i for i, s in zip(ids, statuses, strict=True) if s == "todo"]
    wf = ResumableHandleRecords.create(session)
    session.commit()

    perform_next_step(wf)

    first = chain(session, wf, "walk")[0]
    assert (first.outcome, first.cursor_value) == ("continued", todo[2])
    assert notes(session) == [f"order {i}" for i in todo[:3]]

    perform_next_step(wf)
    # The user's ORDER BY id DESC is replaced by the cursor order; nothing is skipped or repeated.
    assert notes(session) == [f"order {i}" for i in todo]
    assert [e.outcome for e in chain(session, wf, "walk")] == ["continued", "success"]


def test_iterate_over_records_orders_and_resumes_by_the_chosen_cursor_column(session):
    _orders(session, ["a", "b", "skip", "c"], counters=[30, 10, 15, 20])
    wf = ResumableHandleRecordsByColumn.create(session)
    session.commit()

    run_iterations(wf, 2)

    assert chain(session, wf, "walk")[0].cursor_value == 20
    perform_next_step(wf)
    assert notes(session) == ["counter 10", "counter 20", "counter 30"]


def test_iterate_over_records_accepts_a_select_of_columns_and_yields_rows(session):
    ids = _orders(session, ["a", "b", "c"])
    wf = ResumableHandleColumns.create(session)
    session.commit()

    run_iterations(wf, 2)
    perform_next_step(wf)

    assert notes(session) == [f"{ids[0]}:a", f"{ids[1]}:b", f"{ids[2]}:c"]
    assert [e.cursor_value for e in chain(session, wf, "walk")] == [ids[1], ids[2]]


def test_iterate_over_batches_yields_pages_and_checkpoints_each_with_its_last_key(session):
    ids = _orders(session, ["x"] * 7)
    wf = ResumableHandleBatches.create(session)
    session.commit()

    perform_next_step(wf)

    assert chain(session, wf, "walk")[0].cursor_value == ids[5]
    perform_next_step(wf)
    assert notes(session) == [
        f"batch {ids[0]},{ids[1]},{ids[2]}",
        f"batch {ids[3]},{ids[4]},{ids[5]}",
        f"batch {ids[6]}",
    ]


def test_a_cursor_over_max_cursor_size_fails_the_step_through_the_exception_policy(session):
    wf, _ = start(session, ResumableHandleHugeCursor)

    with configured(max_cursor_size=100), pytest.raises(CursorTooLargeError):
        perform_next_step(wf)

    (execution,) = chain(session, wf, "walk")
    assert execution.state == "failed"
    assert execution.error_class_name == f"{CursorTooLargeError.__module__}.CursorTooLargeError"
    assert "max_cursor_size=100" in execution.error_message
    assert "ResumableHandleHugeCursor" in execution.error_message
    assert execution.cursor_value == "small"  # the last checkpoint that fit
    assert reload(session, wf).state == "paused"  # the default policy
    assert notes(session) == ["small"]  # the work after it rolled back with the failure


def test_a_cursor_over_max_cursor_size_can_be_resumed_after_raising_the_limit(session):
    wf, _ = start(session, ResumableHandleHugeCursor)
    with configured(max_cursor_size=100), pytest.raises(CursorTooLargeError):
        perform_next_step(wf)

    wf.resume()
    session.commit()
    perform_next_step(wf)

    assert summary(session, wf)[1][:3] == ("walk", "completed", "success")

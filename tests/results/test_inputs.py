"""A workflow's input: create(input=...), create_many(inputs=[...]) and self.input."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import func, select

from geneva_drive import (
    InputTooLargeError,
    SerializationError,
    Workflow,
    step,
)
from geneva_drive.runtime.configure import configured
from geneva_drive.testing import speedrun
from tests.support.app import AuditEntry, Order

SEEN: list[Any] = []


class Refund(Workflow):
    @step
    def capture(self) -> None:
        SEEN.append(self.input)


class Broadcast(Workflow):
    may_proceed_without_hero = True

    @step
    def send(self) -> None:
        SEEN.append(self.input)


def _workflow_count(session: Any) -> int:
    return int(session.scalar(select(func.count()).select_from(Workflow)))


@pytest.fixture(autouse=True)
def _clear() -> None:
    SEEN.clear()


def test_a_step_reads_the_input_given_to_create_with_its_types(session):
    order = Order()
    session.add(order)
    session.flush()
    due = datetime(2026, 12, 5, 10, 30, tzinfo=UTC)
    wf = Refund.create(
        session, hero=order, input={"amount": Decimal("12.50"), "due": due, "order": order}
    )
    session.commit()

    speedrun(wf)

    (seen,) = SEEN
    assert (seen["amount"], seen["due"]) == (Decimal("12.50"), due)
    assert isinstance(seen["order"], Order) and seen["order"].id == order.id  # loaded in the step
    assert wf.input["order"] is order  # loaded in the workflow's own session


def test_a_workflow_created_without_input_reads_none(session):
    order = Order()
    session.add(order)
    wf = Refund.create(session, hero=order)
    session.commit()

    speedrun(wf)

    assert SEEN == [None]


def test_create_many_gives_each_hero_its_own_input(session):
    orders = [Order() for _ in range(3)]
    session.add_all(orders)
    session.flush()
    result = Refund.create_many(session, heroes=orders, inputs=[{"n": i} for i in range(3)])
    session.commit()

    for (hero, workflow_id), n in zip(result.created, range(3), strict=True):
        wf = session.get(Refund, workflow_id)
        assert wf.hero_id == str(hero.id)
        assert wf.input == {"n": n}


def test_create_many_with_inputs_only_starts_one_hero_less_workflow_per_input_in_order(session):
    inputs = [{"email": "b@example.com"}, {"email": "a@example.com"}, 7, None, [1, 2]]
    result = Broadcast.create_many(session, inputs=inputs)
    session.commit()

    assert [session.get(Broadcast, w).input for w in result.workflow_ids] == inputs


def test_a_hero_listed_twice_keeps_the_input_of_its_first_listing(session):
    order = Order()
    session.add(order)
    session.flush()
    result = Refund.create_many(session, heroes=[order, order], inputs=["first", "second"])
    session.commit()

    assert len(result.created) == 1 and len(result.conflicts) == 1
    assert session.get(Refund, result.workflow_ids[0]).input == "first"


# -- bad input: a clear error, nothing written --------------------------------------------


def test_an_input_json_cannot_store_is_refused_naming_the_class_and_nothing_is_written(session):
    order = Order()
    session.add(order)
    session.flush()

    with pytest.raises(SerializationError, match=r"Refund\.create\(input=\.\.\.\): .*set"):
        Refund.create(session, hero=order, input={"tags": {"a", "b"}})

    assert _workflow_count(session) == 0
    session.add(AuditEntry(note="the transaction is still usable"))
    session.commit()


def test_an_oversized_input_is_refused_with_the_limit_and_nothing_is_written(session):
    order = Order()
    session.add(order)
    session.flush()

    with pytest.raises(InputTooLargeError) as refused:
        Refund.create(session, hero=order, input="x" * (64 * 1024))

    message = str(refused.value)
    assert "Refund.create(input=...)" in message
    assert "max_value_size=65536" in message
    assert _workflow_count(session) == 0


def test_the_input_limit_is_configurable(gd, session):
    order = Order()
    session.add(order)
    session.flush()

    with configured(max_value_size=100), pytest.raises(InputTooLargeError, match="=100"):
        Refund.create(session, hero=order, input="x" * 200)
    with configured(max_value_size=None):
        Refund.create(session, hero=order, input="x" * (100 * 1024))
    session.commit()
    assert _workflow_count(session) == 1


def test_one_bad_input_among_many_refuses_the_whole_call_naming_its_index(session):
    orders = [Order() for _ in range(3)]
    session.add_all(orders)
    session.flush()

    with pytest.raises(SerializationError, match=r"Refund\.create_many\(inputs\[1\]\)"):
        Refund.create_many(session, heroes=orders, inputs=[1, object(), 3])

    assert _workflow_count(session) == 0


@pytest.mark.parametrize(
    ("inputs", "error", "match"),
    [
        ([1, 2], ValueError, "got 2 inputs for 3 workflows"),
        ({"a": 1}, TypeError, "expected a list with one input per workflow"),
    ],
)
def test_inputs_that_do_not_match_the_heroes_are_refused(session, inputs, error, match):
    orders = [Order() for _ in range(3)]
    session.add_all(orders)
    session.flush()

    with pytest.raises(error, match=match):
        Refund.create_many(session, heroes=orders, inputs=inputs)

    assert _workflow_count(session) == 0


# -- write_metadata: held to the same limit -------------------------------------------------


class Noter(Workflow):
    @step
    def note(self) -> None:
        self.write_metadata("blob", "x" * (40 * 1024))
        self.write_metadata("more", "y" * (40 * 1024))  # the document would be ~80 KiB


def test_write_metadata_refuses_to_grow_the_metadata_past_the_limit_and_the_step_fails(session):
    order = Order()
    session.add(order)
    wf = Noter.create(session, hero=order)
    session.commit()

    speedrun(wf, raise_errors=False)

    session.refresh(wf)
    (row,) = wf.execution_history
    assert row.error_class_name == "geneva_drive.core.errors.MetadataTooLargeError"
    assert "write_metadata('more')" in (row.error_message or "")
    assert "max_value_size=65536" in (row.error_message or "")
    assert wf.read_metadata("blob") is None  # the step's writes rolled back with it

"""Step results: stored on the successful execution, read with result_of()."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from geneva_drive import (
    ExceptionPolicy,
    ResultTooLargeError,
    SerializationError,
    Workflow,
    admin,
    step,
)
from geneva_drive.storage import queries
from geneva_drive.testing import speedrun
from tests.engine._support import executions
from tests.support.app import AuditEntry, Order

READ: list[Any] = []


class Capture(Workflow):
    @step
    def capture(self) -> dict[str, Any]:
        return {"payment_ref": f"ref-{self.hero.id}", "cents": 1250}

    @step
    def notify(self) -> None:
        READ.append(self.result_of("capture")["payment_ref"])

    @step
    def done(self) -> str:
        return "ok"


class Flaky(Workflow):
    exception_policies = [ExceptionPolicy("reattempt", matching=ConnectionError, max_reattempts=3)]

    @step
    def fetch(self) -> int:
        READ.append("fetch")
        if len(READ) == 1:
            raise ConnectionError("gateway timed out")
        return len(READ)


class Rerun(Workflow):
    @step
    def count(self) -> int:
        READ.append("count")
        return len(READ)

    @step
    def hold(self) -> None:
        self.pause()


class NotJson(Workflow):
    @step
    def fetch(self) -> Any:
        self.session.add(AuditEntry(order_id=self.hero.id, note="written by the step"))
        return {"when": object()}


class TooBig(Workflow):
    @step
    def fetch(self) -> str:
        return "x" * (64 * 1024)


class AsksTooEarly(Workflow):
    @step
    def first(self) -> None:
        self.result_of("second")

    @step
    def second(self) -> int:
        return 2


@pytest.fixture(autouse=True)
def _clear() -> None:
    READ.clear()


def _order(session: Any) -> Order:
    order = Order()
    session.add(order)
    session.flush()
    return order


def test_a_later_step_reads_what_an_earlier_step_returned(session):
    order = _order(session)
    wf = Capture.create(session, hero=order)
    session.commit()

    speedrun(wf)

    assert [f"ref-{order.id}"] == READ
    rows = executions(session, wf)
    assert [e.result for e in rows] == [
        {"payment_ref": f"ref-{order.id}", "cents": 1250},
        None,
        "ok",
    ]
    assert wf.result_of("done") == "ok"
    assert wf.result_of("notify") is None  # it ran and returned nothing


def test_result_of_a_step_without_a_successful_run_names_it_and_the_steps_with_results(session):
    wf = Capture.create(session, hero=_order(session))
    session.commit()
    speedrun(wf)

    with pytest.raises(KeyError) as missing:
        wf.result_of("refund")

    message = str(missing.value)
    assert "result_of('refund')" in message
    assert "steps with results: capture, notify, done" in message


def test_result_of_a_step_that_has_not_run_yet_is_a_key_error_in_the_step(session):
    wf = AsksTooEarly.create(session, hero=_order(session))
    session.commit()

    speedrun(wf, raise_errors=False)

    rows = executions(session, wf)
    assert rows[0].error_class_name == "KeyError"
    assert "step 'second' has no successful execution" in rows[0].error_message
    assert "steps with results: none" in rows[0].error_message


def test_a_reattempted_step_keeps_its_result_on_the_attempt_that_succeeded(session):
    wf = Flaky.create(session, hero=_order(session))
    session.commit()

    speedrun(wf, raise_errors=False)

    rows = executions(session, wf)
    assert [(e.outcome, e.result) for e in rows] == [("reattempted", None), ("success", 2)]
    assert wf.result_of("fetch") == 2


def test_running_a_step_again_adds_a_result_and_overwrites_none(session):
    wf = Rerun.create(session, hero=_order(session))
    session.commit()
    speedrun(wf)

    admin.resume_at(session, wf.id, "count", actor="test")
    session.commit()
    speedrun(wf)

    rows = [e for e in executions(session, wf) if e.step_name == "count"]
    assert [e.result for e in rows] == [1, 2]
    assert wf.result_of("count") == 2


def test_a_result_json_cannot_store_fails_the_step_naming_it_and_rolls_back_its_writes(session):
    order = _order(session)
    wf = NotJson.create(session, hero=order)
    session.commit()

    speedrun(wf, raise_errors=False)

    (row,) = executions(session, wf)
    assert (row.state, row.outcome, row.result_json) == ("failed", "failed", None)
    assert row.error_class_name == "geneva_drive.core.errors.SerializationError"
    assert f"NotJson.step 'fetch' (workflow id={wf.id}) returned a value" in row.error_message
    assert session.scalars(select(AuditEntry)).all() == []


def test_an_oversized_result_fails_the_step_with_the_limit(session):
    wf = TooBig.create(session, hero=_order(session))
    session.commit()

    with pytest.raises(ResultTooLargeError, match=r"TooBig.step 'fetch'.*max_value_size=65536"):
        speedrun(wf)

    (row,) = executions(session, wf)
    assert (row.state, row.result_json) == ("failed", None)


def test_the_last_successful_steps_result_is_read_for_many_workflows_at_once(session):
    orders = [_order(session) for _ in range(3)]
    finished = Capture.create(session, hero=orders[0])
    started = Capture.create(session, hero=orders[1])
    untouched = Capture.create(session, hero=orders[2])
    session.commit()
    speedrun(finished)
    from geneva_drive.testing import perform_next_step

    perform_next_step(started)

    found = queries.last_step_results(session, [finished.id, started.id, untouched.id])

    assert found == {
        finished.id: "ok",
        started.id: {"payment_ref": f"ref-{orders[1].id}", "cents": 1250},
    }
    assert queries.last_step_result(session, untouched.id) is None


def test_serialization_errors_are_what_a_bad_result_raises():
    assert issubclass(ResultTooLargeError, Exception)
    assert issubclass(SerializationError, Exception)

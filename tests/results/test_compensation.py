"""Compensation (sagas): a canceled workflow undoes its succeeded steps, newest first, each as
an execution of its own, and ends canceled after the last one."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from geneva_drive import ExceptionPolicy, StepConfigurationError, Workflow, admin, step
from geneva_drive.testing import perform_next_step, run_due, speedrun
from tests.engine._support import executions, history, load_elsewhere, other_session, reload
from tests.support.app import Order

RAN: list[str] = []
CANCEL_DURING_REFUND: set[int] = set()  # workflow ids (read without a query: SQLite's lock)


def _operator(workflow_id: int, verb: str) -> None:
    """What an operator does from another process while a step runs."""
    with other_session() as s:
        getattr(load_elsewhere(s, workflow_id), verb)()
        s.commit()


class OrderSaga(Workflow):
    def cancel_if(self) -> bool:
        return self.hero.canceled

    @step(compensate="release_stock")
    def reserve_stock(self) -> dict[str, str]:
        RAN.append("reserve_stock")
        return {"reservation": f"r-{self.hero.id}"}

    @step
    def note(self) -> None:  # nothing to undo
        RAN.append("note")

    @step(compensate="refund_payment")
    def charge(self) -> None:
        RAN.append("charge")
        if self.hero.status == "declined":
            raise PermissionError("card declined")
        if self.hero.status == "cancel inside":
            self.cancel()

    @step(wait_for="shipped", timeout=timedelta(days=2), on_timeout="cancel")
    def ship(self) -> None:
        RAN.append("ship")

    def release_stock(self) -> None:
        RAN.append(f"release_stock {self.result_of('reserve_stock')['reservation']}")
        if self.hero.status == "release fails" and RAN.count("release_stock failed") == 0:
            RAN.append("release_stock failed")
            raise ConnectionError("warehouse unreachable")

    def refund_payment(self) -> None:
        if self.id in CANCEL_DURING_REFUND:
            _operator(self.id, "cancel")
        RAN.append("refund_payment")


class PolicySaga(OrderSaga):
    exception_policies = [ExceptionPolicy("cancel", matching=PermissionError)]


@pytest.fixture(autouse=True)
def _clear() -> None:
    RAN.clear()
    CANCEL_DURING_REFUND.clear()


def _start(session: Any, cls: type[Workflow] = OrderSaga, **hero: Any) -> Any:
    order = Order(**hero)
    session.add(order)
    wf = cls.create(session, hero=order)
    session.commit()
    return wf


def _until_parked(wf: Any) -> None:
    for _ in range(4):  # reserve_stock, note, charge, then ship parks
        perform_next_step(wf, raise_errors=False)


UNDONE = [("refund_payment", "completed", "success"), ("release_stock", "completed", "success")]
DONE = [
    ("reserve_stock", "completed", "success"),
    ("note", "completed", "success"),
    ("charge", "completed", "success"),
]


def test_canceling_runs_the_compensations_newest_first_then_ends_canceled(session):
    wf = _start(session)
    _until_parked(wf)

    wf.cancel()
    session.commit()

    assert reload(session, wf).state == "ready"  # compensating: not canceled yet
    assert wf.next_step_name == "refund_payment"
    assert wf.read_metadata("compensation") == {"step": "charge", "done": []}
    speedrun(wf)
    assert RAN[-2:] == ["refund_payment", f"release_stock r-{wf.hero_id}"]
    assert [(e.step_name, e.state, e.outcome) for e in reload(session, wf).execution_history] == [
        *DONE,
        ("ship", "canceled", "canceled"),
        *UNDONE,
    ]
    assert reload(session, wf).state == "canceled"
    rows = executions(session, wf)
    assert [r.read_metadata("compensates") for r in rows[-2:]] == ["charge", "reserve_stock"]


def test_a_workflow_canceled_before_any_compensated_step_succeeded_ends_canceled_at_once(session):
    wf = _start(session)

    wf.cancel()
    session.commit()

    assert reload(session, wf).state == "canceled"
    assert history(session, wf) == [("reserve_stock", "canceled", "canceled")]


def test_only_the_steps_that_succeeded_are_compensated(session):
    wf = _start(session)
    perform_next_step(wf)  # reserve_stock

    wf.cancel()
    session.commit()
    speedrun(wf)

    assert ["reserve_stock", f"release_stock r-{wf.hero_id}"] == RAN
    assert reload(session, wf).state == "canceled"


def test_self_cancel_in_a_step_compensates_the_steps_before_it(session):
    wf = _start(session, status="cancel inside")

    speedrun(wf)

    assert history(session, wf)[-2:] == [
        ("charge", "canceled", "canceled"),
        ("release_stock", "completed", "success"),
    ]
    assert reload(session, wf).state == "canceled"


def test_an_exception_policy_that_cancels_compensates(session):
    wf = _start(session, PolicySaga, status="declined")

    speedrun(wf, raise_errors=False)

    assert history(session, wf)[-2:] == [
        ("charge", "failed", "canceled"),
        ("release_stock", "completed", "success"),
    ]
    assert reload(session, wf).state == "canceled"


def test_cancel_if_compensates_and_is_not_asked_again_before_the_compensations(session):
    wf = _start(session)
    _until_parked(wf)
    wf.hero.canceled = True
    session.commit()
    wf.signal("shipped")
    session.commit()

    speedrun(wf)

    assert history(session, wf)[-3:] == [("ship", "canceled", "canceled"), *UNDONE]
    assert reload(session, wf).state == "canceled"


def test_a_signal_timeout_that_cancels_compensates(session, clock):
    wf = _start(session)
    _until_parked(wf)

    clock.advance(days=3)
    run_due(wf)

    assert [h[0] for h in history(session, wf)][-2:] == ["refund_payment", "release_stock"]
    assert reload(session, wf).state == "canceled"


class CanceledMidStep(OrderSaga):
    @step(compensate="refund_payment", after_step="note")
    def pay(self) -> None:
        _operator(self.id, "cancel")  # before any statement of the step's (SQLite's lock)
        RAN.append("pay")


def test_canceling_a_performing_workflow_compensates_the_running_step_too(session):
    wf = _start(session, CanceledMidStep)

    speedrun(wf)

    assert RAN[-2:] == ["refund_payment", f"release_stock r-{wf.hero_id}"]
    assert ("pay", "completed", "success") in history(session, wf)
    assert reload(session, wf).state == "canceled"


# -- a failed compensation, an operator, a cancel that arrives meanwhile ------------------


def test_a_failed_compensation_pauses_and_an_operator_retries_it(session):
    wf = _start(session, status="release fails")
    perform_next_step(wf)
    wf.cancel()
    session.commit()

    speedrun(wf, raise_errors=False)

    assert reload(session, wf).state == "paused"
    failed = executions(session, wf)[-1]
    assert (failed.step_name, failed.state, failed.error_class_name) == (
        "release_stock",
        "failed",
        "ConnectionError",
    )
    timeline = admin.show(session, wf.id)
    assert timeline.executions[-1].error_message == "warehouse unreachable"

    admin.resume(session, wf.id, actor="ops", reason="warehouse is back")
    session.commit()
    speedrun(wf)

    assert history(session, wf)[-2:] == [
        ("release_stock", "failed", "failed"),
        ("release_stock", "completed", "success"),
    ]
    assert reload(session, wf).state == "canceled"


def test_skipping_a_failed_compensation_moves_on_to_the_next(session):
    wf = _start(session, status="release fails")
    _until_parked(wf)
    wf.cancel()
    session.commit()
    speedrun(wf, raise_errors=False)  # refund_payment, then release_stock fails

    admin.skip(session, wf.id, actor="ops", reason="released by hand")
    session.commit()

    assert reload(session, wf).state == "canceled"
    assert wf.read_metadata("compensation")["done"] == ["charge", "reserve_stock"]


def test_a_cancel_arriving_while_a_compensation_runs_changes_nothing(session):
    wf = _start(session)
    CANCEL_DURING_REFUND.add(wf.id)
    _until_parked(wf)
    wf.cancel()
    session.commit()

    speedrun(wf)

    assert RAN.count("refund_payment") == 1
    assert RAN.count(f"release_stock r-{wf.hero_id}") == 1
    assert history(session, wf)[-2:] == UNDONE
    assert reload(session, wf).state == "canceled"


def test_a_second_cancel_while_compensating_changes_nothing(session):
    wf = _start(session)
    _until_parked(wf)
    wf.cancel()
    session.commit()
    before = history(session, wf)

    wf.cancel()
    session.commit()

    assert history(session, wf) == before
    assert reload(session, wf).next_step_name == "refund_payment"


# -- bad definitions --------------------------------------------------------------------


def test_compensate_naming_no_method_is_refused_at_class_definition():
    with pytest.raises(StepConfigurationError) as refused:

        class Typo(Workflow):
            @step(compensate="release_stok")
            def reserve(self) -> None:
                pass

            def release_stock(self) -> None:
                pass

    message = str(refused.value)
    assert "Typo.step 'reserve'" in message
    assert "compensate='release_stok' names no method of Typo" in message
    assert "did you mean 'release_stock'?" in message


def test_compensate_naming_a_step_is_refused(session):
    with pytest.raises(StepConfigurationError, match="names a step of StepAsUndo"):

        class StepAsUndo(Workflow):
            @step(compensate="undo")
            def do(self) -> None:
                pass

            @step
            def undo(self) -> None:
                pass

    assert session.scalar(select(func.count()).select_from(Workflow)) == 0


def test_compensate_must_be_a_method_name():
    with pytest.raises(StepConfigurationError, match="compensate= takes the name of a method"):

        class NotAName(Workflow):
            @step(compensate=print)
            def do(self) -> None:
                pass


class SharedUndo(Workflow):
    @step(compensate="undo")
    def first(self) -> None:
        pass

    @step(compensate="undo")
    def second(self) -> None:
        pass

    @step(wait_for="never")
    def park(self) -> None:
        pass

    async def undo(self) -> None:  # an async def compensation is awaited like an async step
        RAN.append(f"undo {self.read_metadata('compensation')['step']}")


def test_a_method_named_by_two_steps_runs_once_for_each_newest_first(session):
    wf = _start(session, SharedUndo)
    for _ in range(3):
        perform_next_step(wf)
    wf.cancel()
    session.commit()

    speedrun(wf)

    assert RAN == ["undo second", "undo first"]
    assert reload(session, wf).state == "canceled"


# -- what an operator sees ----------------------------------------------------------------


def test_show_the_cli_and_the_dashboard_say_which_step_is_being_compensated(
    session, gd, installed_database_url
):
    from starlette.testclient import TestClient

    from geneva_drive.dashboard import create_app
    from tests.ops_cli._support import invoke

    wf = _start(session, status="release fails")
    perform_next_step(wf)
    wf.cancel()
    session.commit()
    speedrun(wf, raise_errors=False)  # release_stock fails: paused at it

    assert admin.show(session, wf.id).compensating == "reserve_stock"
    out = invoke(installed_database_url, "show", str(wf.id)).stdout
    assert "canceling: compensating step 'reserve_stock'" in out
    with TestClient(create_app(engine=gd.engine, clock=gd.clock)) as client:
        html = client.get(f"/workflows/{wf.id}").text
    assert "data-compensating" in html and "<strong>reserve_stock</strong>" in html


def test_resume_at_is_refused_while_compensating_and_nothing_changes(session):
    wf = _start(session, status="release fails")
    perform_next_step(wf)
    wf.cancel()
    session.commit()
    speedrun(wf, raise_errors=False)
    before = history(session, wf)

    with pytest.raises(admin.AdminRefused, match="being canceled and runs its compensations"):
        admin.resume_at(session, wf.id, "note", actor="ops")
    session.rollback()

    assert history(session, wf) == before
    assert reload(session, wf).state == "paused"

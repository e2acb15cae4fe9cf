"""The matcher protocol (``matches``, and ``names`` to say which signal names it accepts), and
the refusal of a signal no step of the workflow's class waits for."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

from geneva_drive import StepConfigurationError, UnknownSignal, Workflow, admin, step
from geneva_drive.admin import WorkflowFilter
from geneva_drive.testing import assert_waiting_for_signal, perform_next_step
from tests.engine._support import current
from tests.signals._support import notes, signals_of, start
from tests.support.app import AuditEntry


def _note(workflow: Workflow, text: str) -> None:
    workflow.session.add(AuditEntry(order_id=workflow.hero.id, note=text))


class _Anything:
    """The README's "any object with matches(signal)": no ``name``, no ``names``."""

    def matches(self, signal: Any) -> bool:
        return signal.name.startswith("decision_")


class _EitherDecision:
    def __init__(self) -> None:
        self.names = ("approved", "auto_approved")

    def matches(self, signal: Any) -> bool:
        return signal.name in self.names


class SigProtoAnything(Workflow):
    @step(wait_for=_Anything())
    def decide(self) -> None:
        _note(self, f"decided by {self.received_signal.name}")


class SigProtoEither(Workflow):
    @step(wait_for=_EitherDecision())
    def decide(self) -> None:
        _note(self, f"decided by {self.received_signal.name}")


class SigProtoPayment(Workflow):
    @step(wait_for="payment_confirmed")
    def capture(self) -> None:
        pass

    @step(wait_for="refund_requested")
    def refund(self) -> None:
        pass

    @step(wait_for="pay_later")
    def remind(self) -> None:
        pass


class SigProtoNoWaits(Workflow):
    @step
    def only(self) -> None:
        pass


# -- the matcher protocol ------------------------------------------------------------------


def test_a_step_waiting_on_an_object_with_matches_only_parks_for_any_name_and_wakes(session):
    wf = start(session, SigProtoAnything)

    perform_next_step(wf)  # parked: it used to fail here, reading matcher.name
    session.commit()
    execution = current(session, wf)
    parked = (execution.state, execution.awaiting_signal)
    waits = admin.show(session, wf.id).awaiting_signal
    wf.signal("decision_yes")  # any name may be one it takes: none is refused
    session.commit()
    perform_next_step(wf)

    assert (*parked, waits) == ("waiting", "*", "*")
    assert notes(session, wf) == ["decided by decision_yes"]


def test_a_matcher_with_names_waits_for_them_all_and_takes_any_of_them(session):
    wf = start(session, SigProtoEither)
    perform_next_step(wf)
    session.commit()

    waits = admin.show(session, wf.id).awaiting_signal
    found = admin.find(session, WorkflowFilter(awaiting_signal="approved | auto_approved"))
    assert_waiting_for_signal(wf, "auto_approved")
    wf.signal("auto_approved")
    session.commit()
    perform_next_step(wf)

    assert waits == "approved | auto_approved"
    assert [item.id for item in found.items] == [wf.id]
    assert notes(session, wf) == ["decided by auto_approved"]


@pytest.mark.parametrize(
    "names",
    ["approved", (), ("approved", ""), ("approved", 7), 42],
    ids=["a-str", "empty", "blank", "not-a-str", "not-a-collection"],
)
def test_a_matcher_whose_names_are_not_signal_names_is_refused_at_class_definition(names):
    class Bad:
        def matches(self, signal: Any) -> bool:
            return True

    matcher = Bad()
    matcher.names = names  # type: ignore[attr-defined]

    with pytest.raises(StepConfigurationError) as refused:

        class SigProtoBadNames(Workflow):
            @step(wait_for=matcher)
            def decide(self) -> None:
                pass

    message = str(refused.value)
    assert "SigProtoBadNames.step 'decide'" in message
    assert "names=" in message and "e.g. names = ('approved', 'rejected')" in message


# -- a signal no step waits for ------------------------------------------------------------


def test_a_misspelt_signal_is_refused_naming_the_class_and_its_signals_closest_first(session, gd):
    wf = start(session, SigProtoPayment)
    statements: list[str] = []

    def record(*args: Any) -> None:
        statements.append(args[2])

    event.listen(gd.engine, "before_cursor_execute", record)
    try:
        with pytest.raises(UnknownSignal) as refused:
            wf.signal("payment_confirmd", payload={"amount": 5})
    finally:
        event.remove(gd.engine, "before_cursor_execute", record)

    message = str(refused.value)
    assert f"SigProtoPayment id={wf.id}: signal 'payment_confirmd'" in message
    assert "no step of SigProtoPayment waits for it" in message
    assert "'payment_confirmed', 'pay_later', 'refund_requested'" in message
    assert "allow_unknown=True" in message
    assert isinstance(refused.value, ValueError)  # as the signal path's other bad input
    assert statements == []  # refused before any SQL
    assert signals_of(session, wf) == []


def test_allow_unknown_stores_a_signal_for_a_step_not_deployed_yet(session):
    wf = start(session, SigProtoPayment)

    wf.signal("chargeback_opened", allow_unknown=True)
    session.commit()

    assert [(s.name, s.state) for s in signals_of(session, wf)] == [
        ("chargeback_opened", "pending")
    ]


def test_a_class_whose_steps_wait_for_no_signal_refuses_every_signal(session):
    wf = start(session, SigProtoNoWaits)

    with pytest.raises(UnknownSignal, match="no step of SigProtoNoWaits waits for a signal"):
        wf.signal("anything")


def test_names_limit_what_a_class_accepts_and_a_matcher_without_them_accepts_any(session):
    either = start(session, SigProtoEither)
    anything = start(session, SigProtoAnything)

    with pytest.raises(UnknownSignal, match="its steps wait for 'approved', 'auto_approved'"):
        either.signal("aproved")
    anything.signal("whatever")
    session.commit()

    assert [s.name for s in signals_of(session, anything)] == ["whatever"]


def test_the_admin_signal_refuses_an_unknown_name_as_bad_input_and_writes_nothing(session):
    wf = start(session, SigProtoPayment)

    with pytest.raises(admin.AdminInputError, match="its steps wait for 'payment_confirmed'"):
        admin.signal(session, wf.id, "payment_confirmd", actor="ops")
    session.rollback()
    admin.signal(session, wf.id, "chargeback_opened", actor="ops", allow_unknown=True)
    session.commit()

    assert [s.name for s in signals_of(session, wf)] == ["chargeback_opened"]
    assert [a.action for a in admin.show(session, wf.id).actions] == ["signal"]


def test_a_bulk_signal_dry_run_refuses_an_unknown_name_per_workflow(session, gd):
    wf = start(session, SigProtoPayment)
    where = WorkflowFilter(ids=(wf.id,))

    preview = admin.bulk(
        gd.engine, "signal", where, actor="ops", dry_run=True, name="payment_confirmd"
    )
    allowed = admin.bulk(
        gd.engine,
        "signal",
        where,
        actor="ops",
        dry_run=True,
        name="payment_confirmd",
        allow_unknown=True,
    )

    ((refused_id, why),) = preview.refused
    assert refused_id == wf.id and "its steps wait for 'payment_confirmed'" in why
    assert allowed.changed == (wf.id,)

"""Mapped instances in payloads are stored as references and loaded lazily."""

from __future__ import annotations

import json
import uuid

import pytest

from geneva_drive import SerializationError, Workflow, step
from geneva_drive.definition.steps import SignalMatcher
from geneva_drive.storage.serialization import Reference, decode, decoding_session, encode
from tests.signals._support import drive, notes, start
from tests.support.app import Account, AuditEntry, Device, Order


def test_a_mapped_instance_is_stored_as_its_class_name_and_primary_key(session):
    order = Order()
    session.add(order)
    session.flush()

    assert encode({"order": order}) == {"order": {"__gd__": ["record", "Order", order.id]}}


def test_a_reference_decodes_to_the_instance_with_a_session_and_lazily_without(session):
    order, account, device = Order(), Account(id="acc-1"), Device(id=uuid.uuid4())
    session.add_all([order, account, device])
    session.commit()
    stored = json.loads(json.dumps(encode([order, account, device])))

    lazy = decode(stored)
    loaded = decode(stored, session=session)
    with decoding_session(session):
        ambient = decode(stored)

    assert lazy == [
        Reference("Order", order.id),
        Reference("Account", "acc-1"),
        Reference("Device", device.id),
    ]
    assert loaded == [order, account, device]
    assert ambient == [order, account, device]
    assert lazy[2].resolve(session) is device


def test_a_reference_to_a_deleted_row_decodes_to_none(session):
    order = Order()
    session.add(order)
    session.commit()
    stored = encode(order)
    session.delete(order)
    session.commit()

    assert decode(stored, session=session) is None


def test_an_instance_without_a_primary_key_yet_is_refused_with_the_fix():
    with pytest.raises(SerializationError, match="flush\\(\\) first"):
        encode(Order())


def test_an_unloaded_reference_is_stored_again_as_it_was():
    assert encode(Reference("Order", 5)) == {"__gd__": ["record", "Order", 5]}


def _ours(workflow, payload):
    return payload["order"] is not None and payload["order"].id == workflow.hero.id


class SigRefPayload(Workflow):
    @step(wait_for=SignalMatcher("shipped", _ours))
    def record(self) -> None:
        order = self.received_signal.payload["order"]
        assert isinstance(order, Order)
        self.session.add(AuditEntry(order_id=order.id, note=f"shipped {type(order).__name__}"))


def test_a_step_and_a_matcher_receive_payload_references_as_loaded_instances(session):
    wf = start(session, SigRefPayload)
    other = Order()
    session.add(other)
    session.commit()
    wf.signal("shipped", payload={"order": other})  # not this workflow's hero: no match
    wf.signal("shipped", payload={"order": session.get(Order, int(wf.hero_id))})
    session.commit()

    drive(wf)

    assert notes(session, wf) == ["shipped Order"]

"""Issue 35: hostile text in the dashboard's query parameters and forms is a 400, never a 500.

Before: ``/workflows?hero_id=%00`` (also ``type``, ``step``, ``signal``) answered 500 with a raw
DataError on PostgreSQL; ``/waiting?signal=%00`` did too. The rule is ``geneva_drive.core.text``.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from geneva_drive import Signal
from geneva_drive.storage.models import OperatorAction
from tests.dashboard.conftest import allow_everything, csrf


@pytest.mark.parametrize("field", ["hero_id", "type", "step", "signal", "hero_type", "error"])
def test_a_workflows_filter_with_nul_is_a_400_naming_the_field(client_for, scenario, field):
    page = client_for().get("/workflows", params={field: "a\x00b"})
    assert page.status_code == 400
    assert "NUL character" in page.text and "position 1" in page.text


def test_the_waiting_page_with_a_nul_signal_is_a_400(client_for, scenario):
    page = client_for().get("/waiting", params={"signal": "a\x00b"})
    assert page.status_code == 400
    assert "awaiting_signal=" in page.text and "NUL character" in page.text


@pytest.mark.parametrize(
    "form",
    [
        {"signal_name": "approval", "payload": '{"note": "a\\u0000b"}'},
        {"signal_name": "approval", "payload": '{"note": "a\\ud800b"}'},
        {"signal_name": "appro\x00val", "payload": ""},
        {"signal_name": "approval", "key": "k\x00"},
    ],
    ids=["payload-nul", "payload-lone-surrogate", "name", "key"],
)
def test_a_signal_form_with_unstorable_text_is_a_400_and_stores_nothing(
    client_for, session, scenario, form
):
    client = client_for(authorize=allow_everything)
    refused = client.post(
        f"/workflows/{scenario.waiting}/act",
        data={"action": "signal", **form, "csrf_token": csrf(client)},
    )
    assert refused.status_code == 400
    assert f"DashApproval id={scenario.waiting}" in refused.text
    assert "every database" in refused.text
    session.commit()
    names = session.scalars(select(Signal.name).where(Signal.workflow_id == scenario.waiting))
    assert list(names) == ["note"]  # the scenario's own, and nothing more
    assert session.scalar(select(func.count()).select_from(OperatorAction)) == 0


def test_an_action_with_a_nul_in_its_reason_is_a_400_and_changes_nothing(
    client_for, session, scenario
):
    client = client_for(authorize=allow_everything)
    refused = client.post(
        f"/workflows/{scenario.waiting}/act",
        data={"action": "pause", "reason": "because\x00", "csrf_token": csrf(client)},
    )
    assert refused.status_code == 400 and "reason" in refused.text
    session.commit()
    assert session.scalar(select(func.count()).select_from(OperatorAction)) == 0

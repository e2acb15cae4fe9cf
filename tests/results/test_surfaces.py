"""Where an operator sees a workflow's input and its steps' results: admin.show, the CLI's
show (table and --json) and the dashboard's workflow page."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from starlette.testclient import TestClient

from geneva_drive import Workflow, admin, step
from geneva_drive.dashboard import create_app
from geneva_drive.testing import speedrun
from tests.ops_cli._support import invoke, invoke_json
from tests.support.app import Order


class ShownRefund(Workflow):
    @step
    def capture(self) -> dict[str, Any]:
        return {"payment_ref": "pay-<b>42</b>", "cents": Decimal("12.50")}

    @step
    def notify(self) -> None:
        pass


@pytest.fixture
def refund(session: Any) -> ShownRefund:
    order = Order()
    session.add(order)
    wf = ShownRefund.create(session, hero=order, input={"amount_cents": 1250, "reason": "late"})
    session.commit()
    speedrun(wf)
    return wf


def test_show_has_the_input_and_each_successful_executions_result(session, refund):
    timeline = admin.show(session, refund.id)

    assert timeline.input == {"amount_cents": 1250, "reason": "late"}
    results = [(e.step_name, e.result) for e in timeline.executions]
    assert results == [
        ("capture", {"payment_ref": "pay-<b>42</b>", "cents": Decimal("12.50")}),
        ("notify", None),
    ]
    as_json = admin.to_json(timeline)
    assert as_json["input"] == {"amount_cents": 1250, "reason": "late"}
    assert as_json["executions"][0]["result"]["cents"] == "12.50"


def test_the_cli_shows_the_input_and_the_step_results(session, refund, installed_database_url):
    result = invoke(installed_database_url, "show", str(refund.id))

    assert result.exit_code == 0, result.output
    assert 'input: {"amount_cents": 1250, "reason": "late"}' in result.stdout
    assert "step results" in result.stdout
    assert '{"cents": "12.50", "payment_ref": "pay-<b>42</b>"}' in result.stdout

    timeline = invoke_json(installed_database_url, "show", str(refund.id))
    assert timeline["input"] == {"amount_cents": 1250, "reason": "late"}
    assert timeline["executions"][0]["result"]["payment_ref"] == "pay-<b>42</b>"


def test_the_dashboard_workflow_page_shows_the_input_and_the_results_escaped(gd, refund):
    with TestClient(create_app(engine=gd.engine, clock=gd.clock)) as client:
        html = client.get(f"/workflows/{refund.id}").text

    assert "data-input" in html and "&#34;amount_cents&#34;: 1250" in html
    assert "data-result" in html
    assert "pay-&lt;b&gt;42&lt;/b&gt;" in html and "pay-<b>42</b>" not in html

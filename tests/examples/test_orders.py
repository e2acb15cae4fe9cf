"""examples/orders: the FastAPI order service through Starlette's TestClient on the pytest
plugin's fixtures, and its two start commands (uvicorn, the worker) run as its README says."""

from __future__ import annotations

import ast
import inspect
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx2 as httpx
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sqlalchemy import func, make_url, select
from sqlalchemy.ext.asyncio import AsyncSession

from examples.orders import models
from examples.orders.app import async_url, build_app, router
from examples.orders.workflows import PAYMENT_TIMEOUT, OrderFulfillment
from geneva_drive import Signal
from geneva_drive.testing import (
    advance_and_run,
    assert_signal_state,
    assert_waiting_for_signal,
    history,
    run_due,
)
from tests.celery.support import OutputLines

REPO = Path(__file__).resolve().parents[2]
TOKEN = "test-ops-token"


@pytest.fixture
def orders(geneva_drive_engine, geneva_drive_session) -> Iterator[TestClient]:
    """The app on the plugin's engine (geneva-drive configured on it, clock frozen), with its
    own tables fresh and stocked."""
    models.Base.metadata.drop_all(geneva_drive_engine)
    models.Base.metadata.create_all(geneva_drive_engine)
    models.stock_shelves(geneva_drive_session)
    with TestClient(build_app(geneva_drive_engine, ops_token=TOKEN)) as client:
        yield client


def _order(client: TestClient, sku: str = "widget", quantity: int = 2) -> dict:
    response = client.post("/orders", json={"sku": sku, "quantity": quantity})
    assert response.status_code == 201, response.text
    return response.json()


def _payment(order_id: int, event_id: str, amount_cents: int = 2500) -> dict:
    return {
        "id": event_id,
        "type": "payment.captured",
        "data": {"order_id": order_id, "amount_cents": amount_cents},
    }


def _workflow(session, created: dict) -> OrderFulfillment:
    workflow = session.get(OrderFulfillment, created["workflow_id"])
    assert workflow is not None
    return workflow


def _available(session, sku: str) -> int:
    stock = session.get(models.Stock, sku)
    session.refresh(stock)
    return stock.available


def _signals(session) -> int:
    count = session.scalar(select(func.count()).select_from(Signal))
    session.commit()
    return int(count or 0)


# --- the order's life ---------------------------------------------------------------------------


def test_an_order_is_reserved_paid_and_shipped(orders, geneva_drive_session):
    created = _order(orders)
    assert created["status"] == "new"
    wf = _workflow(geneva_drive_session, created)  # committed by the request, with the order

    run_due(wf)  # the worker: reserve_stock, then the payment step parks
    assert_waiting_for_signal(wf, "payment_captured")
    assert orders.get(f"/orders/{created['id']}").json()["status"] == "awaiting_payment"
    assert _available(geneva_drive_session, "widget") == models.SHELVES["widget"] - 2

    webhook = orders.post("/webhooks/payments", json=_payment(created["id"], "evt_1"))
    assert webhook.status_code == 200, webhook.text
    assert webhook.json() == {"order_id": created["id"], "duplicate": False}

    run_due(wf)  # woken by the signal: capture_payment, then ship
    assert wf.state == "finished"
    assert history(wf) == [
        ("reserve_stock", "completed", "success"),
        ("capture_payment", "completed", "success"),
        ("capture_payment", "canceled", "canceled"),  # its timeout's timer: the payment won
        ("ship", "completed", "success"),
    ]
    shown = orders.get(f"/orders/{created['id']}").json()
    assert shown == {
        "id": created["id"],
        "sku": "widget",
        "quantity": 2,
        "status": "shipped",
        "paid_cents": 2500,
        "workflow_id": wf.id,
        "workflow_state": "finished",
    }


def test_a_redelivered_payment_webhook_is_harmless(orders, geneva_drive_session):
    created = _order(orders)
    wf = _workflow(geneva_drive_session, created)
    run_due(wf)

    first = orders.post("/webhooks/payments", json=_payment(created["id"], "evt_7", 2500))
    # The provider did not see our 200 and sends the same event again, before the worker ran
    # (a redelivery's payload does not count: the first delivery's wins) ...
    again = orders.post("/webhooks/payments", json=_payment(created["id"], "evt_7", 9999))
    assert (first.json()["duplicate"], again.json()["duplicate"]) == (False, True)
    run_due(wf)
    # ... and once more after the order has shipped.
    late = orders.post("/webhooks/payments", json=_payment(created["id"], "evt_7", 2500))

    assert late.status_code == 200, late.text
    assert late.json()["duplicate"] is True
    assert _signals(geneva_drive_session) == 1
    assert_signal_state(wf, "payment_captured", "consumed")
    geneva_drive_session.refresh(wf)
    assert [e.step_name for e in wf.execution_history] == [
        "reserve_stock",
        "capture_payment",
        "ship",
    ]
    assert orders.get(f"/orders/{created['id']}").json()["paid_cents"] == 2500


def test_an_order_unpaid_past_the_timeout_is_canceled_and_its_stock_released(
    orders, geneva_drive_session
):
    created = _order(orders, quantity=3)
    wf = _workflow(geneva_drive_session, created)
    run_due(wf)
    assert _available(geneva_drive_session, "widget") == models.SHELVES["widget"] - 3

    assert advance_and_run(wf, PAYMENT_TIMEOUT - timedelta(seconds=1)) == 0  # not yet
    advance_and_run(wf, seconds=1)  # the timer fires: release_stock, which cancels

    assert wf.state == "canceled"
    assert ("capture_payment", "skipped", "timed_out") in history(wf)
    assert history(wf)[-1] == ("release_stock", "canceled", "canceled")
    assert _available(geneva_drive_session, "widget") == models.SHELVES["widget"]
    assert orders.get(f"/orders/{created['id']}").json()["status"] == "canceled"
    # A payment that arrives after that is refused, so the provider's side can refund it.
    late = orders.post("/webhooks/payments", json=_payment(created["id"], "evt_late"))
    assert late.status_code == 409, late.text
    assert "canceled" in late.json()["detail"]
    assert _signals(geneva_drive_session) == 0


def test_an_order_beyond_the_stock_is_canceled_without_reserving(orders, geneva_drive_session):
    created = _order(orders, sku="gadget", quantity=models.SHELVES["gadget"] + 1)
    wf = _workflow(geneva_drive_session, created)

    run_due(wf)

    assert wf.state == "canceled"
    assert orders.get(f"/orders/{created['id']}").json()["status"] == "out_of_stock"
    assert _available(geneva_drive_session, "gadget") == models.SHELVES["gadget"]


def test_an_order_and_its_workflow_are_saved_together_or_not_at_all(
    orders, geneva_drive_session, monkeypatch
):
    acreate = OrderFulfillment.acreate

    async def create_then_fail(session, **kwargs):
        await acreate(session, **kwargs)  # the workflow and its first step are written ...
        raise ConnectionError("the database went away before the commit")  # ... then this

    monkeypatch.setattr(OrderFulfillment, "acreate", create_then_fail)
    with pytest.raises(ConnectionError):
        orders.post("/orders", json={"sku": "widget", "quantity": 1})

    assert geneva_drive_session.scalar(select(func.count()).select_from(models.ShopOrder)) == 0
    assert geneva_drive_session.scalar(select(func.count()).select_from(OrderFulfillment)) == 0


def test_the_handlers_are_async_and_each_request_has_its_own_async_session(orders, monkeypatch):
    acreate = OrderFulfillment.acreate
    sessions = []

    async def recording(session, **kwargs):
        sessions.append(session)
        return await acreate(session, **kwargs)

    monkeypatch.setattr(OrderFulfillment, "acreate", recording)
    _order(orders)
    _order(orders)

    handlers = {r.name: r.endpoint for r in router.routes if isinstance(r, APIRoute)}
    assert set(handlers) >= {"create_order", "show_order", "payment_webhook"}
    assert all(inspect.iscoroutinefunction(handler) for handler in handlers.values()), handlers
    assert [type(s) for s in sessions] == [AsyncSession, AsyncSession]
    assert sessions[0] is not sessions[1]


def test_an_order_for_an_unknown_sku_is_refused_and_nothing_is_written(
    orders, geneva_drive_session
):
    response = orders.post("/orders", json={"sku": "gizmo", "quantity": 1})

    assert response.status_code == 422, response.text
    assert "gizmo" in response.json()["detail"]
    assert geneva_drive_session.scalar(select(func.count()).select_from(models.ShopOrder)) == 0
    assert geneva_drive_session.scalar(select(func.count()).select_from(OrderFulfillment)) == 0


def test_a_webhook_for_an_unknown_order_is_a_404(orders):
    response = orders.post("/webhooks/payments", json=_payment(404, "evt_x"))

    assert response.status_code == 404, response.text
    assert "404" in response.json()["detail"]


# --- the app's async engine ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("worker_url", "app_url"),
    [
        ("sqlite:///orders.db", "sqlite+aiosqlite:///orders.db"),
        ("postgresql+psycopg://app:pw@db/shop", "postgresql+psycopg://app:pw@db/shop"),
        (
            "mariadb+pymysql://app:pw@/shop?unix_socket=/run/my.sock&charset=utf8mb4",
            "mariadb+aiomysql://app:pw@/shop?unix_socket=/run/my.sock&charset=utf8mb4",
        ),
    ],
)
def test_the_app_opens_the_workers_database_through_its_async_driver(worker_url, app_url):
    assert async_url(make_url(worker_url)) == make_url(app_url)


def test_a_database_without_an_async_driver_is_refused_by_name():
    with pytest.raises(ValueError, match="async driver") as refused:
        async_url(make_url("oracle+oracledb://app:secret@db/shop"))

    message = str(refused.value)
    assert "GENEVA_DRIVE_DATABASE_URL" in message and "'oracle'" in message
    assert "mariadb" in message and "secret" not in message


# --- the dashboard at /ops ----------------------------------------------------------------------


def test_the_dashboard_needs_the_ops_token(orders, geneva_drive_session):
    created = _order(orders)
    page = f"/ops/workflows/{created['workflow_id']}"

    missing = orders.get(page)
    wrong = orders.get(page, headers={"Authorization": "Bearer not-the-token"})
    bearer = orders.get(page, headers={"Authorization": f"Bearer {TOKEN}"})
    basic = orders.get(page, auth=("alice", TOKEN))  # what a browser sends after its prompt

    assert missing.status_code == 401
    assert missing.headers["www-authenticate"].startswith("Basic")
    assert wrong.status_code == 403
    assert bearer.status_code == 200, bearer.text
    assert "OrderFulfillment" in bearer.text
    assert basic.status_code == 200, basic.text


def test_an_ops_user_can_act_on_an_order_workflow(orders, geneva_drive_session):
    created = _order(orders)
    wf = _workflow(geneva_drive_session, created)
    run_due(wf)  # parked on the payment
    auth = ("alice", TOKEN)
    page = orders.get(f"/ops/workflows/{wf.id}", auth=auth)
    csrf = orders.cookies.get("gd_csrf")
    assert page.status_code == 200 and csrf

    response = orders.post(
        f"/ops/workflows/{wf.id}/act",
        data={"csrf_token": csrf, "action": "cancel", "reason": "customer called"},
        auth=auth,
        follow_redirects=False,
    )

    assert response.status_code == 303, response.text
    geneva_drive_session.refresh(wf)
    assert wf.state == "canceled"
    timeline = orders.get(f"/ops/workflows/{wf.id}", auth=auth).text
    assert "dashboard:alice" in timeline  # the authorize hook's user is the recorded actor


# --- the start commands -------------------------------------------------------------------------


def _start_commands() -> list[str]:
    """The orders row's commands in examples/README.md, as a user copies them."""
    readme = (REPO / "examples" / "README.md").read_text()
    (row,) = [line for line in readme.splitlines() if line.startswith("| [`orders/`]")]
    return re.findall(r"`([^`]*(?:uvicorn|geneva-drive worker)[^`]*)`", row)


def _argv(command: str) -> tuple[dict[str, str], list[str]]:
    """``VAR=value ... program args`` → (environment, argv run with this interpreter)."""
    words = shlex.split(command)
    env = {}
    while "=" in words[0]:
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    program = {"uvicorn": "uvicorn", "geneva-drive": "geneva_drive"}[words[0]]
    return env, [sys.executable, "-m", program, *words[1:]]


def _stop(process: subprocess.Popen[str], output: OutputLines) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=60)
    output.wait_closed()
    return code


@pytest.mark.slow
def test_the_start_commands_serve_the_app_and_run_its_workflows(tmp_path):
    app_command, worker_command = _start_commands()
    app_env, app_argv = _argv(app_command)
    worker_env, worker_argv = _argv(worker_command)
    base = {
        **os.environ,
        # Run from a scratch directory (orders.db lands there), with the repository importable
        # as it is when a user runs the commands from its root.
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
    }
    base.pop("GENEVA_DRIVE_DATABASE_URL", None)
    token = app_env["ORDERS_OPS_TOKEN"]
    started: list[tuple[subprocess.Popen[str], OutputLines]] = []

    def start(argv: list[str], env: dict[str, str]) -> OutputLines:
        process = subprocess.Popen(
            argv,
            cwd=tmp_path,
            env={**base, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        output = OutputLines(process.stdout)
        started.append((process, output))
        return output

    try:
        server = start([*app_argv, "--port", "0"], app_env)  # a free port, not 8000
        line = server.wait_for("Uvicorn running on", timeout=60)
        url = re.search(r"http://\S+", line).group(0)
        start(worker_argv, worker_env)  # no need to wait for it: the order waits in its table

        with httpx.Client(base_url=url, timeout=10) as client:
            created = client.post("/orders", json={"sku": "widget", "quantity": 1}).json()
            order = f"/orders/{created['id']}"
            _wait_for_status(client, order, "awaiting_payment")
            client.post("/webhooks/payments", json=_payment(created["id"], "evt_live"))
            _wait_for_status(client, order, "shipped")
            assert client.get("/ops/").status_code == 401
            dashboard = client.get(
                f"/ops/workflows/{created['workflow_id']}",
                headers={"Authorization": f"Bearer {token}"},
            )
            assert dashboard.status_code == 200
            assert "ship" in dashboard.text
    finally:
        codes = [_stop(process, output) for process, output in started]
    # The worker exits 0 once its steps are done; uvicorn shuts down cleanly, then (from 0.29
    # on) re-raises the SIGTERM it caught, as a process manager expects.
    outputs = "\n\n".join(out.text() for _, out in started)
    assert codes[0] in (0, -signal.SIGTERM) and codes[1] == 0, f"{codes}\n{outputs}"
    assert "Application shutdown complete" in started[0][1].text(), outputs


def _wait_for_status(client: httpx.Client, path: str, status: str, timeout: float = 60) -> None:
    """Poll the order until it reaches ``status`` (the worker polls the database on its own
    schedule; nothing here can be told when it has run a step)."""
    deadline = time.monotonic() + timeout
    while True:
        shown = client.get(path).json()
        if shown["status"] == status:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not reach {status!r} within {timeout} s: {shown}")
        time.sleep(0.1)  # the poll interval of a condition wait, not a synchronising sleep


def test_the_library_itself_imports_no_fastapi():
    """FastAPI is the example's, in the dev extra only: no module of geneva_drive imports it."""
    importers = []
    for path in (REPO / "src" / "geneva_drive").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(name.split(".")[0] == "fastapi" for name in names):
                importers.append(str(path.relative_to(REPO)))

    assert importers == []

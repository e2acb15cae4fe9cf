"""Dashboard fixtures: SQLite and PostgreSQL (MariaDB is covered by the admin tests), a
TestClient over ``create_app`` on the test's database, and the scenario's workflows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from geneva_drive.dashboard import create_app
from tests.conftest import _backend_param
from tests.dashboard.apps import Scenario, build_scenario

DASHBOARD_BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(params=[_backend_param(name) for name in DASHBOARD_BACKENDS])
def db_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def allow_everything(_request: Any, _action: str, _target: Any) -> bool:
    return True


@pytest.fixture
def client_for(gd: Any) -> Iterator[Callable[..., TestClient]]:
    """``client_for(**create_app_options)``: a TestClient on the test database (after one GET,
    so it holds a CSRF cookie like a browser that opened a page)."""
    clients: list[TestClient] = []

    def make(**options: Any) -> TestClient:
        options.setdefault("clock", gd.clock)
        client = TestClient(create_app(engine=gd.engine, **options))
        clients.append(client)
        client.get("/workflows")
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def scenario(session: Any) -> Scenario:
    return build_scenario(session)


def csrf(client: TestClient) -> str:
    token = client.cookies.get("gd_csrf")
    assert token, "the client has no CSRF cookie; GET a page first"
    return str(token)

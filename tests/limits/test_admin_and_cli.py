"""admin.limits() and `geneva-drive limits` show each key's holders and waiters."""

from __future__ import annotations

import re

from starlette.testclient import TestClient

from geneva_drive import admin
from geneva_drive.dashboard.app import create_app
from tests.limits._support import start_all
from tests.limits.apps import Gateway, TwoAtATime
from tests.ops_cli._support import invoke, invoke_json


def _two_running_one_waiting(gd, session):
    for _ in range(3):
        TwoAtATime.create(session)
    Gateway.create(session)
    session.commit()
    runs = start_all(gd)
    for step_session, _ in runs:
        step_session.close()


def test_admin_limits_gives_each_keys_running_count_holders_and_waiters(gd, session):
    _two_running_one_waiting(gd, session)

    found = admin.limits(session)

    (key,) = found.concurrency
    assert (key.key, key.running, key.waiters) == ("TwoAtATime.work", 2, 1)
    assert len(key.holders) == 2 and key.workflow_types == ("TwoAtATime",)
    assert [(r.key, r.starts_last_minute) for r in found.rate] == [("gateway", 1)]


def test_the_limits_command_prints_the_same_as_a_table_and_as_json(
    gd, session, installed_database_url
):
    _two_running_one_waiting(gd, session)

    human = invoke(installed_database_url, "limits")
    data = invoke_json(installed_database_url, "limits")

    assert human.exit_code == 0, human.output
    assert "TwoAtATime.work" in human.stdout and "gateway" in human.stdout
    (key,) = data["concurrency"]
    assert (key["key"], key["running"], key["waiters"]) == ("TwoAtATime.work", 2, 1)


def test_with_nothing_limited_the_command_says_so(gd, installed_database_url):
    human = invoke(installed_database_url, "limits")

    assert human.exit_code == 0, human.output
    assert "no concurrency key is held or waited for" in human.stdout


def test_the_dashboard_limits_page_shows_holders_and_waiters(gd, session):
    _two_running_one_waiting(gd, session)

    with TestClient(create_app(engine=gd.engine, clock=gd.clock)) as client:
        page = client.get("/limits")

    assert page.status_code == 200
    html = page.text
    assert 'data-limit-key="TwoAtATime.work"' in html
    assert re.search(r"data-running>2<", html) and re.search(r"data-waiters>1<", html)
    assert 'data-rate-key="gateway"' in html
    assert 'aria-current="page">Limits<' in html

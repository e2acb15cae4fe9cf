"""admin.limits() and `geneva-drive limits` show each key's holders and waiters."""

from __future__ import annotations

from geneva_drive import admin
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

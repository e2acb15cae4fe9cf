"""Bulk actions: offered only where they apply, confirmed after the dry run the CLI shows."""

from __future__ import annotations

import re

from tests.dashboard.apps import Scenario, snapshot
from tests.dashboard.conftest import allow_everything, csrf


def offered(html: str) -> set[str]:
    """The bulk verbs the workflows page offers (each a form that opens the dry run)."""
    return set(re.findall(r'action="/bulk/preview".*?name="action" value="(\w+)"', html, re.S))


def test_bulk_offers_only_the_verbs_that_apply_to_the_filtered_states(client_for, scenario):
    client = client_for(authorize=allow_everything)
    paused = client.get("/workflows", params={"state": "paused"}).text
    assert offered(paused) == {"resume", "retry", "skip", "cancel"}  # no "Pause all"
    ready = client.get("/workflows", params={"state": "ready"}).text
    assert offered(ready) == {"pause", "retry", "skip", "cancel"}  # no "Resume all"
    either = client.get("/workflows", params={"state": ["ready", "paused"]}).text
    assert offered(either) == {"pause", "resume", "retry", "skip", "cancel"}
    finished = client.get("/workflows", params={"state": "finished"}).text
    assert offered(finished) == set() and "Act on all" not in finished


def test_the_dry_run_lists_what_would_change_and_what_would_be_refused_and_writes_nothing(
    client_for, session, scenario: Scenario
):
    client = client_for(authorize=allow_everything)
    before = snapshot(session)
    page = client.get("/bulk/preview", params={"action": "resume", "state": ["ready", "paused"]})
    assert page.status_code == 200
    html = page.text
    summary = re.search(r"<p[^>]*data-dry-run>(.*?)</p>", html, re.S)
    assert summary and "3 workflow(s) match" in summary.group(1)
    would = re.search(r"<ul[^>]*data-would-change>(.*?)</ul>", html, re.S)
    assert would and re.findall(r"#(\d+)", would.group(1)) == [str(scenario.failed)]
    refused = re.search(r"<ul[^>]*data-would-refuse>(.*?)</ul>", html, re.S)
    assert refused
    assert sorted(int(i) for i in re.findall(r"#(\d+)</a>", refused.group(1))) == sorted(
        [scenario.waiting, scenario.scripted_hero]
    )
    assert "cannot resume a ready workflow" in refused.group(1)  # the reason, as the CLI says
    confirm = re.search(r'<form method="post" action="/bulk".*?</form>', html, re.S)
    assert confirm is not None
    assert 'name="action" value="resume"' in confirm.group(0)
    assert confirm.group(0).count('name="state"') == 2  # the filter goes along, whole
    assert "Yes, resume 1 workflow" in confirm.group(0)
    assert snapshot(session) == before


def test_confirming_the_dry_run_does_what_it_listed(client_for, session, scenario):
    client = client_for(authorize=allow_everything)
    client.get("/bulk/preview", params={"action": "resume", "state": ["ready", "paused"]})
    done = client.post(
        "/bulk",
        data={"action": "resume", "state": ["ready", "paused"], "csrf_token": csrf(client)},
    )
    assert "resume: 1 of 3 matching changed; 2 refused" in done.text


def test_only_destructive_verbs_wear_the_danger_colour(client_for, scenario):
    client = client_for(authorize=allow_everything)
    listing = client.get("/workflows", params={"state": "paused"}).text
    buttons = dict(
        re.findall(
            r'name="action" value="(\w+)">.*?<button type="submit"( class="danger")?', listing, re.S
        )
    )
    assert {verb for verb, danger in buttons.items() if danger} == {"skip", "cancel"}
    for verb, danger in (("cancel", True), ("skip", True), ("resume", False), ("retry", False)):
        html = client.get("/bulk/preview", params={"action": verb, "state": "paused"}).text
        button = re.search(r'<form method="post" action="/bulk".*?(<button[^>]*>)', html, re.S)
        assert button and ('class="danger"' in button.group(1)) is danger, verb


def test_the_dry_run_is_refused_without_a_filter_a_known_verb_or_permission(
    client_for, session, scenario
):
    client = client_for(authorize=lambda request, action, target: action != "cancel")
    before = snapshot(session)
    assert client.get("/bulk/preview", params={"action": "pause"}).status_code == 400
    unknown = client.get("/bulk/preview", params={"action": "explode", "state": "ready"})
    assert unknown.status_code == 400 and "explode" in unknown.text
    denied = client.get("/bulk/preview", params={"action": "cancel", "state": "ready"})
    assert denied.status_code == 403
    assert (
        client_for().get("/bulk/preview", params={"action": "pause", "state": "ready"}).status_code
        == 403
    )  # read-only
    assert snapshot(session) == before

"""Safe by default: read-only without authorize, CSRF on every POST, no action on GET, every
user-controlled value escaped."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import select

from geneva_drive import Workflow
from geneva_drive.admin import WorkflowFilter, WorkflowSummary
from tests.dashboard.apps import ESCAPED, SCRIPT, Scenario, snapshot
from tests.dashboard.conftest import allow_everything, csrf

ACTION_FORMS = [
    {"action": "pause"},
    {"action": "resume"},
    {"action": "skip"},
    {"action": "cancel"},
    {"action": "retry"},
    {"action": "resume_at", "step": "reserve"},
    {"action": "signal", "signal_name": "approval", "payload": "{}"},
]


def post_action(client, workflow_id, form, *, token=True):
    data = {**form, **({"csrf_token": csrf(client)} if token else {})}
    return client.post(f"/workflows/{workflow_id}/act", data=data, follow_redirects=False)


# -- read-only unless authorize() says True ---------------------------------------------------


@pytest.mark.parametrize("form", ACTION_FORMS, ids=lambda f: f["action"])
def test_without_authorize_every_action_is_refused_and_the_database_is_unchanged(
    client_for, session, scenario: Scenario, form
):
    client = client_for()
    before = snapshot(session)
    for workflow_id in (scenario.failed, scenario.waiting):
        assert post_action(client, workflow_id, form).status_code == 403
    assert snapshot(session) == before


def test_a_read_only_dashboard_shows_no_action_form_and_says_it_is_read_only(client_for, scenario):
    client = client_for()
    for path in (f"/workflows/{scenario.failed}", "/workflows?state=paused"):
        html = client.get(path).text
        assert '<form method="post"' not in html
        assert "read-only" in html


def test_authorize_decides_each_action_on_the_workflow_it_targets(client_for, session, scenario):
    asked: list[tuple[str, object]] = []

    def only_pause(request, action, target):
        asked.append((action, target))
        return action == "pause"

    client = client_for(authorize=only_pause)
    before = snapshot(session)
    assert post_action(client, scenario.waiting, {"action": "cancel"}).status_code == 403
    assert snapshot(session) == before
    assert post_action(client, scenario.waiting, {"action": "pause"}).status_code == 303
    assert snapshot(session) != before
    _, target = asked[-1]
    assert isinstance(target, WorkflowSummary) and target.id == scenario.waiting


def test_only_a_literal_true_from_authorize_allows(client_for, session, scenario):
    client = client_for(authorize=lambda request, action, target: "yes")
    before = snapshot(session)
    assert post_action(client, scenario.waiting, {"action": "pause"}).status_code == 403
    assert snapshot(session) == before


def test_an_async_authorize_is_awaited(client_for, session, scenario):
    async def allow(request, action, target):
        return True

    client = client_for(authorize=allow)
    assert post_action(client, scenario.waiting, {"action": "pause"}).status_code == 303


# -- CSRF -------------------------------------------------------------------------------------


def test_a_post_without_a_csrf_token_is_403_and_changes_nothing(client_for, session, scenario):
    client = client_for(authorize=allow_everything)
    before = snapshot(session)
    refused = post_action(client, scenario.waiting, {"action": "cancel"}, token=False)
    assert refused.status_code == 403 and "CSRF" in refused.text
    assert snapshot(session) == before


def test_a_csrf_token_from_another_browser_or_an_unsigned_cookie_is_refused(
    client_for, session, scenario
):
    client, other = client_for(authorize=allow_everything), client_for(authorize=allow_everything)
    before = snapshot(session)
    data = {"action": "cancel", "csrf_token": csrf(other)}
    path = f"/workflows/{scenario.waiting}/act"
    assert client.post(path, data=data).status_code == 403  # not this browser's token
    client.cookies.set("gd_csrf", "forged.0000")
    forged = {"action": "cancel", "csrf_token": "forged.0000"}
    assert client.post(path, data=forged).status_code == 403  # ours, but not signed by the app
    assert snapshot(session) == before


def test_a_bulk_action_needs_the_csrf_token_too(client_for, session, scenario):
    client = client_for(authorize=allow_everything)
    before = snapshot(session)
    assert (
        client.post("/bulk", data={"action": "cancel", "type": "DashApproval"}).status_code == 403
    )
    assert snapshot(session) == before


# -- GET never acts ---------------------------------------------------------------------------


def test_no_get_changes_anything_even_one_that_names_an_action(client_for, session, scenario):
    client = client_for(authorize=allow_everything)
    before = snapshot(session)
    for path in (
        "/",
        "/workflows",
        "/workflows?state=paused&action=cancel",
        "/waiting",
        *(f"/workflows/{i}" for i in (scenario.failed, scenario.waiting, scenario.finished)),
    ):
        assert client.get(path).status_code == 200, path
    assert client.get(f"/workflows/{scenario.waiting}/act?action=cancel").status_code == 405
    assert client.get("/bulk?action=cancel&type=DashApproval").status_code == 405
    assert snapshot(session) == before


# -- bulk -------------------------------------------------------------------------------------


def test_a_bulk_cancel_cancels_exactly_what_the_filter_matches(client_for, session, scenario):
    seen: list[object] = []

    def allow(request, action, target):
        seen.append(target)
        return True

    client = client_for(authorize=allow, actor=lambda request: "bob")
    listing = client.get("/workflows", params={"state": "ready"}).text
    assert "Cancel all 2…" in listing  # the count is on the button that opens the confirmation
    done = client.post(
        "/bulk",
        data={
            "action": "cancel",
            "state": "ready",
            "reason": "cleanup",
            "csrf_token": csrf(client),
        },
    )
    assert done.status_code == 200 and "2 of 2 matching changed" in done.text
    assert seen[-1] == WorkflowFilter(state="ready")
    session.commit()
    states = {i: state for i, state in session.execute(select(Workflow.id, Workflow.state))}
    assert states[scenario.waiting] == states[scenario.scripted_hero] == "canceled"
    assert states[scenario.failed] == "paused" and states[scenario.finished] == "finished"


def test_a_bulk_action_without_a_filter_is_refused(client_for, session, scenario):
    client = client_for(authorize=allow_everything)
    before = snapshot(session)
    refused = client.post("/bulk", data={"action": "cancel", "csrf_token": csrf(client)})
    assert refused.status_code == 400 and "needs at least one filter" in refused.text
    assert snapshot(session) == before


def test_a_bulk_action_without_permission_is_refused(client_for, session, scenario):
    client = client_for(authorize=lambda request, action, target: action != "cancel")
    before = snapshot(session)
    data = {"action": "cancel", "state": "ready", "csrf_token": csrf(client)}
    assert client.post("/bulk", data=data).status_code == 403
    assert snapshot(session) == before


# -- the login token --------------------------------------------------------------------------


def test_with_a_token_actions_need_the_login_and_reading_does_not(client_for, session, scenario):
    client = client_for(token="s3cret")
    assert client.get(f"/workflows/{scenario.waiting}").status_code == 200
    before = snapshot(session)
    assert post_action(client, scenario.waiting, {"action": "pause"}).status_code == 403
    wrong = client.post("/login", data={"token": "guess", "csrf_token": csrf(client)})
    assert wrong.status_code == 403
    assert snapshot(session) == before
    client.post("/login", data={"token": "s3cret", "csrf_token": csrf(client)})
    assert "s3cret" not in str(client.cookies.get("gd_auth"))  # the cookie is not the token
    assert post_action(client, scenario.waiting, {"action": "pause"}).status_code == 303


def test_with_a_token_a_bearer_header_is_a_login_too(client_for, scenario):
    client = client_for(token="s3cret")
    client.headers["Authorization"] = "Bearer s3cret"
    assert post_action(client, scenario.waiting, {"action": "pause"}).status_code == 303


def test_a_post_authenticated_by_the_bearer_header_needs_no_csrf_token(
    client_for, session, scenario
):
    """A browser cannot forge an Authorization header, so a script acting with the token
    sends no cookie and no CSRF field."""
    client = client_for(token="s3cret")
    client.cookies.clear()
    client.headers["Authorization"] = "Bearer s3cret"
    done = post_action(client, scenario.waiting, {"action": "pause"}, token=False)
    assert done.status_code == 303, done.text
    bulk = client.post(
        "/bulk", data={"action": "pause", "type": "DashAccountFlow"}, follow_redirects=False
    )
    assert bulk.status_code == 303, bulk.text
    session.commit()
    states = {i: state for i, state in session.execute(select(Workflow.id, Workflow.state))}
    assert states[scenario.waiting] == states[scenario.scripted_hero] == "paused"


def test_a_cookie_session_still_needs_the_csrf_token(client_for, session, scenario):
    client = client_for(token="s3cret")
    client.post("/login", data={"token": "s3cret", "csrf_token": csrf(client)})
    before = snapshot(session)
    refused = post_action(client, scenario.waiting, {"action": "pause"}, token=False)
    assert refused.status_code == 403 and "CSRF" in refused.text
    assert snapshot(session) == before


@pytest.mark.parametrize("with_csrf", [True, False], ids=["with-csrf", "without-csrf"])
def test_a_wrong_bearer_header_is_refused_and_changes_nothing(
    client_for, session, scenario, with_csrf
):
    client = client_for(token="s3cret")
    client.post("/login", data={"token": "s3cret", "csrf_token": csrf(client)})
    client.headers["Authorization"] = "Bearer guess"  # wins over the login cookie
    before = snapshot(session)
    refused = post_action(client, scenario.waiting, {"action": "pause"}, token=with_csrf)
    assert refused.status_code in (401, 403)
    assert snapshot(session) == before


def test_a_bearer_header_without_a_login_token_does_not_replace_the_csrf_token(
    client_for, session, scenario
):
    client = client_for(authorize=allow_everything)
    client.headers["Authorization"] = "Bearer anything"
    before = snapshot(session)
    refused = post_action(client, scenario.waiting, {"action": "pause"}, token=False)
    assert refused.status_code == 403 and "CSRF" in refused.text
    assert snapshot(session) == before


def test_login_redirects_only_within_the_dashboard(client_for, scenario):
    client = client_for(token="s3cret")
    sent = client.post(
        "/login",
        data={"token": "s3cret", "next": "//evil.example/", "csrf_token": csrf(client)},
        follow_redirects=False,
    )
    assert sent.headers["location"] == "/"


# -- escaping ---------------------------------------------------------------------------------


def test_scripts_in_payloads_errors_and_hero_ids_are_escaped_on_every_page(client_for, scenario):
    client = client_for(authorize=allow_everything)
    pages = {
        "error message": f"/workflows/{scenario.failed}",
        "signal payload": f"/workflows/{scenario.waiting}",
        "hero id": f"/workflows/{scenario.scripted_hero}",
        "hero id in the list": "/workflows",
        "hero id while waiting": "/waiting",
    }
    for what, path in pages.items():
        html = client.get(path).text
        assert SCRIPT not in html, what
        assert ESCAPED in html, what


def test_the_payload_preview_is_escaped_where_it_is_shown(client_for, scenario):
    html = client_for().get(f"/workflows/{scenario.waiting}").text
    preview = re.search(r"<code class=\"payload\" data-payload>(.*?)</code>", html, re.S)
    assert preview and "&lt;script&gt;" in preview.group(1) and "<script" not in preview.group(1)


def test_every_response_forbids_inline_scripts_and_framing(client_for, scenario):
    client = client_for()
    for path in ("/", f"/workflows/{scenario.failed}", "/static/dashboard.css"):
        headers = client.get(path).headers
        assert "script-src 'self'" in headers["content-security-policy"], path
        assert headers["x-frame-options"] == "DENY"

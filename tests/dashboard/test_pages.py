"""Every page renders what the admin API says, from the test's database."""

from __future__ import annotations

import itertools
import re

from sqlalchemy import select, text

from geneva_drive import Signal, Workflow, admin
from geneva_drive.dashboard.format import timestamp
from geneva_drive.testing import perform_next_step, speedrun
from tests.dashboard.apps import DashOrderFlow, DashResumable, Scenario
from tests.dashboard.conftest import allow_everything, csrf
from tests.support.app import Order


def ids_listed(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'data-workflow-id="(\d+)"', html)]


def test_the_overview_shows_ongoing_workflows_per_class_and_the_last_hour(
    client_for, scenario: Scenario
):
    page = client_for().get("/")
    assert page.status_code == 200
    html = page.text
    assert "DashApproval" in html and "DashOrderFlow" in html
    assert 'data-stat="finished_last_hour">1<' in html
    assert 'data-stat="waiting">2<' in html  # the approval and the scripted hero's verify
    assert 'data-refresh="' in html  # refreshes live


def test_the_overview_draws_the_last_hours_outcomes_as_an_inline_svg_sparkline(
    client_for, scenario: Scenario, gd
):
    gd.clock.advance(minutes=7)  # the scenario's steps ended 5-10 minutes ago: bucket 10

    html = client_for().get("/").text

    svg = re.search(r"<svg class=\"sparkline\"[^>]*>(.*?)</svg>", html, re.S)
    assert svg is not None
    assert 'role="img" aria-label="Step outcomes over the last hour, per 5 minutes (' in html
    titles = re.findall(r"<g data-bucket=\"(\d+)\"><title>(.*?)</title>", svg.group(1))
    assert len(titles) == 12
    busy = {
        int(n): label.split(": ", 1)[1]
        for n, label in titles
        if "0 succeeded, 0 failed" not in label
    }
    assert busy == {10: "4 succeeded, 1 failed, 0 other"}
    assert svg.group(1).count('class="o-failed"') == 1


def test_the_overview_chart_has_a_labelled_time_axis(client_for, scenario: Scenario, gd):
    html = client_for().get("/").text

    svg = re.search(r"<svg class=\"sparkline\"[^>]*>(.*?)</svg>", html, re.S)
    assert svg is not None
    axis = re.search(r"<g class=\"axis\" data-time-axis>(.*?)</g>", svg.group(1), re.S)
    assert axis is not None
    ticks = re.findall(r"<text[^>]*data-tick[^>]*>(\d\d:\d\d)</text>", axis.group(1))
    minutes = [int(t[:2]) * 60 + int(t[3:]) for t in ticks]
    assert len(ticks) == 5  # every quarter hour, left to right (mod 24 h: midnight wraps)
    assert all((b - a) % 1440 == 15 for a, b in itertools.pairwise(minutes))
    assert ">Time (UTC)</text>" in axis.group(1)


def test_the_workflows_page_lists_the_filtered_workflows_newest_first(client_for, scenario):
    client = client_for()
    everything = client.get("/workflows").text
    assert ids_listed(everything) == sorted(
        [scenario.finished, scenario.failed, scenario.waiting, scenario.scripted_hero],
        reverse=True,
    )
    paused = client.get("/workflows", params={"state": "paused"}).text
    assert ids_listed(paused) == [scenario.failed]
    assert "1 matching" in paused
    by_class = client.get("/workflows", params={"type": "DashOrderFlow", "order": "oldest"})
    assert ids_listed(by_class.text) == [scenario.finished, scenario.failed]


def test_the_hero_search_finds_a_workflow_by_its_hero_id(client_for, session, scenario):
    failed = session.get(Workflow, scenario.failed)
    found = client_for().get("/workflows", params={"hero_id": failed.hero_id}).text
    assert ids_listed(found) == [scenario.failed]


def test_pages_follow_the_keyset_cursor_without_repeating_or_skipping(client_for, session):
    for _ in range(5):
        speedrun(DashOrderFlow.create(session, hero=Order(status="ok")))
    session.commit()
    client = client_for(page_size=2)
    seen: list[int] = []
    url: str | None = "/workflows?type=DashOrderFlow"
    while url is not None:
        html = client.get(url).text
        seen += ids_listed(html)
        found = re.search(r'<a rel="next" href="([^"]+)"', html)
        url = found.group(1).replace("&amp;", "&") if found else None
    assert len(seen) == 5 and seen == sorted(set(seen), reverse=True)


def test_a_bad_filter_is_a_400_naming_the_field_and_the_expected_form(client_for, scenario):
    page = client_for().get("/workflows", params={"created_after": "last tuesday"})
    assert page.status_code == 400
    assert "created_after=" in page.text and "ISO 8601" in page.text


def test_the_workflow_page_shows_the_timeline_error_backtrace_signals_and_steps(
    client_for, scenario
):
    html = client_for().get(f"/workflows/{scenario.failed}").text
    assert "CardDeclined" in html
    backtrace = re.search(r"<details[^>]*class=\"backtrace\".*?</details>", html, re.S)
    assert backtrace and "Traceback" in backtrace.group(0)  # collapsed until opened
    assert html.count("data-execution-id=") == 2  # reserve, then the failed charge
    for name in ("reserve", "charge", "ship"):
        assert f"<li>{name}</li>" in html or f'aria-current="step">{name}' in html

    waiting = client_for().get(f"/workflows/{scenario.waiting}").text
    assert "waits for <strong>approval</strong>" in waiting
    assert 'data-signal-id="' in waiting and ">note<" in waiting


def test_the_workflow_page_shows_the_step_a_workflow_stands_at(client_for, scenario):
    client = client_for()

    paused = client.get(f"/workflows/{scenario.failed}").text  # stopped at charge
    waiting = client.get(f"/workflows/{scenario.waiting}").text  # ready, parked at approve
    assert "at <strong data-current-step>charge</strong>" in paused
    assert "at <strong data-current-step>approve</strong>" in waiting
    assert 'aria-current="step">charge<' in paused
    assert "next:" not in paused + waiting


def test_the_workflow_page_offers_the_actions_its_state_allows(client_for, scenario):
    client = client_for(authorize=allow_everything)
    paused = client.get(f"/workflows/{scenario.failed}").text
    offered = set(re.findall(r'name="action" value="(\w+)"', paused))
    assert offered == {"resume", "retry", "skip", "cancel", "resume_at", "signal"}
    finished = client.get(f"/workflows/{scenario.finished}").text
    assert 'name="action"' not in finished
    assert 'data-refresh="' not in finished  # a finished workflow does not change


def test_an_action_appears_in_the_timeline_with_its_actor_and_reason(client_for, scenario):
    client = client_for(authorize=allow_everything, actor=lambda request: "alice")
    sent = client.post(
        f"/workflows/{scenario.waiting}/act",
        data={"action": "pause", "reason": "customer called", "csrf_token": csrf(client)},
    )
    assert sent.status_code == 200  # followed the redirect back to the workflow
    assert "pause: ready → paused" in sent.text  # the one-time message
    assert re.search(r'data-action="pause".*?data-actor>alice<.*?customer called', sent.text, re.S)
    assert "pause: ready" not in client.get(f"/workflows/{scenario.waiting}").text  # shown once


def test_resume_at_with_a_due_time_schedules_the_step_then(client_for, scenario):
    client = client_for(authorize=allow_everything)
    page = client.get(f"/workflows/{scenario.failed}").text
    assert 'name="wait_until"' in page
    naive = client.post(
        f"/workflows/{scenario.failed}/act",
        data={
            "action": "resume_at",
            "step": "ship",
            "wait_until": "2099-01-01T09:00",
            "csrf_token": csrf(client),
        },
    )
    assert naive.status_code == 400 and "UTC offset" in naive.text
    sent = client.post(
        f"/workflows/{scenario.failed}/act",
        data={
            "action": "resume_at",
            "step": "ship",
            "wait_until": "2099-01-01T09:00+01:00",
            "csrf_token": csrf(client),
        },
    )
    assert sent.status_code == 200, sent.text
    assert "due at 2099-01-01T08:00:00+00:00" in sent.text


def test_skip_says_which_step_it_skipped_not_ready_to_ready(client_for, scenario):
    client = client_for(authorize=allow_everything)
    sent = client.post(
        f"/workflows/{scenario.waiting}/act",
        data={"action": "skip", "csrf_token": csrf(client)},
    )
    flash = re.search(r'<p class="flash ok" role="status">(.*?)</p>', sent.text)
    assert flash and flash.group(1) == "skip: at approve → at done"
    skipped = re.search(r'data-action="skip".*?<div class="times">(.*?)</div>', sent.text, re.S)
    assert skipped and "at approve → at done" in skipped.group(1)  # the timeline says it too


def test_a_refused_action_says_why_with_a_409(client_for, scenario):
    client = client_for(authorize=allow_everything)
    refused = client.post(
        f"/workflows/{scenario.finished}/act",
        data={"action": "pause", "csrf_token": csrf(client)},
    )
    assert refused.status_code == 409
    assert "DashOrderFlow" in refused.text and "finished" in refused.text


def test_an_unknown_workflow_is_a_404_naming_the_id_and_the_page_to_find_one(client_for, scenario):
    client = client_for(authorize=allow_everything)
    shown = client.get("/workflows/987654")
    acted = client.post(
        "/workflows/987654/act", data={"action": "pause", "csrf_token": csrf(client)}
    )
    for page in (shown, acted):
        assert page.status_code == 404
        message = re.search(r"<p[^>]*data-error>(.*?)</p>", page.text, re.S)
        assert message and "987654" in message.group(1)
        assert "Workflows page" in message.group(1)  # where to look instead
        assert "admin." not in message.group(1) and "()" not in message.group(1)
        assert '<a href="/workflows">' in page.text


def test_the_waiting_page_lists_what_waits_for_which_signal(client_for, scenario):
    client = client_for()
    html = client.get("/waiting").text
    assert set(ids_listed(html)) == {scenario.waiting, scenario.scripted_hero}
    assert "<strong>approval</strong>" in html and "<strong>verified</strong>" in html
    only = client.get("/waiting", params={"signal": "approval"}).text
    assert ids_listed(only) == [scenario.waiting]


def test_the_waiting_page_says_since_when_each_workflow_waits(client_for, session, scenario, gd):
    parked_at = admin.show(session, scenario.waiting).workflow.waiting_since
    assert parked_at is not None
    gd.clock.advance(minutes=90)

    html = client_for().get("/waiting").text

    assert "Waiting since" in html and "Last change" not in html
    row = html.split(f'data-workflow-id="{scenario.waiting}"', 1)[1].split("</tr>", 1)[0]
    assert f"<td data-waiting-since>{timestamp(parked_at)} (" in row
    assert "1 h 30 min ago" in row


def test_the_workflow_page_shows_each_resumable_run_s_iteration_count(client_for, session):
    wf = DashResumable.create(session, hero=Order(status="new"))
    for _ in range(3):
        perform_next_step(wf)
    session.commit()

    html = client_for().get(f"/workflows/{wf.id}").text

    progress = re.findall(r"<div class=\"progress\" data-progress>(.*?)</div>", html, re.S)
    counts = [re.search(r"progress: (\d+) iterations? in this run", p) for p in progress]
    assert [int(c.group(1)) for c in counts if c] == [3, 3, 1]


def test_a_signal_sent_from_the_page_reaches_the_waiting_workflow(client_for, session, scenario):
    client = client_for(authorize=allow_everything)
    client.post(
        f"/workflows/{scenario.waiting}/act",
        data={
            "action": "signal",
            "signal_name": "approval",
            "payload": '{"ok": true}',
            "csrf_token": csrf(client),
        },
    )
    session.commit()
    sent = session.scalars(select(Signal).where(Signal.workflow_id == scenario.waiting)).all()
    assert {s.name: s.payload for s in sent}["approval"] == {"ok": True}


def test_a_signal_no_step_waits_for_is_refused_on_the_page_naming_what_it_waits_for(
    client_for, session, scenario
):
    client = client_for(authorize=allow_everything)
    before = session.scalars(select(Signal).where(Signal.workflow_id == scenario.waiting)).all()

    refused = client.post(
        f"/workflows/{scenario.waiting}/act",
        data={"action": "signal", "signal_name": "aproval", "csrf_token": csrf(client)},
    )

    assert refused.status_code == 400
    assert "signal &#39;aproval&#39;: no step of DashApproval waits for it" in refused.text
    assert "its steps wait for &#39;approval&#39;" in refused.text
    session.commit()
    after = session.scalars(select(Signal).where(Signal.workflow_id == scenario.waiting)).all()
    assert len(after) == len(before)


def test_a_signal_payload_that_is_not_json_is_refused_with_an_example(client_for, scenario):
    client = client_for(authorize=allow_everything)
    refused = client.post(
        f"/workflows/{scenario.waiting}/act",
        data={
            "action": "signal",
            "signal_name": "approval",
            "payload": "{ok}",
            "csrf_token": csrf(client),
        },
    )
    assert refused.status_code == 400 and "not JSON" in refused.text


def test_the_app_works_mounted_under_a_prefix(gd, scenario):
    from starlette.applications import Starlette
    from starlette.routing import Mount
    from starlette.testclient import TestClient

    from geneva_drive.dashboard import create_app

    dashboard = create_app(engine=gd.engine, authorize=allow_everything, clock=gd.clock)
    with TestClient(Starlette(routes=[Mount("/ops/workflows", app=dashboard)])) as client:
        html = client.get(f"/ops/workflows/workflows/{scenario.waiting}").text
        assert 'href="/ops/workflows/static/dashboard.css"' in html
        assert f'action="/ops/workflows/workflows/{scenario.waiting}/act"' in html
        assert client.get("/ops/workflows/static/dashboard.js").status_code == 200
        paused = client.post(
            f"/ops/workflows/workflows/{scenario.waiting}/act",
            data={"action": "pause", "csrf_token": client.cookies.get("gd_csrf")},
            follow_redirects=False,
        )
        assert paused.headers["location"] == f"/ops/workflows/workflows/{scenario.waiting}"


def test_the_time_filters_narrow_by_creation_and_by_the_last_transition(
    client_for, clock, session, scenario
):
    from datetime import timedelta

    later = clock.now() + timedelta(minutes=5)
    clock.advance(timedelta(minutes=10))
    speedrun(DashOrderFlow.create(session, hero=Order(status="ok")))
    session.commit()
    client = client_for()
    created = client.get("/workflows", params={"created_after": later.isoformat()}).text
    assert len(ids_listed(created)) == 1
    changed = client.get(
        "/workflows", params={"changed_before": later.isoformat(), "state": "finished"}
    ).text
    assert ids_listed(changed) == [scenario.finished]


def test_the_workflow_page_shows_a_reattempted_executions_error_inline(client_for, session):
    from tests.admin.apps import AdminRetries

    workflow = AdminRetries.create(session, hero=Order(status="busy"))
    session.commit()
    perform_next_step(workflow, raise_errors=False)  # raised, reattempted: nothing failed
    session.commit()

    html = client_for().get(f"/workflows/{workflow.id}").text

    line = re.search(r'<p class="error-line" data-error>(.*?)</p>', html, re.S)
    assert line is not None
    assert "ConnectionError" in line.group(1) and "gateway busy, try later" in line.group(1)


def test_the_workflow_page_shows_the_trace_id_stored_with_the_workflow(
    client_for, session, scenario
):
    session.execute(
        text("UPDATE geneva_drive_workflows SET trace_context = :tp WHERE id = :id"),
        {"tp": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "id": scenario.failed},
    )
    session.commit()
    client = client_for()

    traced = client.get(f"/workflows/{scenario.failed}").text
    untraced = client.get(f"/workflows/{scenario.waiting}").text

    assert re.search(r"<dt>Trace</dt><dd[^>]*>\s*4bf92f3577b34da6a3ce929d0e0e4736", traced)
    assert "<dt>Trace</dt>" not in untraced

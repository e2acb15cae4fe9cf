"""The pages: overview, workflows, workflow, waiting, limits. Each GET reads; none writes.

Each page makes only bounded admin calls — a keyset page (never OFFSET), a count with a cap,
one workflow's timeline, the index-backed stats — so it costs the same at a thousand workflows
as at millions.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from geneva_drive import admin
from geneva_drive.admin import AdminInputError, AdminNotFound, WorkflowFilter
from geneva_drive.admin.act import actions_for
from geneva_drive.dashboard.bulk import offered
from geneva_drive.dashboard.context import Dashboard
from geneva_drive.dashboard.forms import STATES, FilterForm
from geneva_drive.dashboard.sparkline import sparkline

ANY_SIGNAL = "*"  # awaiting_signal: waits for any signal (see the waiting page)


def routes(dash: Dashboard) -> list[BaseRoute]:
    return [
        Route("/", partial(overview, dash), name="overview"),
        Route("/workflows", partial(workflows, dash), name="workflows"),
        Route("/workflows/{workflow_id:int}", partial(workflow, dash), name="workflow"),
        Route("/waiting", partial(waiting, dash), name="waiting"),
        Route("/limits", partial(limits, dash), name="limits"),
    ]


async def overview(dash: Dashboard, request: Request) -> Response:
    stats = await dash.read(lambda s: admin.stats(s, now=dash.clock.now()))
    classes: dict[str, dict[str, int]] = {}
    for workflow_type, state, n in stats.by_class_state:
        classes.setdefault(workflow_type, {})[state] = n
    return dash.render(
        request,
        "overview.html",
        {
            "stats": stats,
            "classes": sorted(classes.items()),
            "ongoing_states": [s for s in STATES if s not in ("finished", "canceled")],
            "outcomes": _outcome_totals(stats.outcomes),
            "spark": sparkline(stats.buckets),
            "live": True,
        },
    )


def _outcome_totals(counts: tuple[admin.OutcomeCount, ...]) -> list[tuple[str, int, int]]:
    """(outcome, last 5 min, last 60 min), summed over classes and steps, busiest first."""
    totals: dict[str, list[int]] = {}
    for c in counts:
        pair = totals.setdefault(c.outcome, [0, 0])
        pair[0] += c.last_5m
        pair[1] += c.last_60m
    return sorted(((o, a, b) for o, (a, b) in totals.items()), key=lambda t: (-t[2], t[0]))


async def workflows(dash: Dashboard, request: Request) -> Response:
    form = FilterForm.from_items(request.query_params.multi_items())
    after = request.query_params.get("after") or None
    oldest_first = request.query_params.get("order") == "oldest"
    try:
        where = form.to_filter()
        page, matching = await dash.read(
            lambda s: (
                admin.find(
                    s, where, newest_first=not oldest_first, limit=dash.page_size, after=after
                ),
                admin.count(s, where, cap=dash.count_cap),
            )
        )
    except AdminInputError as error:
        return dash.render(
            request, "workflows.html", _listing(form, oldest_first, error=str(error)), status=400
        )
    bulk = [a for a in offered(form.state) if await dash.permissions.allows(request, a, where)]
    context = _listing(form, oldest_first, page=page, matching=matching, after=after)
    return dash.render(request, "workflows.html", {**context, "bulk_actions": bulk})


def _listing(form: FilterForm, oldest_first: bool, **context: Any) -> dict[str, Any]:
    return {
        "form": form,
        "states": STATES,
        "order": "oldest" if oldest_first else "newest",
        "page": None,
        "matching": None,
        "after": None,
        "error": None,
        "bulk_actions": [],
        **context,
    }


@dataclass(frozen=True)
class Event:
    """One line of the timeline: an execution or an operator action, in time order."""

    at: datetime
    kind: str  # "execution" | "action"
    entry: Any


async def workflow(dash: Dashboard, request: Request) -> Response:
    workflow_id: int = request.path_params["workflow_id"]
    try:
        timeline = await dash.read(lambda s: admin.show(s, workflow_id))
    except AdminNotFound:
        return dash.not_found(request, workflow_id)
    summary = timeline.workflow
    allowed = [
        a
        # What the state allows; the admin API has the last word (it refuses what the state
        # no longer allows by the time the form is sent).
        for a in actions_for((summary.state,))
        if await dash.permissions.allows(request, a, summary)
    ]
    return dash.render(
        request,
        "workflow.html",
        {
            "t": timeline,
            "wf": summary,
            "events": timeline_events(timeline),
            "actions": allowed,
            "live": summary.state not in ("finished", "canceled"),
        },
    )


def timeline_events(timeline: admin.Timeline) -> list[Event]:
    events = [Event(e.started_at or e.scheduled_for, "execution", e) for e in timeline.executions]
    events += [Event(a.at, "action", a) for a in timeline.actions]
    return sorted(events, key=lambda e: (e.at, e.kind == "execution"))


async def waiting(dash: Dashboard, request: Request) -> Response:
    signal = request.query_params.get("signal", "").strip()
    after = request.query_params.get("after") or None
    try:
        where = WorkflowFilter(awaiting_signal=signal or ANY_SIGNAL)
        page = await dash.read(
            lambda s: admin.find(s, where, newest_first=False, limit=dash.page_size, after=after)
        )
    except AdminInputError as error:
        return dash.error(request, 400, str(error), back=dash.url(request, "waiting"))
    return dash.render(
        request,
        "waiting.html",
        {"page": page, "signal": signal, "after": after, "live": after is None},
    )


async def limits(dash: Dashboard, request: Request) -> Response:
    """Each concurrency key's holders and waiters, each rate key's recent starts."""
    found = await dash.read(lambda s: admin.limits(s, now=dash.clock.now()))
    return dash.render(request, "limits.html", {"limits": found, "live": True})

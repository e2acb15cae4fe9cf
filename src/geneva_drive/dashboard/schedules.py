"""The Schedules page: every cron schedule with its next and last tick, and pause / resume.

The page is one ``admin.schedules()`` call (a row per scheduled class). The buttons post to
one handler that, like the workflow actions (:mod:`.actions`), checks the CSRF token first,
then ``authorize(request, "pause_schedule" | "resume_schedule", schedule)`` — the target is
the :class:`geneva_drive.admin.ScheduleInfo` — and only then writes, in its own transaction.
"""

from __future__ import annotations

from functools import partial

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from geneva_drive import admin
from geneva_drive.admin import AdminNotFound
from geneva_drive.dashboard.actions import posted_form
from geneva_drive.dashboard.context import Dashboard, Refused, set_flash

ACTIONS = ("pause_schedule", "resume_schedule")


def routes(dash: Dashboard) -> list[BaseRoute]:
    return [
        Route("/schedules", partial(page, dash), name="schedules"),
        Route("/schedules/act", partial(act, dash), methods=["POST"], name="schedule_act"),
    ]


async def page(dash: Dashboard, request: Request) -> Response:
    found = await dash.read(admin.schedules)
    rows = []
    for schedule in found:
        action = "resume_schedule" if schedule.paused else "pause_schedule"
        allowed = await dash.permissions.allows(request, action, schedule)
        rows.append((schedule, action if allowed else None))
    return dash.render(request, "schedules.html", {"rows": rows, "live": True})


async def act(dash: Dashboard, request: Request) -> Response:
    back = dash.url(request, "schedules")
    try:
        form = await posted_form(dash, request)
        action, name = form.get("action", ""), form.get("workflow_type", "")
        if action not in ACTIONS:
            raise Refused(400, f"action={action!r}: expected one of {', '.join(ACTIONS)}")
        schedule = next(
            (s for s in await dash.read(admin.schedules) if s.workflow_type == name), None
        )
        if schedule is None:
            raise AdminNotFound(f"no schedule of workflow type {name!r}")
        if not await dash.permissions.allows(request, action, schedule):
            verb = action.removesuffix("_schedule")
            raise Refused(403, f"you are not allowed to {verb} the schedule of {name}")
        call = admin.pause_schedule if action == "pause_schedule" else admin.resume_schedule
        result = await dash.write(lambda s: call(s, name))
    except Refused as refused:
        return dash.error(request, refused.status, str(refused), back=back)
    except AdminNotFound as error:
        return dash.error(request, 404, str(error), back=back)
    response = RedirectResponse(back, status_code=303)
    state = "paused" if result.paused else "active"
    set_flash(request, response, dash.signer, "ok", f"{result.workflow_type}: schedule {state}")
    return response

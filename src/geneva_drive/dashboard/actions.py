"""The POST handlers: one admin action each, after the CSRF check and ``authorize``.

Order matters: the CSRF token is checked before anything else is read (a forged request learns
nothing), then permission, and only then does anything touch the database. A refusal at any
of these leaves the database as it was. A request that proves the login token by its
``Authorization`` header needs no CSRF token (see :mod:`.security`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from geneva_drive import admin
from geneva_drive.admin import AdminInputError, AdminNotFound, AdminRefused, WorkflowFilter
from geneva_drive.dashboard.bulk import checked
from geneva_drive.dashboard.context import (
    Dashboard,
    Refused,
    cookie_path,
    set_cookie,
    set_flash,
)
from geneva_drive.dashboard.forms import FilterForm, first, parse_body
from geneva_drive.dashboard.security import AUTH_COOKIE, CSRF_FIELD, csrf_ok
from geneva_drive.storage.db import engine_for_workers


def routes(dash: Dashboard) -> list[BaseRoute]:
    found: list[BaseRoute] = [
        Route("/workflows/{workflow_id:int}/act", partial(act, dash), methods=["POST"], name="act"),
        Route("/bulk", partial(bulk, dash), methods=["POST"], name="bulk"),
    ]
    if dash.permissions.login is not None:
        found += [
            Route("/login", partial(login, dash), methods=["GET", "POST"], name="login"),
            Route("/logout", partial(logout, dash), methods=["POST"], name="logout"),
        ]
    return found


@dataclass(frozen=True)
class Form:
    items: list[tuple[str, str]]  # in order, repeated keys kept (state=…&state=…)

    def get(self, key: str, default: str = "") -> str:
        found = first(self.items, key)
        return default if found is None else found


async def posted_form(dash: Dashboard, request: Request) -> Form:
    """The POSTed form, once its CSRF token has been checked (403 otherwise)."""
    try:
        items = parse_body(await request.body())
    except AdminInputError as error:
        raise Refused(400, str(error)) from None
    if dash.permissions.authenticated_by_header(request):
        return Form(items)  # not forgeable by a browser: nothing for a CSRF token to prove
    if not csrf_ok(request, dash.signer, first(items, CSRF_FIELD)):
        raise Refused(
            403,
            "the form's CSRF token is missing or does not match this browser's; reload the "
            "page and send the form again",
        )
    return Form(items)


def _refused_page(dash: Dashboard, request: Request, refused: Refused, back: str) -> Response:
    return dash.error(request, refused.status, str(refused), back=back)


async def act(dash: Dashboard, request: Request) -> Response:
    workflow_id: int = request.path_params["workflow_id"]
    back = dash.url(request, "workflow", workflow_id=workflow_id)
    try:
        form = await posted_form(dash, request)
        action = form.get("action", "")
        if action not in admin.ACTIONS:
            raise Refused(400, f"action={action!r}: expected one of {', '.join(admin.ACTIONS)}")
        summary = await _summary(dash, workflow_id)
        if not await dash.permissions.allows(request, action, summary):
            raise Refused(403, f"you are not allowed to {action} workflow {workflow_id}")
        call = _action_call(action, form, actor=dash.actor(request))
        result = await dash.write(lambda s: call(s, workflow_id))
    except Refused as refused:
        return _refused_page(dash, request, refused, back)
    except AdminNotFound:
        return dash.not_found(request, workflow_id)
    except AdminRefused as error:
        return dash.error(request, 409, str(error), back=back)
    except AdminInputError as error:
        return dash.error(request, 400, str(error), back=back)
    response = RedirectResponse(back, status_code=303)
    set_flash(request, response, dash.signer, "ok", _done(result))
    return response


def _done(result: admin.ActionResult) -> str:
    text = f"{result.action}: {result.change}"
    return f"{text} ({result.detail})" if result.detail else text


async def _summary(dash: Dashboard, workflow_id: int) -> admin.WorkflowSummary:
    page = await dash.read(lambda s: admin.find(s, WorkflowFilter(ids=(workflow_id,)), limit=1))
    if not page.items:
        raise AdminNotFound(f"no workflow with id={workflow_id}")
    return page.items[0]


def _aware_time(raw: str) -> datetime | None:
    """The optional "due at" of a form: an ISO 8601 time with its offset, or nothing."""
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        value = None
    if value is None or value.tzinfo is None:
        raise Refused(
            400,
            f"due at: expected an ISO 8601 time with its UTC offset, e.g. "
            f"2026-12-07T09:00+01:00, got {raw!r}",
        )
    return value


def _action_call(action: str, form: Form, *, actor: str) -> Any:
    """``(session, workflow_id) -> ActionResult`` for the form's action and arguments."""
    reason = form.get("reason", "").strip() or None
    common: dict[str, Any] = {"actor": actor, "reason": reason}
    if action == "resume_at":
        step = form.get("step", "").strip()
        if not step:
            raise Refused(400, "resume at which step? choose one")
        until = _aware_time(form.get("wait_until", "").strip())
        return lambda s, i: admin.resume_at(s, i, step, wait_until=until, **common)
    if action == "signal":
        name = form.get("signal_name", "").strip()
        if not name:
            raise Refused(400, "send which signal? type its name")
        payload = _payload(form.get("payload", ""))
        key = form.get("key", "").strip() or None
        return lambda s, i: admin.signal(s, i, name, payload=payload, key=key, **common)
    verb = getattr(admin, action)
    return lambda s, i: verb(s, i, **common)


def _payload(text: str) -> Any:
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise Refused(
            400,
            f"the signal payload is not JSON ({error.msg} at line {error.lineno}, column "
            f'{error.colno}); write e.g. {{"approved": true}}, or leave it empty for none',
        ) from None


async def bulk(dash: Dashboard, request: Request) -> Response:
    back = dash.url(request, "workflows")
    try:
        form = await posted_form(dash, request)
        back = f"{back}?{FilterForm.from_items(form.items).query()}"
        wanted = await checked(dash, request, form.items)
        action = wanted.action
        result = await _bulk(dash, action, wanted.where, dash.actor(request), form)
    except Refused as refused:
        return _refused_page(dash, request, refused, back)
    except AdminInputError as error:
        return dash.error(request, 400, str(error), back=back)
    response = RedirectResponse(back, status_code=303)
    message = f"{action}: {len(result.changed):,} of {result.matched:,} matching changed"
    if result.refused:
        message += (
            f"; {len(result.refused):,} refused (first: #{result.refused[0][0]}: "
            f"{result.refused[0][1]})"
        )
    set_flash(request, response, dash.signer, "ok" if not result.refused else "warn", message)
    return response


async def _bulk(
    dash: Dashboard, action: str, where: WorkflowFilter, actor: str, form: Form
) -> admin.BulkResult:
    reason = form.get("reason", "").strip() or None
    # Each batch is its own transaction, of geneva-drive's own session kind (see Dashboard.write).
    factory = sessionmaker(bind=engine_for_workers(dash.engine), class_=Session)
    return await run_in_threadpool(
        lambda: admin.bulk(factory, action, where, actor=actor, reason=reason)
    )


async def login(dash: Dashboard, request: Request) -> Response:
    assert dash.permissions.login is not None  # the route exists only with a login token
    target = _safe_next(dash, request, request.query_params.get("next", ""))
    if request.method == "GET":
        return dash.render(request, "login.html", {"next": target, "error": None})
    try:
        form = await posted_form(dash, request)
    except Refused as refused:
        return _refused_page(dash, request, refused, dash.url(request, "login"))
    target = _safe_next(dash, request, form.get("next", ""))
    if not dash.permissions.login.matches(form.get("token", "")):
        context = {"next": target, "error": "that is not the dashboard's token"}
        return dash.render(request, "login.html", context, status=403)
    response = RedirectResponse(target, status_code=303)
    set_cookie(request, response, AUTH_COOKIE, dash.permissions.login.cookie_value())
    return response


async def logout(dash: Dashboard, request: Request) -> Response:
    try:
        await posted_form(dash, request)
    except Refused as refused:
        return _refused_page(dash, request, refused, dash.url(request, "overview"))
    response = RedirectResponse(dash.url(request, "overview"), status_code=303)
    response.delete_cookie(AUTH_COOKIE, path=cookie_path(request))
    return response


def _safe_next(dash: Dashboard, request: Request, target: str) -> str:
    """Where to go after logging in: a path of this dashboard only (never another site)."""
    root = cookie_path(request)
    if target.startswith(root) and not target.startswith("//") and "\\" not in target:
        return target
    return dash.url(request, "overview")

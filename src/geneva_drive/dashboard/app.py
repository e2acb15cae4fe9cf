"""``create_app()``: the dashboard as a Starlette app, to mount in any ASGI application.

Every page is one or two bounded ``geneva_drive.admin`` calls and a template; every button is one
admin action behind a CSRF check and ``authorize`` (see :mod:`.security`). Pages read in their
own short session; an action runs in its own transaction, committed before the redirect.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import jinja2
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from geneva_drive.core.clock import Clock, SystemClock
from geneva_drive.dashboard import format as fmt
from geneva_drive.dashboard.security import (
    CSRF_COOKIE,
    CSRF_FIELD,
    SECURITY_HEADERS,
    Authorize,
    LoginToken,
    Permissions,
    Signer,
    csrf_token,
)
from geneva_drive.storage.db import engine_for_workers, prepare_engine

HERE = Path(__file__).parent
FLASH_COOKIE = "gd_flash"
T = TypeVar("T")


def default_actor(request: Request) -> str:
    """Who the timeline names for an action: the ASGI user if the app authenticates, else
    ``dashboard``."""
    user = request.scope.get("user")
    name = getattr(user, "display_name", None) or getattr(user, "username", None)
    return f"dashboard:{name}" if name else "dashboard"


@dataclass(frozen=True)
class Dashboard:
    """What every page handler needs; one per ``create_app()`` call (no globals)."""

    engine: Engine
    permissions: Permissions
    signer: Signer
    templates: Jinja2Templates
    clock: Clock
    title: str
    refresh_seconds: float
    page_size: int
    count_cap: int
    actor: Callable[[Request], str]

    # -- the database ------------------------------------------------------------------------

    async def read(self, work: Callable[[Session], T]) -> T:
        """Run ``work`` in a read-only session on a worker thread (admin calls are blocking)."""

        def run() -> T:
            with Session(self.engine) as session:
                return work(session)  # closing rolls back: a page never writes

        return await run_in_threadpool(run)

    async def write(self, work: Callable[[Session], T]) -> T:
        def run() -> T:
            # geneva-drive's own session kind: on SQLite it takes the write lock up front
            # (BEGIN IMMEDIATE), as the worker's transactions do, so it queues instead of
            # failing with SQLITE_BUSY_SNAPSHOT against a worker that wrote meanwhile.
            with Session(engine_for_workers(self.engine)) as session:
                result = work(session)
                session.commit()
                return result

        return await run_in_threadpool(run)

    # -- responses ---------------------------------------------------------------------------

    def url(self, request: Request, name: str, **params: Any) -> str:
        """A path under wherever the app is mounted (the request's ``root_path``)."""
        # request.app is this Starlette app even when mounted (it sets scope["app"] to itself),
        # while request.url_for() would ask the outermost router, which knows other names.
        root = str(request.scope.get("root_path", "")).rstrip("/")
        return root + str(request.app.url_path_for(name, **params))

    def render(
        self, request: Request, template: str, context: dict[str, Any], *, status: int = 200
    ) -> Response:
        flash = read_flash(request, self.signer)
        response = self.templates.TemplateResponse(
            request,
            template,
            {
                "dash": self,
                "url": lambda name, **params: self.url(request, name, **params),
                "csrf_field": CSRF_FIELD,
                "csrf_token": csrf_token(request, self.signer),
                "now": self.clock.now(),
                "flash": flash,
                "logged_in": self.permissions.login is not None
                and self.permissions.login.logged_in(request),
                **context,
            },
            status_code=status,
        )
        finish(request, response)
        if flash is not None:
            response.delete_cookie(FLASH_COOKIE, path=cookie_path(request))
        return response

    def error(
        self, request: Request, status: int, message: str, back: str | None = None
    ) -> Response:
        return self.render(
            request,
            "error.html",
            {"status": status, "message": message, "back": back},
            status=status,
        )


def cookie_path(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/") + "/"


def set_cookie(request: Request, response: Response, name: str, value: str) -> None:
    """A cookie of this dashboard: its own path, never read by scripts, not sent cross-site
    with a POST (SameSite=Lax keeps it on links into the dashboard)."""
    response.set_cookie(
        name,
        value,
        path=cookie_path(request),
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )


def finish(request: Request, response: Response) -> None:
    """Set the CSRF cookie if this request made a new token (the page's forms carry it)."""
    token = getattr(request.state, "new_csrf", None)
    if token is not None:
        set_cookie(request, response, CSRF_COOKIE, token)


def set_flash(request: Request, response: Response, signer: Signer, kind: str, text: str) -> None:
    """A one-time message for the next page (signed, so a link cannot forge one)."""
    data = base64.urlsafe_b64encode(json.dumps([kind, text[:500]]).encode()).decode()
    set_cookie(request, response, FLASH_COOKIE, f"{data}.{signer.sign('flash:' + data)}")


def read_flash(request: Request, signer: Signer) -> tuple[str, str] | None:
    raw = request.cookies.get(FLASH_COOKIE, "")
    data, _, signature = raw.partition(".")
    if not data or signature != signer.sign("flash:" + data):
        return None
    try:
        kind, text = json.loads(base64.urlsafe_b64decode(data))
    except ValueError:
        return None
    return str(kind), str(text)


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every response, pages and static files alike."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                for name, value in SECURITY_HEADERS.items():
                    if name.lower().encode() not in present:
                        headers.append((name.lower().encode(), value.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every value a template prints is escaped, whatever its source
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        timestamp=fmt.timestamp,
        seconds=fmt.seconds,
        pretty_json=fmt.pretty_json,
        number=fmt.number,
    )
    env.globals.update(age=fmt.age)
    return Jinja2Templates(env=env)


def create_app(
    *,
    engine: Engine,
    authorize: Authorize | None = None,
    title: str = "geneva-drive",
    token: str | None = None,
    actor: Callable[[Request], str] = default_actor,
    secret: str | bytes | None = None,
    refresh_seconds: float = 5.0,
    page_size: int = 50,
    count_cap: int = 10_000,
    clock: Clock | None = None,
) -> Starlette:
    """The dashboard as an ASGI app: mount it under any prefix, or serve it on its own.

    Read-only unless ``authorize(request, action, target)`` returns True for an action
    (``target``: the workflow's summary, or the filter of a bulk action); with ``token`` the
    dashboard has a login form and an action also needs that token. ``actor(request)`` is the
    name recorded with each action. ``secret`` signs CSRF tokens and messages; by default it is
    random per process (set one when several processes serve the dashboard).
    """
    from geneva_drive.dashboard import actions, pages

    if refresh_seconds <= 0 or page_size < 1 or count_cap < 1:
        raise ValueError(
            f"create_app(refresh_seconds={refresh_seconds!r}, page_size={page_size!r}, "
            f"count_cap={count_cap!r}): each must be positive"
        )
    prepare_engine(engine)
    signer = Signer.create(secret)
    login = LoginToken(token, signer) if token else None
    dash = Dashboard(
        engine=engine,
        permissions=Permissions(authorize=authorize, login=login),
        signer=signer,
        templates=_templates(),
        clock=clock or SystemClock(),
        title=title,
        refresh_seconds=refresh_seconds,
        page_size=page_size,
        count_cap=count_cap,
        actor=actor,
    )
    routes: list[BaseRoute] = [*pages.routes(dash), *actions.routes(dash)]
    routes.append(Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"))
    app = Starlette(routes=routes)
    app.add_middleware(SecurityHeaders)
    return app

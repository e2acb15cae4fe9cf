"""``create_app()``: the dashboard as a Starlette app, to mount in any ASGI application.

Every page is one or two bounded ``geneva_drive.admin`` calls and a template; every button is one
admin action behind a CSRF check and ``authorize`` (see :mod:`.security`). Pages read in their
own short session; an action runs in its own transaction, committed before the redirect.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jinja2
from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from geneva_drive.core.clock import Clock, SystemClock
from geneva_drive.dashboard import actions, bulk, pages, schedules
from geneva_drive.dashboard import format as fmt
from geneva_drive.dashboard.context import Dashboard, default_actor
from geneva_drive.dashboard.security import (
    SECURITY_HEADERS,
    Authorize,
    LoginToken,
    Permissions,
    Signer,
)
from geneva_drive.storage.db import prepare_engine

HERE = Path(__file__).parent


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
    env.globals.update(
        age=fmt.age,
        action_change=fmt.action_change,
        action_record=fmt.ACTION_RECORD,
        destructive=bulk.DESTRUCTIVE,
    )
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
    routes: list[BaseRoute] = [
        *pages.routes(dash),
        *bulk.routes(dash),
        *actions.routes(dash),
        *schedules.routes(dash),
    ]
    routes.append(Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"))
    app = Starlette(routes=routes)
    app.add_middleware(SecurityHeaders)
    return app

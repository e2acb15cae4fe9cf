"""What the pages and the actions share: the dashboard's state (:class:`Dashboard`), the
actor's name, and the cookies and flash messages they set."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from geneva_drive.core.clock import Clock
from geneva_drive.dashboard.security import (
    CSRF_COOKIE,
    CSRF_FIELD,
    Permissions,
    Signer,
    csrf_token,
)
from geneva_drive.storage.db import engine_for_workers

FLASH_COOKIE = "gd_flash"
T = TypeVar("T")


def default_actor(request: Request) -> str:
    """Who the timeline names for an action: the ASGI user if the app authenticates, else
    ``dashboard``."""
    user = request.scope.get("user")
    name = getattr(user, "display_name", None) or getattr(user, "username", None)
    return f"dashboard:{name}" if name else "dashboard"


class Refused(Exception):
    """A request the dashboard turns down before acting: its status and what to do instead."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


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

    def not_found(self, request: Request, workflow_id: int) -> Response:
        """The 404 for a workflow id: what to do on this dashboard, not in Python or a shell."""
        message = (
            f"No workflow has id {workflow_id} (housekeeping may have deleted it, or the link "
            "is wrong); find workflows on the Workflows page: search by hero id, or filter by "
            "class or state"
        )
        return self.error(request, 404, message, back=self.url(request, "workflows"))

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

"""The geneva-drive dashboard for the back office, behind the ops token.

Every request under the mount needs the token (``ORDERS_OPS_TOKEN``): as ``Authorization:
Bearer <token>`` from a script, or as the password of HTTP Basic authentication, which a browser
asks for after the 401 (the user name is recorded as who acted). No credentials is a 401, a
wrong token a 403. The dashboard itself reads every page for whoever reaches it and asks its
``authorize`` hook before each action; this is where a real app plugs in its own users and
roles instead.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from typing import Any

from sqlalchemy import Engine
from starlette.authentication import SimpleUser
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from geneva_drive.dashboard import create_app as create_dashboard


def dashboard(engine: Engine, *, token: str) -> ASGIApp:
    """The dashboard, to mount at ``/ops``: pages and actions for the token's holders only."""

    def authorize(request: Request, action: str, target: Any) -> bool:
        # The guard below let only the token's holders in; an app with roles would check, e.g.,
        # that ``request.user`` may ``cancel`` (every action is one of geneva_drive.admin's).
        return isinstance(request.scope.get("user"), SimpleUser)

    return TokenGuard(
        create_dashboard(engine=engine, authorize=authorize, title="Orders — workflows"),
        token=token,
    )


class TokenGuard:
    """ASGI middleware: 401 without credentials, 403 with the wrong token, else the app with
    ``scope["user"]`` set (the dashboard names it as the actor of what they do)."""

    def __init__(self, app: ASGIApp, *, token: str) -> None:
        if not token:
            raise ValueError("TokenGuard(token=''): an empty token would let anyone in")
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            user, given = _credentials(Request(scope))
            if given is None:
                refusal = PlainTextResponse(
                    "the ops dashboard needs the ops token (Authorization: Bearer <token>)",
                    status_code=401,
                    headers={"WWW-Authenticate": 'Basic realm="ops", charset="UTF-8"'},
                )
                await refusal(scope, receive, send)
                return
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                await PlainTextResponse("wrong ops token", status_code=403)(scope, receive, send)
                return
            scope = {**scope, "user": SimpleUser(user)}
        await self.app(scope, receive, send)


def _credentials(request: Request) -> tuple[str, str | None]:
    """(user name, token given) from a Bearer or Basic ``Authorization`` header."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return "ops", value.strip()
    if scheme.lower() == "basic":
        try:
            user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return "ops", None
        return user or "ops", password or None
    return "ops", None

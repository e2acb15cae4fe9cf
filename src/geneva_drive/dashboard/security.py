"""What keeps the dashboard safe: CSRF tokens, the login token, who may do what, headers.

- Every POST carries a CSRF token (a signed double-submit cookie): the page puts the cookie's
  value in a hidden field, and a POST whose field does not match its cookie, or whose cookie
  was not signed by this app, is refused with 403 before anything else runs. A signature, not
  just a random value, so a cookie planted from a sibling subdomain cannot pass. The one
  exception: a POST that carries the login token in its ``Authorization: Bearer`` header (a
  script). CSRF rides on credentials the browser attaches by itself, cookies; no page of
  another site can make a browser send that header, so such a request cannot be forged.
- ``authorize(request, action, target)`` decides every action; without one the dashboard is
  read-only. ``target`` is the workflow's :class:`~geneva_drive.admin.WorkflowSummary` for an
  action on one workflow, the :class:`~geneva_drive.admin.WorkflowFilter` for a bulk action.
- With a login token (``geneva-drive dashboard --token``) an action also needs the token: as a
  cookie set by the login form, or an ``Authorization: Bearer`` header.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

Authorize = Callable[[Request, str, Any], "bool | Awaitable[bool]"]

CSRF_COOKIE = "gd_csrf"
CSRF_FIELD = "csrf_token"
AUTH_COOKIE = "gd_auth"

# Browsers send these on every request: a page may not be framed, load foreign scripts, or run
# inline ones — so even markup that slipped past escaping could not execute.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class Signer:
    """HMAC-SHA256 under the app's secret (random per process unless one is given)."""

    secret: bytes

    @classmethod
    def create(cls, secret: str | bytes | None) -> Signer:
        if secret is None:
            return cls(secrets.token_bytes(32))
        return cls(secret.encode() if isinstance(secret, str) else secret)

    def sign(self, value: str) -> str:
        return hmac.new(self.secret, value.encode(), hashlib.sha256).hexdigest()

    def token(self) -> str:
        nonce = secrets.token_urlsafe(18)
        return f"{nonce}.{self.sign('csrf:' + nonce)}"

    def valid_token(self, token: str | None) -> bool:
        if not token or token.count(".") != 1:
            return False
        nonce, signature = token.split(".")
        return hmac.compare_digest(signature, self.sign("csrf:" + nonce))


def csrf_token(request: Request, signer: Signer) -> str:
    """The token for this browser: its cookie's, if signed by us, else a new one (which the
    response then sets; see ``app.py``)."""
    existing = request.cookies.get(CSRF_COOKIE)
    if signer.valid_token(existing):
        return str(existing)
    token: str | None = getattr(request.state, "new_csrf", None)
    if token is None:
        token = signer.token()
        request.state.new_csrf = token
    return token


def csrf_ok(request: Request, signer: Signer, submitted: str | None) -> bool:
    cookie = request.cookies.get(CSRF_COOKIE)
    return (
        signer.valid_token(cookie)
        and submitted is not None
        and hmac.compare_digest(str(cookie), submitted)
    )


@dataclass(frozen=True)
class LoginToken:
    """The shared secret of ``geneva-drive dashboard --token``."""

    token: str
    signer: Signer

    def cookie_value(self) -> str:
        # The cookie proves the token was typed, without storing the token itself.
        return self.signer.sign("login:" + self.token)

    def matches(self, typed: str) -> bool:
        return hmac.compare_digest(typed.encode(), self.token.encode())

    def logged_in(self, request: Request) -> bool:
        bearer = _bearer(request)
        if bearer is not None:  # a header, right or wrong, decides: no falling back to cookies
            return self.matches(bearer)
        cookie = request.cookies.get(AUTH_COOKIE)
        return cookie is not None and hmac.compare_digest(cookie, self.cookie_value())

    def by_header(self, request: Request) -> bool:
        """Whether the request carries the right token in its ``Authorization`` header."""
        bearer = _bearer(request)
        return bearer is not None and self.matches(bearer)


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    return header[7:].strip() if header.lower().startswith("bearer ") else None


@dataclass(frozen=True)
class Permissions:
    """Whether a request may perform an action: the login token first, then ``authorize``."""

    authorize: Authorize | None
    login: LoginToken | None

    @property
    def read_only(self) -> bool:
        return self.authorize is None and self.login is None

    def authenticated_by_header(self, request: Request) -> bool:
        """Whether the request proves the login token by header, which no browser sends on
        its own: it needs no CSRF token (a cookie session does)."""
        return self.login is not None and self.login.by_header(request)

    async def allows(self, request: Request, action: str, target: Any) -> bool:
        if self.read_only:
            return False
        if self.login is not None and not self.login.logged_in(request):
            return False
        if self.authorize is None:
            return True
        verdict = self.authorize(request, action, target)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        return verdict is True

"""Text no database of ours can store, and the one rule for it — the same on every database.

PostgreSQL cannot store NUL (``\\x00``) in a text or JSON column, and no driver can encode a
lone surrogate (``\\ud800``, half of a UTF-16 pair) as UTF-8. SQLite and MariaDB would take
NUL; storing it there and not on PostgreSQL would make an application's behaviour depend on
its database, so the strictest database sets the rule for all three:

- **Values the caller chose** — signal names, payloads and idempotency keys, metadata,
  ``create()``'s hero key and ``step_job_options``, resumable cursors, an operator's actor and
  reason — are *refused*, before any SQL runs, with
  :class:`~geneva_drive.core.errors.UnstorableTextError` (a ``ValueError``) naming the workflow,
  the field and the position. The caller's transaction stays usable and nothing is written.
- **Text the engine records on its own** — a step's error class, message and backtrace — is
  *sanitised*: each such character becomes its Python escape (``\\x00``, ``\\ud800``), as
  ``repr()`` would show it, so a step raising ``ValueError("a\\x00b")`` fails like any other.
- **Read-only filters** (the admin API, the dashboard's query parameters, the CLI's
  ``--where``) refuse it as admin input (a 400, a usage error): no stored text holds it.

Pure: nothing here touches a database.
"""

from __future__ import annotations

import re

from geneva_drive.core.errors import UnstorableTextError

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")

RULE = (
    "PostgreSQL cannot store NUL in text or JSON and no driver can encode a lone surrogate, so "
    "geneva-drive refuses both on every database; remove the character, or encode the value "
    "first (base64, say)"
)


def _first(text: str) -> re.Match[str] | None:
    if text.isascii() and "\x00" not in text:  # the usual case, without the regex
        return None
    return _UNSTORABLE.search(text)


def describe(text: str) -> str | None:
    """``"a NUL character (\\x00) at position 3"``, for the first character of ``text`` that
    cannot be stored; None if every one can."""
    found = _first(text)
    if found is None:
        return None
    what = "a NUL character" if found.group() == "\x00" else "a lone surrogate"
    return f"{what} ({_escape(found)}) at position {found.start()}"


def check(text: str, what: str) -> None:
    """Refuse ``text`` with an :class:`UnstorableTextError` if it cannot be stored.

    ``what`` names the workflow and the field, e.g. ``"Onboarding id=4: signal('paid')
    idempotency_key"``.
    """
    problem = describe(text)
    if problem is not None:
        raise UnstorableTextError(f"{what} {text!r:.80} holds {problem}; {RULE}")


def sanitised(text: str, *, limit: int | None = None) -> str:
    """``text`` with each character that cannot be stored replaced by its escape, cut to
    ``limit`` characters (the column's length) if it is longer."""
    if _first(text) is not None:
        text = _UNSTORABLE.sub(_escape, text)
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def message_of(error: BaseException) -> str:
    """``str(error)``, sanitised; a stand-in if the application's ``__str__`` raises (its
    step must still end, and be logged)."""
    try:
        return sanitised(str(error))
    except Exception as broken:
        return f"<{type(error).__qualname__}.__str__ raised {type(broken).__qualname__}>"


def _escape(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

"""Side effects that tell of a transaction's writes — log lines, counts — run once it commits.

A pause logged before its transaction commits leaves a log line behind when the transaction
rolls back. :func:`after_commit` holds such an action until the session's outermost commit
and drops it if the (sub)transaction it was recorded in rolls back, as the wake-ups do
(``engine.wakeups``). Outside a transaction the action runs at once.

Actions must not read mapped instances: they run after the commit has expired them. Build
the message and context first, and defer only the call that tells it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from geneva_drive.storage.queries.bypass import inside

log = logging.getLogger("geneva_drive")

_PENDING = "geneva_drive_after_commit"
_LISTENING = "geneva_drive_after_commit_listening"


def after_commit(session: Session, action: Callable[[], None]) -> None:
    """Run ``action`` once ``session``'s transaction commits; never if it rolls back."""
    if not session.in_transaction():
        action()
        return
    if _LISTENING not in session.info:
        # Per-session listeners (nothing global is installed); they stay for the session's
        # life because SQLAlchemy forbids removing a listener while it is being dispatched.
        session.info[_LISTENING] = True
        event.listen(session, "after_commit", _after_commit)
        event.listen(session, "after_soft_rollback", _after_soft_rollback)
    # The innermost transaction: a rolled-back savepoint drops only its own actions.
    transaction = session.get_nested_transaction() or session.get_transaction()
    session.info.setdefault(_PENDING, []).append((transaction, action))


def _after_commit(session: Session) -> None:
    # Also fired when a savepoint is released; only the outermost commit makes it so.
    if session.in_nested_transaction():
        return
    pending: list[tuple[Any, Callable[[], None]]] = session.info.pop(_PENDING, None) or []
    for _, action in pending:
        try:
            action()
        except Exception:  # the transaction is committed: telling of it must not undo that
            log.exception("an after-commit action failed")


def _after_soft_rollback(session: Session, rolled_back: Any) -> None:
    pending = session.info.get(_PENDING) or []
    session.info[_PENDING] = [(tx, a) for tx, a in pending if not inside(tx, rolled_back)]

"""The async twins' one mechanism: the sync verb, run on an ``AsyncSession``'s own ``Session``.

``await Onboarding.acreate(session, …)``, ``await wf.asignal(…)``, ``await wf.apause()`` and
the admin twins are not async copies of the sync API. An ``AsyncSession`` is a facade over a
plain ``Session`` (``session.sync_session``) whose connection is the async driver adapted to
the DBAPI; ``AsyncSession.run_sync(fn)`` runs ``fn`` on that ``Session`` in a greenlet, and
each statement it sends awaits the driver on the event loop. So a twin runs the very
statements, row locks, uniqueness checks and decisions of its sync verb — written once, so
they cannot drift apart — in the caller's transaction: nothing here commits. The wake-ups
are after-commit actions on that same ``Session`` (``engine.committed``), and ``await
session.commit()`` commits it: a worker is woken by the async commit and never by a rollback.
An error the verb raises comes out of ``run_sync`` unchanged (same class, same message).

Mixing the two is a ``TypeError`` before anything is written, naming the call to use: a sync
``Session`` given to a twin, an ``AsyncSession`` given to a sync verb.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.orm import Session, object_session

from geneva_drive.core.errors import InvalidStateError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

T = TypeVar("T")


def is_async_session(session: Any) -> bool:
    # No AsyncSession can exist before SQLAlchemy's asyncio extension is imported: the sync
    # API does not import it (nor greenlet) just to ask.
    module = sys.modules.get("sqlalchemy.ext.asyncio")
    return module is not None and isinstance(session, module.AsyncSession)


def refuse_async_session(session: Any, call: str, twin: str) -> None:
    """For a sync verb: ``session`` must not be an ``AsyncSession``."""
    if is_async_session(session):
        raise TypeError(
            f"{call}: got an AsyncSession, which this sync call cannot use; in async code "
            f"call `await {twin}` with it instead"
        )


async def run_on(session: Any, call: str, sync_call: str, work: Callable[[Session], T]) -> T:
    """``work(session.sync_session)`` in the caller's async transaction (see the module doc).

    ``call`` is the twin being awaited and ``sync_call`` its sync verb, for the error a sync
    ``Session`` (or anything else) gets.
    """
    from sqlalchemy.ext.asyncio import AsyncSession

    if not isinstance(session, AsyncSession):
        if isinstance(session, Session):
            raise TypeError(
                f"{call}: got a sync {type(session).__name__}; {call} takes an AsyncSession. "
                f"With a sync Session, call {sync_call} (without await)"
            )
        raise TypeError(f"{call}: expected an AsyncSession, got {session!r:.80}")
    return await session.run_sync(work)


def async_session_of(workflow: Any, call: str, sync_call: str) -> AsyncSession:
    """The ``AsyncSession`` that loaded (or created) ``workflow``, for its instance twins."""
    from sqlalchemy.ext.asyncio import async_object_session

    session = async_object_session(workflow)
    if session is not None:
        return session
    label = f"{type(workflow).__name__} id={workflow.id}"
    if object_session(workflow) is not None:
        raise TypeError(
            f"{label}: {call} needs a workflow loaded through an AsyncSession; this one "
            f"belongs to a sync Session: call {sync_call} (without await)"
        )
    raise InvalidStateError(
        f"{label}: this workflow is not attached to a session; load it with "
        "`await session.get(...)` first"
    )

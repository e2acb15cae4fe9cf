"""The admin API's async twins: ``await admin.apause(session, 42, actor=…)`` on an
``AsyncSession``.

Each twin is its sync function run on the session's ``sync_session`` through
``AsyncSession.run_sync`` (see ``definition.async_bridge`` for why): the same statements, row
locks, savepoints, operator-action rows, refusals and results, in the caller's transaction
(nothing is committed here), and the wake-ups an action schedules leave with ``await
session.commit()``. :func:`~geneva_drive.admin.bulk` has no twin: it commits batch after
batch on sessions of its own, which is an operator's job for the CLI, not a request's.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy.orm import Session

from geneva_drive.admin.act import cancel, pause, resume, resume_at, retry, signal, skip
from geneva_drive.admin.find import count, find
from geneva_drive.admin.heroes import for_hero
from geneva_drive.admin.inspect import show
from geneva_drive.admin.measure import stats
from geneva_drive.definition.async_bridge import run_on

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

P = ParamSpec("P")
R = TypeVar("R")


def _twin(
    sync: Callable[Concatenate[Session, P], R],
) -> Callable[Concatenate[AsyncSession, P], Coroutine[Any, Any, R]]:
    name = sync.__name__

    async def twin(session: AsyncSession, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await run_on(
            session,
            f"admin.a{name}()",
            f"admin.{name}()",
            lambda sync_session: sync(sync_session, *args, **kwargs),
        )

    twin.__name__ = twin.__qualname__ = f"a{name}"
    twin.__doc__ = (
        f":func:`geneva_drive.admin.{name}` on an ``AsyncSession``, in its transaction: the "
        "same statements, locks, results and errors (it runs on the session's sync_session)."
    )
    return twin


apause = _twin(pause)
aresume = _twin(resume)
askip = _twin(skip)
acancel = _twin(cancel)
aretry = _twin(retry)
aresume_at = _twin(resume_at)
asignal = _twin(signal)
afind = _twin(find)
acount = _twin(count)
afor_hero = _twin(for_hero)
ashow = _twin(show)
astats = _twin(stats)

__all__ = [
    "acancel",
    "acount",
    "afind",
    "afor_hero",
    "apause",
    "aresume",
    "aresume_at",
    "aretry",
    "ashow",
    "asignal",
    "askip",
    "astats",
]

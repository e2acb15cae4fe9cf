"""Awaiting what the application's code returns: ``async def`` steps, conditions and hooks.

The phases of a step (``engine.executor``) are plain synchronous code, and there is one copy
of them. Where they call the application's code — a step body, ``skip_if``/``cancel_if``, a
hook, an exception handler, a signal matcher — and get an awaitable back, :func:`settle`
awaits it, in one of two ways:

* **On the worker's event loop** (``runtime.async_lane``): the phases run inside a greenlet
  that SQLAlchemy's ``greenlet_spawn`` started on the loop, over an async driver (aiosqlite,
  psycopg's async connection). ``await_only`` suspends the greenlet until the awaitable is
  done; meanwhile the loop runs other steps. Sync code stays sync; I/O awaits on the loop.
* **Anywhere else** (a step thread, a Celery task, ``run_execution`` in a test): there is no
  loop to suspend to, so the awaitable runs to completion on an event loop of its own in the
  calling thread, which blocks for it — exactly as long as a sync step doing the same work.

Either way, what the awaitable does to the database goes through the step's own session
(``Workflow.async_session``), so it commits or rolls back with the step's outcome.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar, cast

from sqlalchemy.util.concurrency import await_only, in_greenlet

T = TypeVar("T")

__all__ = ["settle"]


def settle(value: Any) -> Any:
    """``value`` itself, or what it resolves to when it is awaitable (see the module doc)."""
    if value is None or not inspect.isawaitable(value):
        return value  # the sync hot path: one check
    if in_greenlet():
        return _drive(value if inspect.iscoroutine(value) else _awaited(value))
    return _run_alone(value)


def _drive(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` in this greenlet, as an asyncio task would, awaiting on the loop only
    what it waits for at the bottom (a future).

    Not ``await_only(coroutine)``, which would run the coroutine's own code on the loop,
    outside the greenlet: there a sync database call made by the step — ``self.hero``, a lazy
    attribute, ``self.session.execute`` — finds no greenlet to suspend and fails. Here the
    coroutine's code runs in the step's greenlet, so sync calls suspend it as the phases'
    own do, and ``self.session`` works in an ``async def`` step as well as in a sync one.
    """
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            yielded = coroutine.send(value) if error is None else coroutine.throw(error)
        except StopIteration as stop:
            return cast("T", stop.value)
        value, error = None, None
        try:
            await_only(_until_done(yielded))
        except BaseException as raised:  # the task was cancelled: the coroutine decides
            error = raised


async def _until_done(yielded: Any) -> None:
    """Wait for what a coroutine yielded to its task: a future (asyncio's protocol: the task
    waits for it, then resumes the coroutine, which reads the result itself) or nothing (a
    bare yield, ``asyncio.sleep(0)``)."""
    if yielded is None:
        await asyncio.sleep(0)
        return
    if getattr(yielded, "_asyncio_future_blocking", None) is None:
        raise RuntimeError(
            f"an async step awaited {yielded!r}, which is not an asyncio future: geneva-drive "
            "runs async steps on asyncio (trio and curio awaitables cannot run there)"
        )
    yielded._asyncio_future_blocking = False  # what asyncio.Task does before waiting
    try:
        await asyncio.wait([yielded])
    except asyncio.CancelledError:
        yielded.cancel()  # as Task.cancel() cancels the future its coroutine waits for
        raise


def _run_alone(awaitable: Awaitable[T]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(awaitable))
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()  # no "coroutine was never awaited" warning on top of this error
    raise RuntimeError(
        f"cannot await {awaitable!r}: geneva-drive was called synchronously from a thread "
        "whose event loop is running (an async application calling run_execution?), and "
        "blocking that loop to run the step would stall it; run the step from a worker "
        "(`geneva-drive worker` runs async steps on its own event loop), or call the sync "
        "API through `await loop.run_in_executor(None, ...)`"
    )


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable

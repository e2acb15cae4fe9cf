"""Waking the async lane's claimer: what :class:`worker.IdleThreads` is to the step threads.

A wake-up comes from another thread — the worker's LISTEN thread (a NOTIFY), or any thread
of this process whose commit made a row due (``DatabaseBackend.enqueue``) — and reaches the
lane's event loop through ``call_soon_threadsafe``. The lane has **one** claimer
(``async_lane``), so there is one sleeper to wake, and nothing to relay: the claimer claims
again and again after a wake-up while its claims find rows and it has a free slot, then
sleeps once a claim comes back empty. Wake-ups that come while it is awake are remembered as
one (:meth:`sleep` returns at once): any number of them cost it one more claim, not one each.

Everything but :meth:`set` and :meth:`close` runs on the lane's loop, so only the loop
reference and the wake-ups that come before the loop starts need the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class LaneWakeups:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._early = False  # a wake-up came before the loop ran (under the lock)
        self._pending = False  # one came while the claimer was awake (on the loop)
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False

    def attach(self) -> None:
        """Called on the lane's loop when it starts: wake-ups go to it from now on."""
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._pending = self._early

    def detach(self) -> None:
        """The loop is ending: later wake-ups are dropped (the lane no longer claims)."""
        with self._lock:
            self._loop = None
            self._early = False

    def set(self) -> None:
        """Wake the claimer (from any thread), or make its next sleep return at once."""
        with self._lock:
            loop = self._loop
            if loop is None:
                self._early = True
                return
            # RuntimeError: the loop closed between detach() and here.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        else:
            self._pending = True

    async def sleep(self, timeout: float) -> bool:
        """On the loop: wait up to ``timeout`` for a wake-up; whether one came (or had come
        since the last sleep, or the worker is stopping)."""
        if self._pending or self._closed:
            self._pending = False
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        try:
            # asyncio.wait, not wait_for: no cancel-and-wait at every timeout.
            await asyncio.wait([waiter], timeout=timeout)
        finally:
            self._waiter = None
        return waiter.done()

    def close(self) -> None:
        """The worker is stopping (from any thread): wake the claimer, now and later."""
        with self._lock:
            self._closed = True
            loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake)

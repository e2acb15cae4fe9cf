"""Waking the async lane's idle tasks: what :class:`worker.IdleThreads` is to the step threads.

A wake-up comes from another thread — the worker's LISTEN thread (a NOTIFY), or any thread
of this process whose commit made a row due (``DatabaseBackend.enqueue``) — and reaches the
lane's event loop through ``call_soon_threadsafe``. As for the threads:

- one wake-up wakes **one** idle task (waking all of them would run ``concurrency`` claims
  for one row);
- one that finds no task idle is counted, and the next task about to sleep claims instead
  (capped at one per task: a busy task claims again after its step anyway);
- a *relayed* one (a NOTIFY, sent once per transaction however many rows it made due) is
  passed on by the task it woke as soon as that task has claimed a row (:meth:`pass_on`), and
  so on down the idle tasks until one finds nothing.

Everything but :meth:`set` runs on the lane's loop, so only the loop reference and the
wake-ups that come before the loop starts need the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class LaneWakeups:
    def __init__(self, tasks: int) -> None:
        self._cap = max(1, tasks)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._early = 0  # wake-ups before the loop ran (under the lock)
        self._waiters: list[asyncio.Future[bool]] = []  # the most recently idle last
        self._missed = 0
        self._missed_relay = False  # one of the missed wake-ups was a relay
        self._closed = False

    def attach(self) -> None:
        """Called on the lane's loop when it starts: wake-ups go to it from now on."""
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._missed = min(self._early, self._cap)

    def detach(self) -> None:
        """The loop is ending: later wake-ups are dropped (the lane no longer claims)."""
        with self._lock:
            self._loop = None
            self._early = 0

    def set(self, *, relay: bool = False) -> None:
        """Wake one idle task (from any thread). ``relay``: may stand for several rows."""
        with self._lock:
            loop = self._loop
            if loop is None:
                self._early = min(self._early + 1, self._cap)
                return
            # RuntimeError: the loop closed between detach() and here.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake_one, relay)

    def pass_on(self) -> None:
        """On the loop: wake one more idle task, as a relay; nothing if none is idle."""
        self._wake_waiter(True)

    def _wake_one(self, relay: bool) -> None:
        if not self._wake_waiter(relay):
            self._missed = min(self._missed + 1, self._cap)
            self._missed_relay = self._missed_relay or relay

    def _wake_waiter(self, relay: bool) -> bool:
        while self._waiters:
            waiter = self._waiters.pop()
            if not waiter.done():
                waiter.set_result(relay)
                return True
        return False

    async def sleep(self, timeout: float) -> bool | None:
        """Wait up to ``timeout`` for a wake-up: None if none came, else whether it was a
        relay (to :meth:`pass_on` once this task has claimed a row)."""
        if self._missed:
            self._missed -= 1
            relay, self._missed_relay = self._missed_relay, False
            return relay
        if self._closed:
            return False
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            # asyncio.wait, not wait_for: no cancel-and-wait at every timeout (a hundred idle
            # tasks time out twenty times a second each, to look whether the worker stops).
            await asyncio.wait([waiter], timeout=timeout)
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        return waiter.result() if waiter.done() else None

    def close(self) -> None:
        """The worker is stopping (from any thread): wake every idle task, now and later."""
        with self._lock:
            self._closed = True
            loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        while self._wake_waiter(False):
            pass

"""A worker's async lane: ``async def`` steps, many at once, on one event loop in one thread.

The step threads run sync workflow classes; a class with anything ``async def`` in it (a step
body, a condition, a hook — :func:`awaiting_parts`) is claimed here instead. Each of the lane's
``async_concurrency`` tasks loops as a step thread does: claim, run, claim again. It runs the
very same ``executor.claim_and_run`` — there is no async copy of the phases — inside a
greenlet (SQLAlchemy's ``greenlet_spawn``) over an async engine on the same database: every
statement of the phases, and every awaitable the application's code returns
(``core.awaiting``), suspends the greenlet and lets the loop run the other steps meanwhile.

**Connections.** A task does not hold a connection for its run as a step thread does
(``RunOptions.hold_connection``): phase 1 takes one from the lane's pool and gives it back at
its commit, the body takes one only when it first touches the database, and phase 3 takes one
if the body did not. So a hundred steps awaiting an HTTP call hold no connection at all, and
the lane's pool (``pool_size``, a few) bounds what it holds however many steps are in flight:
a step that needs one while all are taken waits on the loop, not in a thread.

**Wake-ups**: an idle task sleeps until the poll interval or a wake-up — the worker's LISTEN
thread passes each NOTIFY to the lane as to the step threads, and this process's own commits
wake it through the backend (``lane_wakeups``: one idle task per wake-up, relayed on).

**Leases and shutdown** are the worker's: each task reports the step it runs to the worker's
heartbeat under a key of its own, and stops claiming when the worker stops; the worker's grace
period waits for the lane's thread as for a step thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from geneva_drive.core.settings import Settings
from geneva_drive.definition.callables import is_coroutine_function
from geneva_drive.definition.workflow import Workflow
from geneva_drive.engine.executor import RunOptions, claim_and_run
from geneva_drive.engine.leases import RunningExecutions
from geneva_drive.runtime.lane_wakeups import LaneWakeups
from geneva_drive.runtime.startup import Outages, is_outage
from geneva_drive.storage.db import async_engine_like
from geneva_drive.storage.queries.claims import ClaimScope

log = logging.getLogger("geneva_drive.worker")

DEFAULT_ASYNC_CONCURRENCY = 100
# Connections the lane's pool holds at most: enough for phases 1 and 3 of the steps that
# start and end at the same moment; bodies that touch the database hold one each meanwhile.
DEFAULT_LANE_POOL = 4

# How often an idle task looks whether the worker is stopping (a wake-up ends its wait at once).
_STOP_CHECK_SECONDS = 0.05

_HOOKS = ("before_step_execution", "after_step_execution")


def awaiting_parts(cls: type[Workflow]) -> list[str]:
    """What in ``cls`` is ``async def`` and must be awaited: labels, for messages."""
    parts = []
    for step_def in cls.steps.runnable():
        if is_coroutine_function(step_def.callable):
            parts.append(step_def.label)
        elif callable(step_def.skip_if) and is_coroutine_function(step_def.skip_if):
            parts.append(f"{step_def.label} skip_if=")
    parts += [
        f"{cls.__name__}.cancel_if" for c in cls._cancel_conditions if is_coroutine_function(c)
    ]
    parts += [
        f"{cls.__name__}.{hook}" for hook in _HOOKS if is_coroutine_function(getattr(cls, hook))
    ]
    return parts


def split_scope(scope: ClaimScope) -> tuple[ClaimScope, ClaimScope | None]:
    """(what the step threads claim, what the async lane claims — None: nothing async).

    Split by class, not by step: the claim queries filter on the workflow's type, with
    indexes and plans the hot path depends on. A class with one async step therefore runs
    all its steps on the loop; its sync steps run there too (docs/async-steps.md).
    """
    classes = {name: mapper.class_ for name, mapper in Workflow.__mapper__.polymorphic_map.items()}
    awaiting = tuple(
        name for name in scope.workflow_types if name in classes and awaiting_parts(classes[name])
    )
    if not awaiting:
        return scope, None
    threads = tuple(name for name in scope.workflow_types if name not in awaiting)
    return replace(scope, workflow_types=threads), replace(scope, workflow_types=awaiting)


def first_async_part(scope: ClaimScope) -> str | None:
    """A label of the first async thing in ``scope``'s classes (for the usage error)."""
    _, lane = split_scope(scope)
    if lane is None:
        return None
    cls = Workflow.__mapper__.polymorphic_map[lane.workflow_types[0]].class_
    return awaiting_parts(cls)[0]


class AsyncLane:
    """The event loop thread of a worker and its ``concurrency`` claiming tasks."""

    def __init__(
        self,
        config: Settings,
        options: RunOptions,
        running: RunningExecutions,
        *,
        concurrency: int,
        poll_interval: float,
        should_exit: Callable[[], bool],
        scope: Callable[[], ClaimScope | None],
        count: Callable[[], None],
        pool_size: int = DEFAULT_LANE_POOL,
        wakeups: LaneWakeups | None = None,
        outages: Outages | None = None,
    ) -> None:
        self.engine = async_engine_like(config.require_engine(), pool_size=pool_size)
        # The same settings on the async engine's sync face: phases written for a sync
        # Session run unchanged over it, inside the greenlet.
        self.config = replace(config, engine=self.engine.sync_engine)
        self.options = replace(options, hold_connection=False)
        self.running = running
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self._should_exit = should_exit
        self._scope = scope
        self._count = count
        self.wakeups = wakeups or LaneWakeups(concurrency)
        self.outages = outages or Outages(log)  # the worker's: one line per outage
        self.idle = 0  # tasks waiting for a due row or a wake-up now (tests wait on it)
        self.in_flight = 0  # steps between their claim and their end, now (tests watch it)
        self.peak_in_flight = 0
        self._flying: set[tuple[str, int]] = set()
        self._lock = threading.Lock()

    def run(self) -> None:
        """The lane's thread: run until the worker stops claiming and every task is done."""
        asyncio.run(self._main())

    async def _main(self) -> None:
        self.wakeups.attach()
        try:
            await asyncio.gather(*(self._task(i) for i in range(self.concurrency)))
        finally:
            self.wakeups.detach()
            await self.engine.dispose()

    async def _task(self, index: int) -> None:
        from sqlalchemy.util import greenlet_spawn

        key = ("async", index)
        relay = [False]  # this task's claim follows a relayed wake-up: pass it on

        def started(execution_id: int) -> None:
            # Phase 1 committed: pass a relay on now, so the next task claims while this
            # one's body awaits its I/O (not a second later).
            self._started(key, execution_id)
            self._pass_on(relay)

        options = replace(self.options, on_started=started)
        while not self._should_exit():
            scope = self._scope()
            ran = False
            if scope is not None:
                began = time.monotonic()
                try:
                    ran = await greenlet_spawn(claim_and_run, scope, options, self.config)
                    self.outages.ok(began)
                except Exception as error:
                    await self._pause_after(error, began)
                    continue
                finally:
                    self._finished(key)
            if ran:
                self._pass_on(relay)  # a claim that phase 1 ended (no body) passes on here
                self._count()
                continue
            relay[0] = await self._idle()

    async def _pause_after(self, error: Exception, started: float) -> None:
        """As a step thread does: a lost database is said once per outage (by the worker's
        ``Outages``) and retried with backoff; anything else is logged and retried after the
        poll interval — never at once, which with a hundred tasks would spin."""
        if is_outage(error):
            pause = self.outages.failed(error, started)
        else:
            log.error("async lane: claiming or running a step failed; retrying", exc_info=error)
            pause = self.poll_interval
        loop = asyncio.get_running_loop()
        deadline = loop.time() + pause
        while not self._should_exit() and (left := deadline - loop.time()) > 0:
            await asyncio.sleep(min(_STOP_CHECK_SECONDS, left))

    def _pass_on(self, relay: list[bool]) -> None:
        if relay[0]:
            relay[0] = False
            self.wakeups.pass_on()

    async def _idle(self) -> bool:
        """Sleep until the poll interval or a wake-up; whether it was a relayed one. Checks
        for the worker stopping between short slices."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.poll_interval
        self.idle += 1
        try:
            while not self._should_exit() and (left := deadline - loop.time()) > 0:
                woken = await self.wakeups.sleep(min(_STOP_CHECK_SECONDS, left))
                if woken is not None:
                    return woken
            return False
        finally:
            self.idle -= 1

    def _started(self, key: tuple[str, int], execution_id: int) -> None:
        self.running.started_as(key, execution_id)
        with self._lock:
            if key not in self._flying:
                self._flying.add(key)
                self.in_flight = len(self._flying)
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def _finished(self, key: tuple[str, int]) -> None:
        self.running.finished_as(key)
        with self._lock:
            self._flying.discard(key)
            self.in_flight = len(self._flying)

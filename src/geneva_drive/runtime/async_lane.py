"""A worker's async lane: ``async def`` steps, many at once, on one event loop in one thread.

The step threads run sync workflow classes; a class with anything ``async def`` in it (a step
body, a condition, a hook — :func:`awaiting_parts`) is claimed here instead. Each step runs
the very same ``executor.claim_and_run`` as a step thread — there is no async copy of the
phases — inside a greenlet (SQLAlchemy's ``greenlet_spawn``) over an async engine on the same
database: every statement of the phases, and every awaitable the application's code returns
(``core.awaiting``), suspends the greenlet and lets the loop run the other steps meanwhile.

**One claimer, ``async_concurrency`` slots.** The lane's claimer starts a step task in a free
slot and waits for that task's claim to come back: a row (its phase 1 has committed — the
claimer starts the next task at once, while this one's body awaits its I/O) or nothing (the
claimer sleeps). So there is at most one claim in flight, however many slots are free: an
idle lane of 500 slots makes one claim per wake-up or poll interval, not 500 (it made 288–319
commits a second idle, when each slot was a task that polled on its own).

**Connections.** A step task does not hold a connection for its run as a step thread does
(``RunOptions.hold_connection``): phase 1 takes one from the lane's pool and gives it back at
its commit, the body takes one only when it first touches the database, and phase 3 takes one
if the body did not. So a hundred steps awaiting an HTTP call hold no connection at all, and
the lane's pool bounds what it holds however many steps are in flight: a step that needs one
while all are taken waits on the loop, not in a thread. Its size: :func:`lane_pool_size`.

**Wake-ups**: the idle claimer sleeps until the next due row's time, the poll interval or a
wake-up, whichever comes first — the worker's LISTEN thread passes each NOTIFY to the lane as
to the step threads, and this process's own commits wake it through the backend
(``lane_wakeups``).

**Leases and shutdown** are the worker's: each step task reports the step it runs to the
worker's heartbeat under its slot's key, and the claimer stops claiming when the worker stops
and then waits for the running steps; the worker's grace period waits for the lane's thread as
for a step thread.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from geneva_drive.core.settings import Settings
from geneva_drive.definition.callables import is_coroutine_function
from geneva_drive.definition.workflow import Workflow
from geneva_drive.engine.executor import RunOptions, claim_and_run
from geneva_drive.engine.leases import RunningExecutions
from geneva_drive.runtime.lane_wakeups import LaneWakeups
from geneva_drive.runtime.startup import Outages, is_outage
from geneva_drive.storage import queries
from geneva_drive.storage.db import async_engine_like, session_factory
from geneva_drive.storage.queries.claims import ClaimScope

log = logging.getLogger("geneva_drive.worker")

DEFAULT_ASYNC_CONCURRENCY = 100
# The lane's pool (see lane_pool_size): a connection per this many slots, within these bounds.
LANE_POOL_MIN = 4
LANE_POOL_MAX = 16
SLOTS_PER_CONNECTION = 25

# How often the claimer looks whether the worker is stopping while it waits (a wake-up or a
# freed slot ends its wait at once; the worker's stop() wakes it too).
_STOP_CHECK_SECONDS = 0.05
# Shortest idle sleep (as the step threads'): a due row that could not be claimed (its
# workflow locked by someone finishing a step) must not turn the idle claimer into a busy loop.
_MIN_IDLE_SECONDS = 0.05

_HOOKS = ("before_step_execution", "after_step_execution")


def lane_pool_size(concurrency: int) -> int:
    """The connections the lane's engine holds at most, for ``concurrency`` slots.

    What holds one: the claimer's claim-and-phase-1 (one at a time), each outcome's commit
    (phase 3: steps that began together end together), and each body that touches the
    database, for the rest of its run. One connection per :data:`SLOTS_PER_CONNECTION` slots
    keeps the outcomes of a full lane from queueing behind each other (4 connections queued
    them by seconds at 500 slots), within :data:`LANE_POOL_MIN` … :data:`LANE_POOL_MAX`: more
    connections than that add server processes, not commits per second, on a few cores — and
    every one counts against the database's connection limit (with the worker's threads').
    """
    return min(LANE_POOL_MAX, max(LANE_POOL_MIN, math.ceil(concurrency / SLOTS_PER_CONNECTION)))


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
    """The event loop thread of a worker: its claimer and its ``concurrency`` step slots."""

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
        pool_size: int | None = None,
        wakeups: LaneWakeups | None = None,
        outages: Outages | None = None,
    ) -> None:
        self.pool_size = lane_pool_size(concurrency) if pool_size is None else pool_size
        self.engine = async_engine_like(config.require_engine(), pool_size=self.pool_size)
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
        self.wakeups = wakeups or LaneWakeups()
        self.outages = outages or Outages(log)  # the worker's: one line per outage
        self.idle = 0  # free slots while the claimer sleeps (0 while it is awake; tests wait)
        self.sleeps = 0  # times the claimer went to sleep (tests wait on it)
        self.in_flight = 0  # steps between their claim and their end, now (tests watch it)
        self.peak_in_flight = 0
        self._free = list(range(concurrency))  # the slots' keys: ("async", slot)
        self._freed: asyncio.Future[None] | None = None  # the claimer waits for a slot
        self._flying: set[tuple[str, int]] = set()
        self._lock = threading.Lock()

    def run(self) -> None:
        """The lane's thread: run until the worker stops claiming and every step is done."""
        asyncio.run(self._main())

    async def _main(self) -> None:
        self.wakeups.attach()
        steps: set[asyncio.Task[None]] = set()
        try:
            await self._claim(steps)
        finally:
            if steps:  # stopping: the running steps finish (resumable ones at a checkpoint)
                await asyncio.gather(*steps, return_exceptions=True)
            self.wakeups.detach()
            await self.engine.dispose()

    async def _claim(self, steps: set[asyncio.Task[None]]) -> None:
        """The claimer: while a slot is free, start a step task and wait for its claim; a
        row — start the next at once; nothing — sleep until a wake-up or the next due time."""
        loop = asyncio.get_running_loop()
        while not self._should_exit():
            if not self._free:
                await self._slot_freed()
                continue
            scope = self._scope()
            if scope is None:  # nothing async loaded (now): sleep as an idle claimer does
                await self._sleep(self.poll_interval)
                continue
            claimed: asyncio.Future[bool] = loop.create_future()
            began = time.monotonic()
            task = asyncio.create_task(self._step(self._free.pop(), scope, claimed, began))
            steps.add(task)
            task.add_done_callback(steps.discard)
            try:
                got_one = await claimed
                self.outages.ok(began)
            except Exception as error:
                await self._pause_after(error, began)
                continue
            if not got_one:
                await self._sleep_until_due(scope)

    async def _step(
        self, slot: int, scope: ClaimScope, claimed: asyncio.Future[bool], began: float
    ) -> None:
        """One step task: claim and run one execution (and any chained after it) in ``slot``;
        ``claimed`` says, as soon as it is known, whether a row was claimed."""
        from sqlalchemy.util import greenlet_spawn

        key = ("async", slot)

        def started(execution_id: int) -> None:
            # Phase 1 committed: the claimer starts the next claim while this body runs.
            self._started(key, execution_id)
            if not claimed.done():
                claimed.set_result(True)

        options = replace(self.options, on_started=started)
        try:
            ran = await greenlet_spawn(claim_and_run, scope, options, self.config)
        except Exception as error:
            if not claimed.done():
                claimed.set_exception(error)  # the claim failed: the claimer pauses
            else:  # the step's end failed to commit: its lease expires and it is recovered
                self._report(error, began)
            return
        finally:
            self._finished(key)
            self._free.append(slot)
            if self._freed is not None and not self._freed.done():
                self._freed.set_result(None)
        if not claimed.done():
            claimed.set_result(ran)  # nothing due, or phase 1 ended the step (no body)
        if ran:
            self._count()

    def _report(self, error: Exception, began: float) -> None:
        if is_outage(error):
            self.outages.failed(error, began)  # said once per outage
        else:
            log.error("async lane: running a step failed", exc_info=error)

    async def _slot_freed(self) -> None:
        """Every slot runs a step: wait until one ends (or the worker stops)."""
        freed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._freed = freed
        try:
            while not freed.done() and not self._should_exit():
                await asyncio.wait([freed], timeout=_STOP_CHECK_SECONDS)
        finally:
            self._freed = None

    async def _sleep_until_due(self, scope: ClaimScope) -> None:
        """Nothing was claimed: sleep until the next due row of ``scope``, the poll interval or
        a wake-up, whichever comes first."""
        from sqlalchemy.util import greenlet_spawn

        began = time.monotonic()
        try:
            due = await greenlet_spawn(self._next_due, scope)
        except Exception as error:
            await self._pause_after(error, began)
            return
        timeout = self.poll_interval
        if due is not None:
            seconds = (due - self.config.clock.now()).total_seconds()
            timeout = min(timeout, max(_MIN_IDLE_SECONDS, seconds))
        await self._sleep(timeout)

    def _next_due(self, scope: ClaimScope) -> datetime | None:
        with session_factory(self.config)() as session, session.begin():
            return queries.next_claimable_due_time(session, scope)

    async def _sleep(self, timeout: float) -> None:
        """Sleep up to ``timeout`` or until a wake-up, looking whether the worker stops."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self.sleeps += 1
        self.idle = len(self._free)
        try:
            while not self._should_exit() and (left := deadline - loop.time()) > 0:
                if await self.wakeups.sleep(min(_STOP_CHECK_SECONDS, left)):
                    return
        finally:
            self.idle = 0

    async def _pause_after(self, error: Exception, started: float) -> None:
        """As a step thread does: a lost database is said once per outage (by the worker's
        ``Outages``) and retried with backoff; anything else is logged and retried after the
        poll interval — never at once, which would spin."""
        if is_outage(error):
            pause = self.outages.failed(error, started)
        else:
            log.error("async lane: claiming a step failed; retrying", exc_info=error)
            pause = self.poll_interval
        loop = asyncio.get_running_loop()
        deadline = loop.time() + pause
        while not self._should_exit() and (left := deadline - loop.time()) > 0:
            await asyncio.sleep(min(_STOP_CHECK_SECONDS, left))

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

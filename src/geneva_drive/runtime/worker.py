"""The database worker: claims due step executions and runs them on a pool of threads.

Threads of one worker process:

- **step threads** (``concurrency`` of them) loop: claim one due execution (the claim and
  phase 1 are one transaction, ``FOR UPDATE OF workflows SKIP LOCKED``), run it, and — eager
  continuation — if that step scheduled its successor due now on a queue this worker serves,
  claim that one by id and run it straight away. When nothing is due a thread sleeps until the
  next due time, the poll interval, or a wake-up, whichever comes first. A wake-up reaches
  *one* idle thread; one that stands for a whole transaction (a NOTIFY) is passed on to the
  next idle thread by each thread that claims something after it; see :class:`IdleThreads`.
- **the maintenance thread** heartbeats every ``lease / 3``: it extends the leases of the
  executions its step threads are running right now (see :mod:`geneva_drive.leases`; a row
  leased to this worker that no thread runs any more is left to expire), recovers
  executions of *other* workers whose lease ran out (a cheap indexed query, so every worker
  can afford it), creates the workflows of due schedule ticks (any worker may; the database
  lets one per tick through, see ``engine.schedules``), and runs housekeeping when
  ``housekeeping_interval`` is set (one worker at a time, by a database lock).
- **the listener** (PostgreSQL): ``LISTEN geneva_drive`` on a dedicated connection; a NOTIFY
  from a commit that made a row due now wakes an idle step thread at once, and the async
  lane's claimer (``async_lane``) when async classes are loaded.

What it claims: only executions of the workflow classes (and hero classes) this process has
loaded, on the queues it serves (see ``loaded.py``); it refuses to start with no workflow class
at all, and says once per class which rows it leaves for workers that have the code. Before the
threads start it waits (bounded) for the database and checks its schema revision
(``startup.py``); a database lost while running is retried with backoff, one log line when it
goes and one when it is back.

Stopping: the first SIGINT/SIGTERM, :meth:`Worker.stop`, or the process-wide
:func:`geneva_drive.request_shutdown` stops claiming; running steps get ``grace_period`` to
finish (resumable ones stop at their next checkpoint). A signal also makes the process-wide
request, so steps this process runs outside the worker stop too. Steps still running then have
their leases expired on the spot, so another worker recovers them without waiting. A second
signal exits at once; the leases then simply run out and are recovered.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from types import FrameType

from geneva_drive.core.errors import AsyncDriverMissing, WorkerCrashed
from geneva_drive.core.ports import EnqueuedStep
from geneva_drive.core.settings import Settings, settings
from geneva_drive.core.shutdown import request_shutdown, shutdown_requested
from geneva_drive.definition.workflow import scheduled_classes
from geneva_drive.engine import leases, recovery, schedules
from geneva_drive.engine.executor import RunOptions, claim_and_run
from geneva_drive.runtime import deploy_check, housekeeping
from geneva_drive.runtime.async_lane import (
    DEFAULT_ASYNC_CONCURRENCY,
    AsyncLane,
    first_async_part,
    split_scope,
)
from geneva_drive.runtime.backends.database import DatabaseBackend
from geneva_drive.runtime.heartbeat import Heartbeat
from geneva_drive.runtime.lane_wakeups import LaneWakeups
from geneva_drive.runtime.loaded import UnloadedClassReport, claim_scope, require_workflows
from geneva_drive.runtime.pool import pool_problem
from geneva_drive.runtime.startup import Outages, check_database, is_outage
from geneva_drive.runtime.worker_options import (
    DEFAULT_WAIT_SECONDS,
    WorkerOptionError,
    check_options,
)
from geneva_drive.storage import queries
from geneva_drive.storage.db import missing_async_driver, session_factory
from geneva_drive.storage.dialects import dialect_of
from geneva_drive.storage.queries.claims import ClaimScope

log = logging.getLogger("geneva_drive.worker")

# Shortest idle sleep: a due row we could not claim (its workflow row is locked by someone
# finishing a step) must not turn the idle loop into a busy loop. Also how much later than the
# first one further idle threads timed on the same due row wake (see IdleThreads).
MIN_IDLE_SECONDS = 0.05
# How often an idle worker counts the rows of classes it has not loaded (it reads every
# scheduled row, so not at every idle moment); new classes are reported when first seen.
SURVEY_SECONDS = 300.0
_LANE_THREAD = "geneva-drive-async"
# How long the listener waits for a NOTIFY before it looks whether the worker is stopping:
# psycopg's notifies() holds the connection's lock while it waits, so stop() cannot cut the
# wait short, and run() joins the listener — at 1 s a stop waited 0.37 s in the median, up
# to the whole second. An idle wake is one poll of the socket.
LISTEN_TICK_SECONDS = 0.2


def freeze_startup_objects() -> None:
    """Exempt every object alive now from the garbage collector's full collections.

    Why: a full (generation 2) collection walks every tracked object, and right after startup
    that is all of SQLAlchemy, the application and their caches — in a worker process, 50–80 ms
    during which no step thread runs (measured: a woken step started 76 ms late, every run, at
    about the 20th workflow). What is alive at startup stays alive; objects created later are
    collected as usual. Called when the worker owns the process (``Worker.run`` on the main
    thread with signal handlers), never when it is embedded in an application.
    """
    gc.collect()
    gc.freeze()


def _async_concurrency(value: object, scope: ClaimScope) -> int:
    """``async_concurrency`` checked: a whole number, and not 0 when async steps are loaded."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise WorkerOptionError(
            "async_concurrency",
            f"Worker(async_concurrency={value!r}): expected a whole number of 0 or more (async "
            f"steps run at once on the worker's event loop; default {DEFAULT_ASYNC_CONCURRENCY})",
        )
    if value == 0:
        found = first_async_part(scope)
        if found is not None:
            raise WorkerOptionError(
                "async_concurrency",
                f"Worker(async_concurrency=0): {found} is async def, and with 0 nothing "
                "would run it (its workflows would wait forever); give async steps a "
                f"concurrency (default {DEFAULT_ASYNC_CONCURRENCY}), or make it a plain def",
            )
    return value


def _require_async_driver(config: Settings, scope: ClaimScope | None) -> None:
    """At start-up, not at the first async step: the async lane's driver imports."""
    if scope is None:
        return
    missing = missing_async_driver(config.require_engine())
    if missing is None:
        return
    driver, module, extra = missing
    found = first_async_part(scope)
    raise AsyncDriverMissing(
        f"Worker: {found} is async def, and async steps run on the worker's event loop over "
        f"{driver}, which does not import here (no module named {module!r}); install it: "
        f"pip install 'geneva-drive[{extra}]' — or leave those workflow classes out of this "
        "worker's --app"
    )


@dataclass(eq=False)
class _Sleeper:
    event: threading.Event
    due: datetime | None  # the due time it sleeps until; None: the poll interval
    relay: bool = False  # woken by a wake-up it is to pass on after a successful claim


class IdleThreads:
    """The step threads of one worker that found nothing to claim, woken one at a time.

    Why not one shared ``threading.Event``: its ``set()`` woke *every* idle thread for each
    due row, so ``concurrency`` threads ran a claim and an idle-time query at once and all but
    one found nothing — on a 2-core machine the one that did find the row waited behind the
    others' queries (signal → woken step start, one worker idle: 3 ms p50, 8 ms p99; with one
    thread woken: 1.5 ms, 4 ms). Here:

    - :meth:`set` (one call per wake-up: one NOTIFY, one in-process enqueue) wakes one idle
      thread, the most recently idle one that is not timing a due row for the others;
    - a wake-up that finds no thread idle is not lost: it is counted, and the next thread about
      to sleep claims again instead (at most one extra claim per thread);
    - a *relayed* wake-up (``set(relay=True)``: a NOTIFY, which PostgreSQL sends once per
      transaction however many rows it made due — a ``create_many`` of 500) is passed on by
      the thread it woke, once that thread has claimed a row (:meth:`pass_on`), and so on down
      the idle threads until one finds nothing. Without it the other idle threads slept until
      the poll interval while one thread worked through the bulk. The cost is one empty claim
      per relayed wake-up (the last thread's, which then sleeps on as before, without asking
      for the next due time); in-process wake-ups are one per row already and are not relayed;
    - of the idle threads sleeping until the *same* due time, the first one wakes on time and
      the others :data:`MIN_IDLE_SECONDS` later, after it has claimed the row, to find the next
      due time. They still wake (rather than sleep the poll interval) in case the first one is
      busy with a long step by then.

    The lock guards the sleepers list and the counters only; it is never held across a wait or
    a query, and ``set()`` is called from the LISTEN thread and from any thread that commits.
    """

    def __init__(self, threads: int) -> None:
        self._threads = threads
        self._lock = threading.Lock()
        self._sleepers: list[_Sleeper] = []  # the most recently idle last
        self._missed = 0
        self._closed = False
        self._woken = threading.local()  # per thread: was its last wake-up a relay?

    def set(self, *, relay: bool = False) -> None:
        """Wake one idle thread, or the next one that is about to sleep.

        ``relay``: the wake-up may stand for several rows (see :meth:`pass_on`).
        """
        with self._lock:
            if self._closed:
                return
            if not self._wake_one(relay):
                # Capped: wake-ups that arrive while every thread is busy need at most one
                # extra claim per thread (a busy thread claims again after each step anyway;
                # no thread is idle, so there is nobody to relay to either).
                self._missed = min(self._missed + 1, self._threads)

    def pass_on(self) -> None:
        """Wake one more idle thread, as a relay; nothing if none is idle (never counted as
        missed: every thread is busy, and each claims again after its step)."""
        with self._lock:
            if not self._closed:
                self._wake_one(relay=True)

    def woken_as_relay(self) -> bool:
        """Whether this thread's last :meth:`sleep` ended by a relayed wake-up."""
        return bool(getattr(self._woken, "relay", False))

    def _wake_one(self, relay: bool) -> bool:
        # Under the lock.
        sleeper = self._pick()
        if sleeper is None:
            return False
        self._sleepers.remove(sleeper)
        sleeper.relay = relay
        sleeper.event.set()
        return True

    def _pick(self) -> _Sleeper | None:
        # Prefer a thread that times no due row for the others: the one that does keeps doing
        # so while the woken thread runs the row this wake-up was for.
        timers = {self._timer_of(s.due) for s in self._sleepers if s.due is not None}
        for sleeper in reversed(self._sleepers):
            if sleeper not in timers:
                return sleeper
        return self._sleepers[-1] if self._sleepers else None

    def _timer_of(self, due: datetime | None) -> _Sleeper | None:
        # The first (longest idle) thread sleeping until ``due``.
        return next((s for s in self._sleepers if due is not None and s.due == due), None)

    def take_missed(self) -> bool:
        """True (once per missed wake-up) if a wake-up found no thread idle: claim again."""
        with self._lock:
            if self._missed or self._closed:
                self._missed = max(0, self._missed - 1)
                return True
            return False

    def sleep(self, timeout: float, due: datetime | None) -> bool:
        """Sleep up to ``timeout`` (until ``due`` when that is what it was timed on).

        Returns True if woken (by :meth:`set`, a missed wake-up, or :meth:`close`).
        """
        me = _Sleeper(threading.Event(), due)
        self._woken.relay = False
        with self._lock:
            # Checked under the lock that set() takes: a wake-up that came while this thread
            # was between its empty claim and here is either counted or finds it listed.
            if self._missed or self._closed:
                self._missed = max(0, self._missed - 1)
                return True
            if due is not None and self._timer_of(due) is not None:
                timeout += MIN_IDLE_SECONDS  # another thread wakes for that row first
            self._sleepers.append(me)
        if not me.event.wait(timeout):
            with self._lock:
                if me in self._sleepers:
                    self._sleepers.remove(me)
                    return False
            # else set() picked it between the timeout and the lock: count it as woken
        self._woken.relay = me.relay  # written under the lock before its event was set
        return True

    def close(self) -> None:
        """Wake every idle thread, now and from now on (the worker is stopping)."""
        with self._lock:
            self._closed = True
            for sleeper in self._sleepers:
                sleeper.event.set()
            self._sleepers.clear()

    @property
    def idle(self) -> int:
        """How many threads are asleep right now."""
        with self._lock:
            return len(self._sleepers)


class _Relay:
    """One step thread's part in passing a NOTIFY on (:meth:`IdleThreads.pass_on`)."""

    def __init__(self, wakeup: IdleThreads, started: Callable[[int], None]) -> None:
        self._wakeup = wakeup
        self._started = started
        self.armed = False  # the thread's next claim follows a relayed wake-up
        self._cut_short: tuple[float, datetime | None] | None = None  # (deadline, due)

    def started(self, execution_id: int) -> None:
        # The executor's on_started: phase 1 has committed. Passed on here, before the step
        # body runs, so the next thread claims while this one works — not after a long step.
        self._started(execution_id)
        self.claimed()

    def claimed(self) -> None:
        if self.armed:
            self.armed = False
            self._wakeup.pass_on()

    def slept(self, woken: bool, deadline: float, due: datetime | None) -> None:
        self.armed = woken and self._wakeup.woken_as_relay()
        self._cut_short = (deadline, due) if self.armed else None

    def after_claim(self, ran: bool | None) -> tuple[float, datetime | None] | None:
        """Pass on if the claim got a row. If it found none, the rest of the sleep the relayed
        wake-up cut short: the relay's rows are all claimed and nothing else became due that
        would not wake a thread of its own, so the next due time need not be asked again —
        which keeps a NOTIFY's cost at one empty claim (the last thread's)."""
        if ran:
            self.claimed()  # a claim that phase 1 ended (no body) passes on here
        rest = None
        if ran is False and self.armed and self._cut_short is not None:
            deadline, due = self._cut_short
            left = deadline - time.monotonic()
            rest = (left, due) if left >= MIN_IDLE_SECONDS else None
        self.armed, self._cut_short = False, None  # the relay ends with this thread
        return rest


class Worker:
    """A worker process's pool of step threads, its heartbeat, and its wake-ups."""

    def __init__(
        self,
        *,
        config: Settings | None = None,
        queues: list[str] | None = None,
        concurrency: int | None = None,
        poll_interval: float = 1.0,
        lease: timedelta | float = timedelta(seconds=30),
        grace_period: timedelta | float = timedelta(seconds=30),
        housekeeping_interval: timedelta | float | None = None,
        heartbeat_interval: timedelta | float | None = None,
        listen: bool = True,
        eager: bool = True,
        startup_wait: float = DEFAULT_WAIT_SECONDS,
        async_concurrency: int = DEFAULT_ASYNC_CONCURRENCY,
    ) -> None:
        self.config = config or settings()
        engine = self.config.require_engine()
        if concurrency is None:
            # SQLite has one writer: more threads would only queue on its lock.
            concurrency = dialect_of(engine).default_concurrency
        checked = check_options(
            queues=queues,
            concurrency=concurrency,
            poll_interval=poll_interval,
            lease=lease,
            grace_period=grace_period,
            housekeeping_interval=housekeeping_interval,
            heartbeat_interval=heartbeat_interval,
            startup_wait=startup_wait,
        )
        self.lease = checked.lease
        self.heartbeat_interval = checked.heartbeat_interval
        self.grace_period = checked.grace_period
        self.housekeeping_interval = checked.housekeeping_interval
        self.queues = checked.queues
        self.concurrency = concurrency = checked.concurrency
        self.poll_interval = checked.poll_interval
        self.listen = listen and dialect_of(engine).notifies
        problem = pool_problem(engine, concurrency, listen=self.listen)
        if problem is not None:
            raise ValueError(f"Worker(concurrency={concurrency}): {problem}")
        self.eager = eager
        self.startup_wait = checked.startup_wait
        # What the step threads claim: set by run() from the classes loaded then, refreshed
        # when idle (a class defined later is picked up), replaced whole (threads read it).
        self.scope = claim_scope(self.queues)
        # Classes with async def steps go to the async lane, the others to the step threads.
        self.async_concurrency = _async_concurrency(async_concurrency, self.scope)
        self._split_scope()
        _require_async_driver(self.config, self._async_scope)
        self.async_lane: AsyncLane | None = None
        self.outages = Outages(log)
        self._unloaded = UnloadedClassReport(log)
        self._next_survey = 0.0
        self._survey_lock = threading.Lock()
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.running = leases.RunningExecutions()  # what the heartbeat renews
        self._heartbeat = Heartbeat(
            self.config, self.worker_id, self.running, self.lease, self.heartbeat_interval, log
        )
        self.options = RunOptions(
            worker_id=self.worker_id,
            lease=self.lease,
            should_exit=self._should_exit,
            chain=self._may_chain if eager else None,
            on_chained=lambda eager: self._count(eager=eager),
            on_started=self.running.started,
        )
        self.steps_run = 0
        self.steps_run_eagerly = 0
        self.leases_recovered = 0
        self.abandoned = 0  # steps still running when the grace period ended
        self.listening = False
        self.idle_waits = 0  # times a step thread went idle (tests wait on it)
        self.crashed: tuple[str, BaseException] | None = None  # the first thread that died
        self._stopping = threading.Event()  # stop claiming
        self._done = threading.Event()  # stop the maintenance thread and the listener
        self._wakeup = IdleThreads(concurrency)
        self._lane_wakeup = LaneWakeups()
        self._stop_requested_at: float | None = None
        self._until: Callable[[], bool] | None = None
        self._count_lock = threading.Lock()

    # -- running -------------------------------------------------------------------------

    def run(self, *, until: Callable[[], bool] | None = None, install_signals: bool = True) -> None:
        """Run until stopped (or until ``until()`` is true, checked when idle).

        Raises ``NoWorkflowsLoaded`` when no workflow class is defined in this process,
        ``startup.StartupError`` when the database stays unreachable for ``startup_wait``
        seconds or its schema is not this package's, and ``WorkerCrashed`` (after stopping)
        when one of its threads died of an unexpected error.
        """
        self.scope = claim_scope(self.queues)
        require_workflows(self.scope)
        self._split_scope()
        _require_async_driver(self.config, self._async_scope)
        check_database(self.config.require_engine(), wait=self.startup_wait)
        self._survey(force=True)
        deploy_check.log_summary(session_factory(self.config), log)  # one line (issue 15 §3)
        backend = self.config.backend
        if isinstance(backend, DatabaseBackend):
            backend.subscribe(self._wakeup)
            backend.subscribe(self._lane_wakeup)
        if install_signals and threading.current_thread() is threading.main_thread():
            # The worker owns this process (as under `geneva-drive worker`).
            self._install_signal_handlers()
            freeze_startup_objects()
        log.info(
            "worker %s started: concurrency=%d queues=%s lease=%ss workflows=%s",
            self.worker_id,
            self.concurrency,
            ",".join(self.queues or ["*"]),
            self.lease.total_seconds(),
            ",".join(self.scope.workflow_types),
        )
        self._until = until
        self._heartbeat.reserve()  # before the step threads take every connection
        helpers = [self._thread(self._maintain, "geneva-drive-heartbeat")]
        if self.listen:
            helpers.append(self._thread(self._listen, "geneva-drive-listen"))
        steps = [self._thread(self._loop, f"geneva-drive-{i}") for i in range(self.concurrency)]
        if self._async_scope is not None:
            steps.append(self._thread(self._start_async_lane(), _LANE_THREAD))
        try:
            for thread in [*helpers, *steps]:
                thread.start()
            self._wait_for(steps)
        finally:
            self.stop()  # if the loop itself failed, nothing more is claimed meanwhile
            self._done.set()
            for thread in helpers:
                thread.join(timeout=10)
            self._heartbeat.close()
            if self.abandoned:
                # After the heartbeat thread has stopped, so it cannot extend them again.
                released = self.release_leases()
                log.warning(
                    "grace period of %ss over with %d step(s) still running: released %d "
                    "lease(s) for other workers to recover them",
                    self.grace_period.total_seconds(),
                    self.abandoned,
                    released,
                )
            if isinstance(backend, DatabaseBackend):
                backend.unsubscribe(self._wakeup)
                backend.unsubscribe(self._lane_wakeup)
            log.info("worker %s stopped after %d step(s)", self.worker_id, self.steps_run)
        if self.crashed is not None:
            name, error = self.crashed
            raise WorkerCrashed(
                f"worker {self.worker_id} stopped because its thread {name} died of "
                f"{type(error).__name__}: {error} (the traceback is in the log above); the "
                "steps it was running finished or were left for lease recovery — restart it"
            ) from error

    def _start_async_lane(self) -> Callable[[], None]:
        self.async_lane = AsyncLane(
            self.config,
            self.options,
            self.running,
            concurrency=self.async_concurrency,
            poll_interval=self.poll_interval,
            should_exit=self._should_exit,
            scope=lambda: self._async_scope,
            count=self._count,
            wakeups=self._lane_wakeup,
            outages=self.outages,
        )
        return self.async_lane.run

    def _split_scope(self) -> None:
        """What the step threads claim, and the async lane (None: no async class loaded)."""
        self._thread_scope, self._async_scope = split_scope(self.scope)

    def _thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        def run() -> None:
            try:
                target()
            except BaseException as error:
                # The one place a worker thread can end unplanned. A step's own errors never
                # get here (the executor records them, KeyboardInterrupt and SystemExit too);
                # this is a bug or a broken environment. Carrying on without a step thread,
                # or without the heartbeat (every lease would run out under running steps),
                # would look healthy and exit 0 — so the whole worker stops, and says why.
                self._crash(name, error)

        # Daemon: a second signal's os._exit, or an abandoned step, must not keep it alive.
        return threading.Thread(target=run, name=name, daemon=True)

    def _crash(self, name: str, error: BaseException) -> None:
        log.critical(
            "worker thread %s died of %s; stopping the worker",
            name,
            type(error).__name__,
            exc_info=(type(error), error, error.__traceback__),
        )
        if self.crashed is None:
            self.crashed = (name, error)
        self.stop()

    def stop(self) -> None:
        """Stop claiming; running steps finish (resumable ones stop at their next checkpoint)."""
        if self._stop_requested_at is None:
            self._stop_requested_at = time.monotonic()
        self._stopping.set()
        self._wakeup.close()
        self._lane_wakeup.close()

    def _should_exit(self) -> bool:
        """Stop claiming (and stop resumable steps): this worker or the whole process stops."""
        return self._stopping.is_set() or shutdown_requested()

    def _wait_for(self, steps: list[threading.Thread]) -> None:
        while any(thread.is_alive() for thread in steps):
            for thread in steps:
                thread.join(timeout=0.2)
            if shutdown_requested() and not self._stopping.is_set():
                log.info("shutdown requested: finishing running steps, then stopping")
                self.stop()
            started = self._stop_requested_at
            if (
                started is not None
                and time.monotonic() - started > self.grace_period.total_seconds()
            ):
                break
        # Steps, not threads: the lane's thread may still be closing its engine after its
        # last step ended (or be finishing a claim that finds nothing).
        lane = self.async_lane
        self.abandoned = sum(
            (lane.in_flight if lane is not None else 0) if thread.name == _LANE_THREAD else 1
            for thread in steps
            if thread.is_alive()
        )

    # -- the step threads ----------------------------------------------------------------

    def _loop(self) -> None:
        taken: list[int] = []
        relay = _Relay(self._wakeup, self.running.started)
        options = replace(self.options, on_started=relay.started)

        def take(step: EnqueuedStep) -> bool:
            # Called after phase 3 committed, in this thread: keep a step due now for us.
            if not self.eager or taken or self._should_exit():
                return False
            if self.queues and str(step.job_options.get("queue") or "default") not in self.queues:
                return False
            if step.scheduled_for > self.config.clock.now():
                return False
            taken.append(step.execution_id)
            return True

        with self._continuing(take):
            while not self._should_exit():
                ran = self._attempt(taken, options)
                rest = relay.after_claim(ran)
                if ran is None or ran:
                    continue
                if self._wakeup.take_missed():
                    continue  # a wake-up came while this thread was claiming: look again
                if self._until is not None and self._until():
                    self.stop()
                    return
                started = time.monotonic()
                try:
                    self._survey()
                    timeout, due = rest or self._next_wake()
                except Exception as error:
                    self._pause_after(error, started)
                    continue
                with self._count_lock:
                    self.idle_waits += 1
                deadline = time.monotonic() + timeout
                relay.slept(self._wakeup.sleep(timeout, due), deadline, due)

    def _attempt(self, taken: list[int], options: RunOptions) -> bool | None:
        """:meth:`_claim_and_run`; None if it failed (after the pause that follows)."""
        started = time.monotonic()
        try:
            return self._claim_and_run(taken, options, started)
        except Exception as error:
            failure = error
        finally:
            # Not run (we are stopping, or it failed): it stays scheduled for anyone.
            taken.clear()
            # Whatever this thread ran is over; a row it left in progress expires. Before
            # the pause: during an outage the pause grows to seconds, and the heartbeat
            # would keep renewing a row whose hand-back failed, delaying its recovery.
            self.running.finished()
        self._pause_after(failure, started)
        return None

    def _claim_and_run(self, taken: list[int], options: RunOptions, started: float) -> bool:
        """Claim and run one due execution, then any this thread kept for itself."""
        scope = self._thread_scope
        if not scope.workflow_types:
            return False  # every class loaded is async: the lane claims them
        ran = claim_and_run(scope, options, self.config)
        self.outages.ok(started)
        if ran:
            self._count()
        while taken and not self._should_exit():
            if claim_and_run(scope, options, self.config, execution_id=taken.pop()):
                self._count(eager=True)
        return ran

    def _pause_after(self, error: Exception, started: float) -> None:
        """A failed claim: a lost database is retried with backoff and reported once."""
        if is_outage(error):
            self._stopping.wait(self.outages.failed(error, started))
            return
        if queries.is_transient(error):
            # A deadlock or lock timeout rolled the claim back (e.g. two workers creating a
            # concurrency key's slots at once): the row is due still; claim again now.
            reason = getattr(error, "orig", None) or error
            log.warning(
                "claim abandoned after a transient database error, claiming again: %s: %s",
                type(error).__name__,
                reason,
            )
            return
        # Not log.exception: the except block that caught ``error`` has ended, and outside one
        # it would log "NoneType: None" instead of the traceback.
        log.error("worker loop error; retrying after a pause", exc_info=error)
        self._stopping.wait(self.poll_interval)

    # -- what it claims ------------------------------------------------------------------

    def _refresh_scope(self) -> bool:
        """Take in classes defined since the last look; True if there were any."""
        try:
            scope = claim_scope(self.queues)
        except RuntimeError:  # a registry changed while we read it: look next time
            return False
        if (scope.workflow_types, scope.hero_types) == (
            self.scope.workflow_types,
            self.scope.hero_types,
        ):
            return False
        self.scope = scope
        self._split_scope()
        log.info("claiming workflows of %s", ", ".join(scope.workflow_types))
        return True

    def _survey(self, *, force: bool = False) -> None:
        """Report rows of classes this worker does not load (each class once); when idle."""
        if not self._survey_lock.acquire(blocking=False):
            return  # another idle thread is at it
        try:
            changed = self._refresh_scope()
            if not (force or changed or time.monotonic() >= self._next_survey):
                return
            self._next_survey = time.monotonic() + SURVEY_SECONDS
            with session_factory(self.config)() as session, session.begin():
                self._unloaded.survey(session, self.scope)
        finally:
            self._survey_lock.release()

    @contextlib.contextmanager
    def _continuing(self, take: Callable[[EnqueuedStep], bool]) -> Iterator[None]:
        backend = self.config.backend
        if isinstance(backend, DatabaseBackend):
            with backend.continuing(take):
                yield
        else:
            yield

    def _may_chain(self, queue: str) -> bool:
        """Whether to start a next step due now on ``queue`` in the transaction that completes
        its predecessor, and run it on this thread straight away (see ``finalize._complete``)."""
        return not self._should_exit() and (not self.queues or queue in self.queues)

    def _count(self, *, eager: bool = False) -> None:
        with self._count_lock:
            self.steps_run += 1
            if eager:
                self.steps_run_eagerly += 1

    def _idle_timeout(self) -> float:
        return self._next_wake()[0]

    def _next_wake(self) -> tuple[float, datetime | None]:
        """How long to sleep, and the due time that is the reason (None: the poll interval)."""
        if not self._thread_scope.workflow_types:
            return self.poll_interval, None
        with session_factory(self.config)() as session, session.begin():
            due = queries.next_claimable_due_time(session, self._thread_scope)
        if due is None:
            return self.poll_interval, None
        seconds = (due - self.config.clock.now()).total_seconds()
        if seconds >= self.poll_interval:
            return self.poll_interval, None
        return max(MIN_IDLE_SECONDS, seconds), due

    # -- leases --------------------------------------------------------------------------

    def heartbeat(self) -> int:
        """Extend the leases of the executions this worker's threads are running; how many."""
        return self._heartbeat.beat()

    def release_leases(self) -> int:
        """Expire this worker's leases now, so other workers recover those steps at once."""
        return leases.release(self.config, self.worker_id)

    def recover_expired_leases(self) -> int:
        """Recover executions of workers that stopped heartbeating (any worker's)."""
        recovered = recovery.recover_expired_leases(self.config)
        if recovered:
            log.warning(
                "recovered %d step execution(s) whose worker stopped heartbeating", recovered
            )
            with self._count_lock:
                self.leases_recovered += recovered
        return recovered

    def run_schedules(self) -> int:
        """Create the workflows of due schedule ticks of the classes this worker claims; how
        many it created. No query at all when none of them has a ``schedule``."""
        loaded = set(self.scope.workflow_types)
        try:
            defined = scheduled_classes()
        except RuntimeError:  # a class was being defined while we read the registry
            return 0  # the next heartbeat looks again
        classes = [c for c in defined if schedules.identity_of(c) in loaded]
        if not classes:
            return 0
        return len(schedules.run_due_schedules(self.config, classes))

    def _maintain(self) -> None:
        interval = self.heartbeat_interval.total_seconds()
        every = self.housekeeping_interval
        next_housekeeping = time.monotonic() + every.total_seconds() if every else None
        while not self._done.wait(interval):
            for task in (self.heartbeat, self.recover_expired_leases, self.run_schedules):
                started = time.monotonic()
                try:
                    task()
                except Exception as error:
                    if is_outage(error):
                        self.outages.failed(error, started)  # said once per outage
                        continue
                    log.exception("worker maintenance (%s) failed; retrying", task.__name__)
            if every and next_housekeeping is not None and time.monotonic() >= next_housekeeping:
                next_housekeeping = time.monotonic() + every.total_seconds()
                try:
                    result = housekeeping.run_exclusive(self.config)
                except Exception:
                    log.exception("housekeeping failed; retrying at the next interval")
                else:
                    if result is None:
                        log.info("housekeeping skipped: another worker is running it")

    # -- wake-ups ------------------------------------------------------------------------

    def _listen(self) -> None:
        """PostgreSQL LISTEN on a connection of its own; reconnects after errors."""
        engine = self.config.require_engine()
        while not self._done.is_set():
            connection = None
            try:
                connection = engine.raw_connection()
                driver = connection.driver_connection
                assert driver is not None  # a live, checked-out connection
                connection.detach()  # LISTEN state must never go back into the pool
                driver.autocommit = True
                driver.execute(queries.listen_statement())
                self.listening = True
                while not self._done.is_set():
                    for note in driver.notifies(timeout=LISTEN_TICK_SECONDS):
                        if not self.queues or note.payload in self.queues:
                            # One per transaction, however many rows it made due: relayed
                            # among the step threads; the async lane's claimer claims until
                            # it finds nothing (one LISTEN each process).
                            self._wakeup.set(relay=True)
                            if self._async_scope is not None:
                                self._lane_wakeup.set()
            except Exception as error:
                if self._done.is_set():
                    break
                if is_outage(error) or isinstance(error, engine.dialect.loaded_dbapi.Error):
                    self.outages.failed(error)  # the database went away: said once
                else:
                    log.warning("LISTEN connection failed; polling until it is back", exc_info=True)
                self._done.wait(self.poll_interval)
            finally:
                self.listening = False
                if connection is not None:
                    with contextlib.suppress(Exception):
                        connection.close()

    # -- signals -------------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        def handle(signum: int, _frame: FrameType | None) -> None:
            if self._stopping.is_set():
                log.warning("second signal: exiting now; leases of running steps will expire")
                os._exit(1)
            log.info(
                "signal %d: finishing running steps (grace period %ss), then stopping",
                signum,
                self.grace_period.total_seconds(),
            )
            request_shutdown()  # steps this process runs outside the worker stop too
            self.stop()

        signal.signal(signal.SIGINT, handle)
        signal.signal(signal.SIGTERM, handle)

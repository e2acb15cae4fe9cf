"""Run geneva-drive steps on the Celery cluster you already operate.

::

    from celery import Celery
    import geneva_drive
    from geneva_drive.contrib.celery import CeleryBackend

    app = Celery("shop", broker="redis://localhost:6379/0")
    geneva_drive.configure(engine=geneva_drive.create_engine(URL), backend=CeleryBackend(app))

How a step reaches a Celery worker: after the transaction that scheduled an execution commits,
the backend sends ``geneva_drive.perform_step(execution_id)`` — the one task it registers on the
app — routed by the step's merged job options (``queue``, ``priority`` and any other
``apply_async`` option such as ``routing_key`` or ``expires``), then writes the message's task id
into the execution's ``job_id``. The row is the obligation and the message only a wake-up, so
correctness never depends on the broker:

- a duplicated message finds the execution no longer ``scheduled`` and does nothing;
- a lost message leaves a ``scheduled`` row that :func:`dispatch` sends again once it has been
  overdue for ``resend_after``, then with a growing interval (housekeeping's stuck-scheduled
  recovery is the backstop);
- a message for an execution that no longer exists is logged and dropped;
- an early message never runs the step: it is sent again with the remaining countdown.

Crashes: a step runs under a lease of its Celery worker process, renewed by a heartbeat
thread of that process (:class:`ProcessLeases`); a killed process's steps are recovered by
the next :func:`dispatch` pass once their leases run out. Warm shutdown: running resumable
steps stop at their next checkpoint (see :func:`_on_worker_shutting_down`).

Why long waits are not ETA messages: a Celery worker keeps an ETA message unacknowledged in its
memory until it is due, and Redis and SQS hand unacknowledged messages out again after their
visibility timeout (one hour by default) — a three-day wait would be delivered over and over,
and every worker would hoard the waits of every workflow. So only waits up to ``eta_horizon``
ride on ETA; a longer one is not sent at all, and :func:`dispatch` (``geneva-drive dispatch``,
or housekeeping) sends it when it comes within the horizon.

Failures: the task runs the executor with ``reraise=False``. By the time a step's exception
could reach Celery, its outcome (a reattempt, a pause, …) is committed and was reported through
geneva-drive's error reporter; re-raising would only add a second traceback, mark the task
failed, and let an app's ``autoretry_for`` retry a message whose execution is settled (a no-op).
Errors *around* the step — the database is unreachable — do propagate: Celery logs them, and the
row, still ``scheduled``, is sent again by the dispatcher.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import mmap
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

from geneva_drive.engine import recovery
from geneva_drive.storage.db import session_factory

try:
    import celery  # type: ignore[import-untyped]
    from celery.signals import (  # type: ignore[import-untyped]
        worker_init,
        worker_process_init,
        worker_shutting_down,
    )
except ImportError as error:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        f"import geneva_drive.contrib.celery: Celery is not installed ({error}); the Celery "
        "backend runs steps on a Celery app — install it with: pip install 'geneva-drive[celery]'"
    ) from error

from sqlalchemy.orm import Session

from geneva_drive.core.errors import StepConfigurationError
from geneva_drive.core.ports import EnqueuedStep
from geneva_drive.core.settings import Settings, settings
from geneva_drive.core.shutdown import request_shutdown, shutdown_requested
from geneva_drive.core.states import ExecutionState
from geneva_drive.engine.executor import RunOptions, run_execution
from geneva_drive.engine.leases import RunningExecutions
from geneva_drive.engine.wakeups import enqueued_step
from geneva_drive.runtime.heartbeat import Heartbeat
from geneva_drive.runtime.pool import pool_problem
from geneva_drive.storage import queries
from geneva_drive.storage.queries.dispatch import execution_to_send

if TYPE_CHECKING:
    from geneva_drive.definition.workflow import Workflow
    from geneva_drive.storage.models import StepExecution, WorkflowColumns

__all__ = [
    "TASK_NAME",
    "CeleryBackend",
    "dispatch",
    "load_backend",
    "perform_step",
    "run_dispatcher",
]

TASK_NAME = "geneva_drive.perform_step"
DEFAULT_ETA_HORIZON = timedelta(minutes=5)
DEFAULT_RESEND_AFTER = timedelta(minutes=5)
DEFAULT_LEASE = timedelta(seconds=30)
# The longest a message of an overdue execution waits before it is sent again: the backoff
# (each resend waits as long as the row has been overdue) stops growing here.
MAX_RESEND_INTERVAL = timedelta(hours=1)
# How often a worker process's lease thread looks at the parent's warm-shutdown flag.
SHUTDOWN_WATCH_SECONDS = 0.2

log = logging.getLogger("geneva_drive.celery")


class CeleryBackend:
    """Deliver step executions as Celery messages; register ``geneva_drive.perform_step``.

    ``eta_horizon``: the longest wait sent as an ETA message; longer ones wait for
    :func:`dispatch`. ``resend_after``: how long a sent execution may stay overdue before its
    message counts as lost and is sent again (then again after twice as long, and so on, up
    to :data:`MAX_RESEND_INTERVAL`). ``lease``: how long a step run by a Celery worker process
    stays claimed without a heartbeat — a killed process's step is recovered that long after
    its last heartbeat (each worker process heartbeats every third of it).
    """

    # The job-option keys passed on to apply_async: its documented options and the usual kombu
    # publish ones; not eta/countdown (geneva-drive schedules), task_id/args/kwargs (set here)
    # nor connection/producer objects (per-instance options are stored as JSON).
    accepted_job_options = frozenset(
        {
            "queue",
            "priority",
            "routing_key",
            "exchange",
            "exchange_type",
            "expires",
            "shadow",
            "retry",
            "retry_policy",
            "time_limit",
            "soft_time_limit",
            "serializer",
            "compression",
            "link",
            "link_error",
            "add_to_parent",
            "ignore_result",
            "headers",
            "delivery_mode",
            "mandatory",
            "immediate",
            "reply_to",
            "correlation_id",
        }
    )

    def __init__(
        self,
        celery_app: Any,
        *,
        eta_horizon: timedelta = DEFAULT_ETA_HORIZON,
        resend_after: timedelta = DEFAULT_RESEND_AFTER,
        lease: timedelta = DEFAULT_LEASE,
    ) -> None:
        if not isinstance(celery_app, celery.Celery):
            raise StepConfigurationError(
                f"CeleryBackend(celery_app={celery_app!r}): expected a celery.Celery "
                "application, e.g. CeleryBackend(Celery('shop', broker='redis://…'))"
            )
        durations = (("eta_horizon", eta_horizon), ("resend_after", resend_after), ("lease", lease))
        for name, value in durations:
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise StepConfigurationError(
                    f"CeleryBackend({name}={value!r}): expected a positive timedelta, "
                    f"e.g. {name}=timedelta(minutes=5)"
                )
        self.app = celery_app
        self.eta_horizon = eta_horizon
        self.resend_after = resend_after
        self.lease = lease
        self._process: ProcessLeases | None = None
        self._process_lock = threading.Lock()
        self.task = register_task(celery_app, self)
        # A prefork worker forks its pool after importing the app module: a child must not
        # reuse the parent's pooled database connections (two processes on one socket).
        worker_process_init.connect(
            _dispose_inherited_engine, weak=False, dispatch_uid="geneva_drive.dispose_engine"
        )
        worker_init.connect(
            _share_shutdown_flag, weak=False, dispatch_uid="geneva_drive.share_shutdown_flag"
        )
        worker_init.connect(_note_pool, weak=False, dispatch_uid="geneva_drive.note_pool")
        worker_shutting_down.connect(
            _on_worker_shutting_down, weak=False, dispatch_uid="geneva_drive.warm_shutdown"
        )

    def enqueue(self, step: EnqueuedStep) -> None:
        """Called after commit: send the wake-up (unless beyond the horizon), record its id."""
        config = settings()
        now = config.clock.now()
        task_id = self.send(step, now)
        if task_id is not None:
            resend_at = self.first_resend_at(step.scheduled_for, now)
            with session_factory(config)() as session, session.begin():
                queries.record_job_id(session, step.execution_id, task_id, now, resend_at)

    def first_resend_at(self, due: datetime, sent: datetime) -> datetime:
        """When a message sent at ``sent`` for a row due at ``due`` counts as lost."""
        return max(due, sent) + self.resend_after

    def next_resend_at(self, due: datetime, now: datetime) -> datetime:
        """The backoff: a row overdue by *d* is sent again after *d* more (at least
        ``resend_after``, at most :data:`MAX_RESEND_INTERVAL`) — sends at *r*, 2*r*, 4*r*, …
        after the due time instead of one every *r*: a backlog that keeps rows overdue for
        half an hour no longer multiplies its messages by seven."""
        overdue = now - due
        return now + min(max(self.resend_after, overdue), MAX_RESEND_INTERVAL)

    def process_leases(self, config: Settings) -> ProcessLeases:
        """This process's lease owner and heartbeat (one per process, started on first use)."""
        with self._process_lock:
            process = self._process
            if process is None or process.pid != os.getpid():  # none yet, or the parent's
                process = self._process = ProcessLeases(self.lease)
            process.use(config)  # the heartbeat writes where the tasks run
            process.start()
            return process

    def send(self, step: EnqueuedStep, now: datetime) -> str | None:
        """Publish ``step``'s message; returns its task id, or None when due beyond the horizon."""
        delay = step.scheduled_for - now
        if delay > self.eta_horizon:
            log.debug(
                "execution %s is due in %s, beyond the ETA horizon of %s: the dispatcher sends it",
                step.execution_id,
                delay,
                self.eta_horizon,
            )
            return None
        options = {key: value for key, value in step.job_options.items() if value is not None}
        task_id = f"geneva-drive-{step.execution_id}-{uuid.uuid4().hex}"
        eta = step.scheduled_for if delay > timedelta(0) else None
        self.task.apply_async(args=(step.execution_id,), task_id=task_id, eta=eta, **options)
        return task_id

    def dispatch_due(self, config: Settings | None = None) -> int:
        """:func:`dispatch` with this backend — what housekeeping calls."""
        return dispatch(config, self)

    def __repr__(self) -> str:
        return (
            f"CeleryBackend({self.app.main!r}, eta_horizon={self.eta_horizon!r}, "
            f"resend_after={self.resend_after!r}, lease={self.lease!r})"
        )


def register_task(celery_app: Any, backend: CeleryBackend | None = None) -> Any:
    """Register ``geneva_drive.perform_step`` on ``celery_app`` (once; later calls reuse it)."""
    existing = celery_app.tasks.get(TASK_NAME) if celery_app.finalized else None
    if existing is not None:
        return existing

    # ignore_result: the outcome lives in the execution row; a result backend would only
    # store a second, less complete copy of it.
    @celery_app.task(name=TASK_NAME, ignore_result=True)  # type: ignore[untyped-decorator]
    def perform_step_task(execution_id: int) -> str:
        return perform_step(int(execution_id), backend=backend)

    return perform_step_task


def perform_step(
    execution_id: int, *, config: Settings | None = None, backend: CeleryBackend | None = None
) -> str:
    """What the Celery task does with one message; returns what happened, for the logs.

    ``"performed"`` — the executor ran it (its own guards still apply), under a lease of
    this process that its heartbeat renews while the step runs;
    ``"missing"`` — no such execution (its workflow was deleted): the message is dropped;
    ``"not scheduled"`` — a duplicate or late message: nothing to do;
    ``"early"`` — the row is not due yet: never run before its time, it is sent again with
    the remaining countdown (or, beyond the horizon, left to the dispatcher).
    """
    config = config or settings()
    if backend is None and isinstance(config.backend, CeleryBackend):
        backend = config.backend
    # A plain read (not geneva-drive's BEGIN IMMEDIATE sessions): most messages are due and
    # scheduled, and this costs one primary-key lookup.
    with Session(config.require_engine()) as session:
        facts = queries.delivery_facts(session, execution_id)
    if facts is None:
        log.warning(
            "%s(%s): no such step execution (its workflow was deleted?); dropping the message",
            TASK_NAME,
            execution_id,
        )
        return "missing"
    state, scheduled_for = facts
    if state != ExecutionState.SCHEDULED:
        log.info(
            "%s(%s): the execution is %s, not scheduled: nothing to run (a duplicate or late "
            "message)",
            TASK_NAME,
            execution_id,
            state,
        )
        return "not scheduled"
    now = config.clock.now()
    if scheduled_for > now:
        _send_again(execution_id, now, config, backend)
        return "early"
    if backend is None:  # called by hand without a CeleryBackend: nobody would heartbeat
        run_execution(execution_id, reraise=False, config=config)
        return "performed"
    process = backend.process_leases(config)
    with process.running():
        run_execution(execution_id, reraise=False, options=process.options, config=config)
    return "performed"


def _send_again(
    execution_id: int, now: datetime, config: Settings, backend: CeleryBackend | None
) -> None:
    """An early message: send a new one with the remaining countdown (ETA), or leave the row
    to the dispatcher (beyond the horizon, or no CeleryBackend to send with)."""
    task_id = resend_at = step = None
    with session_factory(config)() as session, session.begin():
        found = execution_to_send(session, execution_id)
        if found is not None:
            step = _enqueued_step(*found)
    if step is not None and backend is not None:
        task_id = backend.send(step, now)
        resend_at = None if task_id is None else backend.first_resend_at(step.scheduled_for, now)
    with session_factory(config)() as session, session.begin():
        queries.record_job_id(session, execution_id, task_id, now, resend_at)
    log.warning(
        "%s(%s): arrived before the execution is due (%s); not running it early — %s",
        TASK_NAME,
        execution_id,
        "gone meanwhile" if step is None else step.scheduled_for.isoformat(),
        "sent again with its ETA" if task_id else "the dispatcher sends it again",
    )


def _dispose_inherited_engine(**_: Any) -> None:
    engine = settings().engine
    if engine is not None:
        engine.dispose(close=False)  # drop the parent's connections without closing them


# -- leases and shutdown in Celery worker processes -------------------------------------------


class ProcessLeases:
    """The lease owner of one Celery worker process, and its heartbeat thread.

    Every step a task of this process runs is started with ``lease_owner`` = this process's
    id and a lease of ``CeleryBackend.lease``; the thread renews the leases of the steps the
    process's tasks are running right now (one per pool thread; see :mod:`geneva_drive.leases`)
    every third of the lease, on a connection reserved for it (``runtime.heartbeat``): with
    ``--pool threads`` every task thread holds one of the engine's connections, and a renewal
    that queued behind them would let the leases expire under running steps. When the process
    dies — a SIGKILLed prefork child, an OOM kill, a lost machine — its leases run out and
    lease recovery (every :func:`dispatch` pass, housekeeping) runs the step again, a
    resumable one from its last checkpoint.

    The same thread turns the parent's warm shutdown into this process's shutdown request
    (see :func:`_on_worker_shutting_down`): a prefork child gets no signal on a warm shutdown.
    """

    def __init__(self, lease: timedelta) -> None:
        self.pid = os.getpid()
        self.owner = f"celery:{socket.gethostname()}:{self.pid}:{uuid.uuid4().hex[:8]}"
        self.lease = lease
        self.running_now = RunningExecutions()
        self.options = RunOptions(
            worker_id=self.owner, lease=lease, on_started=self.running_now.started
        )
        self._beat: Heartbeat | None = None
        self._thread: threading.Thread | None = None

    def use(self, config: Settings) -> None:
        """Renew leases in ``config``'s database (where this process's tasks run steps); the
        first time, and whenever the settings change, check the engine's pool and reserve the
        heartbeat's connection."""
        if self._beat is not None and self._beat.config is config:
            return
        _check_pool(config)
        old, self._beat = (
            self._beat,
            Heartbeat(config, self.owner, self.running_now, self.lease, self.lease / 3, log),
        )
        if old is not None:
            old.close(discard=True)
        self._beat.reserve()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._keep, name="geneva-drive-celery-leases", daemon=True
            )
            self._thread.start()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Around one task's run: whatever it started is over when it returns."""
        try:
            yield
        finally:
            self.running_now.finished()

    def heartbeat(self) -> int:
        """Renew the leases of the steps this process runs now; returns how many."""
        beat = self._beat
        return 0 if beat is None else beat.beat()

    def _keep(self) -> None:
        interval = self.lease.total_seconds() / 3
        next_beat = time.monotonic() + interval
        while True:
            time.sleep(SHUTDOWN_WATCH_SECONDS)  # a daemon thread's tick, for the whole process
            if _parent_shutting_down() and not shutdown_requested():
                log.info("warm shutdown: resumable steps stop at their next checkpoint")
                request_shutdown()
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + interval
                try:
                    self.heartbeat()
                except Exception:
                    log.exception("heartbeat of %s failed; retrying", self.owner)


# Pools whose tasks all run in the worker's one process, each on a thread (or greenlet) of its
# own: with them every task holds one of the process's database connections at once.
_SHARED_PROCESS_POOLS = frozenset({"threads", "thread", "gevent", "eventlet"})
# How many tasks one process of this Celery worker runs at once (set by worker_init, which
# runs before the pool forks, so prefork children inherit it); None: not a Celery worker.
_tasks_per_process: int | None = None


def _note_pool(sender: Any = None, **_: Any) -> None:
    """``worker_init``: remember how many tasks a process of this worker runs at once."""
    global _tasks_per_process
    pool = getattr(sender, "pool_cls", None)
    name = pool if isinstance(pool, str) else getattr(pool, "__module__", "").rsplit(".", 1)[-1]
    concurrency = getattr(sender, "concurrency", None)
    if name in _SHARED_PROCESS_POOLS and isinstance(concurrency, int) and concurrency > 0:
        _tasks_per_process = concurrency
    else:  # prefork, solo: one task per process at a time
        _tasks_per_process = 1


def _check_pool(config: Settings) -> None:
    """Say so, at ERROR, when the engine's pool cannot serve this process's tasks at once
    and its heartbeat — the Celery counterpart of the check ``Worker()`` refuses to start on.
    Not an exception: the task that asks first is not the one at fault, and Celery would only
    log it against that task."""
    if _tasks_per_process is None or config.engine is None:
        return
    problem = pool_problem(config.engine, _tasks_per_process, listen=False)
    if problem is not None:
        log.error(
            "Celery worker process %d runs %d task(s) at once: %s",
            os.getpid(),
            _tasks_per_process,
            problem,
        )


# A byte of memory shared by a Celery worker's main process and the pool children it forks,
# set on a warm shutdown. Why not a signal to each child: Celery keeps its pool's processes to
# itself, and a prefork child treats SIGTERM as "die now". Created before the pool starts.
_shutdown_flag: mmap.mmap | None = None


def _share_shutdown_flag(**_: Any) -> None:
    """``worker_init`` (the worker's main process, before the pool forks)."""
    global _shutdown_flag
    if _shutdown_flag is None:
        _shutdown_flag = mmap.mmap(-1, 1)  # anonymous and MAP_SHARED: inherited across fork


def _parent_shutting_down() -> bool:
    return _shutdown_flag is not None and _shutdown_flag[0] == 1


def _on_worker_shutting_down(**_: Any) -> None:
    """``worker_shutting_down``: Celery's warm shutdown, in the worker's main process.

    Runs inside Celery's signal handler: only a flag write and an event set, nothing that
    could wait. ``solo`` and ``threads`` pools run their tasks in this process and see the
    request at once; prefork children see the shared flag within
    :data:`SHUTDOWN_WATCH_SECONDS`. Celery then waits for the running tasks to return.
    """
    request_shutdown()
    if _shutdown_flag is not None:
        _shutdown_flag[0] = 1


# -- the dispatcher ---------------------------------------------------------------------------


def dispatch(config: Settings | None = None, backend: CeleryBackend | None = None) -> int:
    """Send the scheduled executions Celery has not been told about; returns how many.

    Two kinds: never sent (the wait was beyond the horizon when scheduled, or the send
    failed) and now due within the horizon — sent with their ETA; and sent, overdue, and past
    their resend time — the message was presumed lost (see :meth:`CeleryBackend.next_resend_at`
    for the backoff). Rows of paused workflows are left alone (``resume()`` sends them).
    Sending twice is harmless, so several dispatchers may run; each pass costs one indexed
    query and one commit per batch.

    Each pass first recovers executions whose lease ran out (their worker process died): the
    Celery side has no worker loop of its own to sweep them, and the sweep is one cheap
    indexed query.
    """
    config = config or settings()
    chosen: object = backend if backend is not None else config.backend
    if not isinstance(chosen, CeleryBackend):
        raise StepConfigurationError(
            f"geneva_drive.contrib.celery.dispatch(): the configured backend is {chosen!r}, "
            "not a CeleryBackend; configure(backend=CeleryBackend(app)) or pass backend="
        )
    backend = chosen
    recovered = recovery.recover_expired_leases(config)
    if recovered:
        log.warning("recovered %d step execution(s) whose worker process died", recovered)
    sent = 0
    while True:
        now = config.clock.now()
        with Session(config.require_engine()) as session:
            rows = queries.executions_to_dispatch(
                session,
                now=now,
                send_before=now + backend.eta_horizon,
                resend_before=now - backend.resend_after,
                limit=config.housekeeping_batch_size,
            )
            steps = [
                (_enqueued_step(execution, workflow), execution.job_id is not None)
                for execution, workflow in rows
            ]
        sent_ids: list[tuple[int, str, datetime]] = []
        try:
            for step, resending in steps:
                task_id = backend.send(step, now)
                if task_id is not None:
                    resend_at = (
                        backend.next_resend_at(step.scheduled_for, now)
                        if resending
                        else backend.first_resend_at(step.scheduled_for, now)
                    )
                    sent_ids.append((step.execution_id, task_id, resend_at))
        finally:  # the broker failed mid-batch: still remember what did go out
            if sent_ids:
                with session_factory(config)() as session, session.begin():
                    for execution_id, task_id, resend_at in sent_ids:
                        queries.record_job_id(session, execution_id, task_id, now, resend_at)
        sent += len(sent_ids)
        # A sent row is no longer selected (its job_id is fresh): a full batch means more.
        if len(steps) < config.housekeeping_batch_size:
            return sent


def _enqueued_step(execution: StepExecution, workflow: WorkflowColumns) -> EnqueuedStep:
    # Options recomputed as when the row was scheduled; a row whose class is gone (loaded as
    # the base class) is sent with Celery's default routing.
    return enqueued_step(cast("Workflow", workflow), execution)


def run_dispatcher(
    *,
    interval: float,
    config: Settings | None = None,
    backend: CeleryBackend | None = None,
    stop: threading.Event | None = None,
    install_signals: bool = True,
) -> None:
    """Call :func:`dispatch` every ``interval`` seconds until ``stop`` is set or SIGINT/SIGTERM.

    A failing pass (broker or database away) is logged and tried again next interval. Keep
    ``interval`` well below the ETA horizon, so long waits are sent ahead of their due time.
    """
    stop = stop or threading.Event()
    if install_signals and threading.current_thread() is threading.main_thread():

        def handle(signum: int, _frame: FrameType | None) -> None:
            log.info("signal %d: stopping the dispatcher", signum)
            stop.set()

        signal.signal(signal.SIGINT, handle)
        signal.signal(signal.SIGTERM, handle)
    log.info("dispatcher started: every %.1f s", interval)
    while not stop.is_set():
        try:
            count = dispatch(config, backend)
        except Exception:
            log.exception("dispatch failed; trying again in %.1f s", interval)
        else:
            if count:
                log.info("dispatched %d step execution(s)", count)
        stop.wait(interval)
    log.info("dispatcher stopped")


def load_backend(spec: str) -> CeleryBackend:
    """The CeleryBackend for ``module:attribute`` naming a Celery app (or a CeleryBackend).

    The module is imported first (it should import your workflows too). If it configured
    geneva-drive with a CeleryBackend for that app, that one is used, with its settings.
    """
    module_name, _, attribute = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `celery -A`: modules of the current project
    module = importlib.import_module(module_name)
    target = getattr(module, attribute or "app", None)
    if isinstance(target, CeleryBackend):
        return target
    if not isinstance(target, celery.Celery):
        raise StepConfigurationError(
            f"--app {spec!r}: {module_name}.{attribute or 'app'} is {target!r}, not a Celery app; "
            "name your Celery application as module:attribute, e.g. --app shop.tasks:app"
        )
    configured = settings().backend
    if isinstance(configured, CeleryBackend) and configured.app is target:
        return configured
    return CeleryBackend(target)

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
  overdue for ``resend_after`` (housekeeping's stuck-scheduled recovery is the backstop);
- a message for an execution that no longer exists is logged and dropped.

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

import importlib
import logging
import os
import signal
import sys
import threading
import uuid
from datetime import datetime, timedelta
from types import FrameType
from typing import TYPE_CHECKING, Any

try:
    import celery  # type: ignore[import-untyped]
    from celery.signals import worker_process_init  # type: ignore[import-untyped]
except ImportError as error:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        f"import geneva_drive.contrib.celery: Celery is not installed ({error}); the Celery "
        "backend runs steps on a Celery app — install it with: pip install 'geneva-drive[celery]'"
    ) from error

from sqlalchemy.orm import Session

from .. import queries
from ..backends.base import EnqueuedStep
from ..config import Settings, settings
from ..errors import StepConfigurationError
from ..states import ExecutionState

if TYPE_CHECKING:
    from ..models import StepExecution
    from ..workflow import Workflow

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
# A message this much ahead of its row's due time is not run (clocks of senders and workers
# differ by a little; a step must never run a wait's worth early).
EARLY_TOLERANCE = timedelta(seconds=1)

log = logging.getLogger("geneva_drive.celery")


class CeleryBackend:
    """Deliver step executions as Celery messages; register ``geneva_drive.perform_step``.

    ``eta_horizon``: the longest wait sent as an ETA message; longer ones wait for
    :func:`dispatch`. ``resend_after``: how long a sent execution may stay overdue before its
    message counts as lost and is sent again.
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
    ) -> None:
        if not isinstance(celery_app, celery.Celery):
            raise StepConfigurationError(
                f"CeleryBackend(celery_app={celery_app!r}): expected a celery.Celery "
                "application, e.g. CeleryBackend(Celery('shop', broker='redis://…'))"
            )
        for name, value in (("eta_horizon", eta_horizon), ("resend_after", resend_after)):
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise StepConfigurationError(
                    f"CeleryBackend({name}={value!r}): expected a positive timedelta, "
                    f"e.g. {name}=timedelta(minutes=5)"
                )
        self.app = celery_app
        self.eta_horizon = eta_horizon
        self.resend_after = resend_after
        self.task = register_task(celery_app)
        # A prefork worker forks its pool after importing the app module: a child must not
        # reuse the parent's pooled database connections (two processes on one socket).
        worker_process_init.connect(
            _dispose_inherited_engine, weak=False, dispatch_uid="geneva_drive.dispose_engine"
        )

    def enqueue(self, step: EnqueuedStep) -> None:
        """Called after commit: send the wake-up (unless beyond the horizon), record its id."""
        config = settings()
        task_id = self.send(step, config.clock.now())
        if task_id is not None:
            with config.session_factory()() as session, session.begin():
                queries.record_job_id(session, step.execution_id, task_id, config.clock.now())

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
            f"resend_after={self.resend_after!r})"
        )


def register_task(celery_app: Any) -> Any:
    """Register ``geneva_drive.perform_step`` on ``celery_app`` (once; later calls reuse it)."""
    existing = celery_app.tasks.get(TASK_NAME) if celery_app.finalized else None
    if existing is not None:
        return existing

    # ignore_result: the outcome lives in the execution row; a result backend would only
    # store a second, less complete copy of it.
    @celery_app.task(name=TASK_NAME, ignore_result=True)  # type: ignore[untyped-decorator]
    def perform_step_task(execution_id: int) -> str:
        return perform_step(int(execution_id))

    return perform_step_task


def perform_step(execution_id: int, *, config: Settings | None = None) -> str:
    """What the Celery task does with one message; returns what happened, for the logs.

    ``"performed"`` — the executor ran it (its own guards still apply);
    ``"missing"`` — no such execution (its workflow was deleted): the message is dropped;
    ``"not scheduled"`` — a duplicate or late message: nothing to do;
    ``"early"`` — the row is not due yet: left for the dispatcher to send with an ETA.
    """
    from ..executor import run_execution

    config = config or settings()
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
    if scheduled_for - now > EARLY_TOLERANCE:
        with config.session_factory()() as session, session.begin():
            queries.record_job_id(session, execution_id, None, now)
        log.warning(
            "%s(%s): arrived %s before the execution is due; not running it early — the "
            "dispatcher sends it again",
            TASK_NAME,
            execution_id,
            scheduled_for - now,
        )
        return "early"
    run_execution(execution_id, reraise=False, config=config)
    return "performed"


def _dispose_inherited_engine(**_: Any) -> None:
    engine = settings().engine
    if engine is not None:
        engine.dispose(close=False)  # drop the parent's connections without closing them


# -- the dispatcher ---------------------------------------------------------------------------


def dispatch(config: Settings | None = None, backend: CeleryBackend | None = None) -> int:
    """Send the scheduled executions Celery has not been told about; returns how many.

    Two kinds: never sent (the wait was beyond the horizon when scheduled, or the send
    failed) and now due within the horizon — sent with their ETA; and sent more than
    ``resend_after`` ago and overdue as long — the message was lost. Rows of paused workflows
    are left alone (``resume()`` sends them). Sending twice is harmless, so several
    dispatchers may run; each pass costs one indexed query and one commit per batch.
    """
    config = config or settings()
    chosen: object = backend if backend is not None else config.backend
    if not isinstance(chosen, CeleryBackend):
        raise StepConfigurationError(
            f"geneva_drive.contrib.celery.dispatch(): the configured backend is {chosen!r}, "
            "not a CeleryBackend; configure(backend=CeleryBackend(app)) or pass backend="
        )
    backend = chosen
    sent = 0
    while True:
        now = config.clock.now()
        with Session(config.require_engine()) as session:
            rows = queries.executions_to_dispatch(
                session,
                send_before=now + backend.eta_horizon,
                resend_before=now - backend.resend_after,
                limit=config.housekeeping_batch_size,
            )
            steps = [_enqueued_step(execution, workflow) for execution, workflow in rows]
        sent_ids: list[tuple[int, str]] = []
        try:
            for step in steps:
                task_id = backend.send(step, now)
                if task_id is not None:
                    sent_ids.append((step.execution_id, task_id))
        finally:  # the broker failed mid-batch: still remember what did go out
            if sent_ids:
                with config.session_factory()() as session, session.begin():
                    for execution_id, task_id in sent_ids:
                        queries.record_job_id(session, execution_id, task_id, config.clock.now())
        sent += len(sent_ids)
        # A sent row is no longer selected (its job_id is fresh): a full batch means more.
        if len(steps) < config.housekeeping_batch_size:
            return sent


def _enqueued_step(execution: StepExecution, workflow: Workflow) -> EnqueuedStep:
    # Options recomputed as when the row was scheduled; a row whose class is gone (loaded as
    # the base class) is sent with Celery's default routing.
    return EnqueuedStep.for_execution(workflow, execution)


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

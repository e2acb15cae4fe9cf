"""The Celery application of the Celery tests: ``celery -A tests.celery.app_module worker``.

Like a user's app module it creates the Celery app, the CeleryBackend and the workflows. The
broker and the database come from the environment (set by ``tests.celery.support``); the
worker's main process configures geneva-drive, and each prefork pool process again after the
fork, on its own engine.
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import timedelta
from typing import Any

from celery import Celery  # type: ignore[import-untyped]
from celery.signals import worker_init, worker_process_init  # type: ignore[import-untyped]
from sqlalchemy import func, select

from geneva_drive import ExceptionPolicy, StepExecution, Workflow, resumable_step, step
from geneva_drive.contrib.celery import CeleryBackend
from geneva_drive.runtime.configure import configure
from geneva_drive.storage.db import create_engine
from tests.support.app import AuditEntry

BROKER_ENV = "GD_CELERY_TEST_BROKER_URL"
DATABASE_ENV = "GD_CELERY_TEST_DATABASE_URL"

# Real time runs in these tests (a worker process cannot share a frozen clock), so the
# numbers are small: short waits ride on ETA messages, LONG_WAIT is beyond the horizon and
# reaches a worker only through the dispatcher. The margins keep that split deterministic
# on a loaded machine (a send happens within 3 s of scheduling).
ETA_HORIZON = timedelta(seconds=1)
# Short, so a killed worker process's step is recovered within seconds; long enough that a
# heartbeat (every third of it) is never late on a loaded machine.
LEASE = timedelta(seconds=4)
SHORT_WAIT = timedelta(milliseconds=300)
LONG_WAIT = timedelta(seconds=4)
DEFAULT_QUEUE = "gd-celery-default"
MAIL_QUEUE = "gd-celery-mail"
BLACK_HOLE_QUEUE = "gd-celery-black-hole"  # no worker consumes it

log = logging.getLogger("tests.celery")

app = Celery("geneva_drive_celery_tests", broker=os.environ.get(BROKER_ENV, "memory://"))
app.conf.task_default_queue = DEFAULT_QUEUE
backend = CeleryBackend(app, eta_horizon=ETA_HORIZON, lease=LEASE)


@worker_init.connect(weak=False)  # the main process: where solo and threads pools run tasks
@worker_process_init.connect(weak=False)  # each prefork child, on its own engine
def _configure_geneva_drive(**_: Any) -> None:
    url = os.environ.get(DATABASE_ENV)
    if url:
        configure(engine=create_engine(url), backend=backend)


def audit(workflow: Workflow, note: str) -> None:
    """Record that a step body ran; commits with the step's outcome (or rolls back with it)."""
    workflow.session.add(AuditEntry(order_id=workflow.hero.id, note=f"{workflow.id}:{note}"))


def runs_of(workflow: Workflow, step_name: str) -> int:
    """How many executions of ``step_name`` exist, this one included."""
    return int(
        workflow.session.scalar(
            select(func.count())
            .select_from(StepExecution)
            .where(StepExecution.workflow_id == workflow.id, StepExecution.step_name == step_name)
        )
        or 0
    )


class CeleryFlakyError(Exception):
    pass


class CeleryTrip(Workflow):
    """Short waits (ETA), a reattempt after an exception, a step routed to another queue."""

    @step(wait=SHORT_WAIT)
    def pack(self) -> None:
        audit(self, "pack")

    @step(on_exception=ExceptionPolicy("reattempt", wait=SHORT_WAIT, max_reattempts=3))
    def book(self) -> None:
        audit(self, "book")  # rolled back with the failure on the first run
        if runs_of(self, "book") == 1:
            raise CeleryFlakyError("the booking service timed out")

    @step(job_options={"queue": MAIL_QUEUE, "priority": 3})
    def notify(self) -> None:
        audit(self, "notify")


class CeleryApproval(Workflow):
    @step(wait_for="approved")
    def approve(self) -> None:
        audit(self, f"approve:{self.received_signal.payload['by']}")


class CeleryBatch(Workflow):
    """A resumable step cut into several executions, each a Celery message of its own."""

    @resumable_step(max_iterations=2)
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(range(5)):
            audit(self, f"walk:{item}")


class CeleryLongNap(Workflow):
    """A wait beyond the ETA horizon: only the dispatcher sends it."""

    @step(wait=LONG_WAIT)
    def wake(self) -> None:
        audit(self, "wake")


class CeleryOnce(Workflow):
    @step
    def only(self) -> None:
        audit(self, "only")


class CeleryHangs(Workflow):
    """Blocks forever on its first run, so a test can kill the worker in the middle of it."""

    @step
    def hang(self) -> None:
        if runs_of(self, "hang") == 1:
            log.warning(
                "celery-hang: execution of workflow %s blocks in pid %d", self.id, os.getpid()
            )
            threading.Event().wait()
        audit(self, "hang")


class CeleryLongWalk(Workflow):
    """A resumable step of WALK_ITEMS items of a few milliseconds each: still walking when a
    test shuts the worker down."""

    @resumable_step
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(range(WALK_ITEMS)):
            audit(self, f"walk:{item}")
            if item == 1:
                log.warning("celery-walk: workflow %s is walking in pid %d", self.id, os.getpid())
            threading.Event().wait(0.02)  # the item's work


WALK_ITEMS = 1000


class CeleryAwaits(Workflow):
    """An async step: the Celery task runs it to completion on a loop of its own, then the
    sync step after it, each message a step."""

    @step
    async def call(self) -> None:
        import asyncio

        await asyncio.sleep(0.01)  # the gateway's I/O
        self.async_session.add(AuditEntry(order_id=self.hero.id, note=f"{self.id}:call"))
        await self.async_session.flush()

    @step
    def after(self) -> None:
        audit(self, "after")

"""Run steps in-process right after commit — for scripts and tests.

Steps with a wait in the future are left scheduled (drive them with ``geneva_drive.testing``
or a worker). A step that schedules the next one does not recurse: the wake-ups go into a
per-thread queue drained by the outermost call, so long workflows use constant stack.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

from geneva_drive.core.ports import EnqueuedStep
from geneva_drive.core.settings import settings
from geneva_drive.engine.executor import run_execution
from geneva_drive.runtime.backends.database import DATABASE_JOB_OPTIONS


class InlineBackend:
    """``accepted_job_options``: the job-option keys to allow — those of the database worker
    by default; pass e.g. ``CeleryBackend.accepted_job_options`` to run a Celery app's
    workflows inline in its tests."""

    def __init__(
        self,
        *,
        run_delayed: bool = False,
        accepted_job_options: Iterable[str] = DATABASE_JOB_OPTIONS,
    ) -> None:
        self.run_delayed = run_delayed
        self.accepted_job_options = frozenset(accepted_job_options)
        self._local = threading.local()

    def enqueue(self, step: EnqueuedStep) -> None:
        if not self.run_delayed and step.scheduled_for > settings().clock.now():
            return
        queue: deque[int] | None = getattr(self._local, "queue", None)
        if queue is not None:
            queue.append(step.execution_id)
            return
        queue = self._local.queue = deque([step.execution_id])
        try:
            while queue:
                run_execution(queue.popleft(), reraise=False)
        finally:
            self._local.queue = None

    def __repr__(self) -> str:
        return f"InlineBackend(run_delayed={self.run_delayed})"

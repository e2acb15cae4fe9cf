"""The default backend: the ``scheduled`` rows *are* the queue; workers poll and claim them.

``enqueue`` runs after the writing transaction committed. It only shortens the wait for a
row that is due now:

- the worker thread that just finished a step takes the step it scheduled itself (eager
  continuation — see ``Worker``), and nothing else is woken for it;
- an idle worker thread in this process is woken through its worker's ``Wakeup``;
- on PostgreSQL, ``NOTIFY geneva_drive, '<queue>'`` wakes idle workers in other processes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Protocol

from geneva_drive.core.ports import EnqueuedStep
from geneva_drive.core.settings import settings
from geneva_drive.storage import queries
from geneva_drive.storage.dialects import dialect_of

# The database worker routes by these two columns; the inline backend accepts the same, so a
# test suite on it refuses what a production worker would silently ignore.
DATABASE_JOB_OPTIONS = frozenset({"queue", "priority"})


class Wakeup(Protocol):
    """What a worker subscribes: ``set()`` is called once per row made due (from any thread)."""

    def set(self) -> None: ...


class DatabaseBackend:
    """Nothing to send: wake-ups only. ``notify=False`` turns off PostgreSQL NOTIFY."""

    accepted_job_options = DATABASE_JOB_OPTIONS
    rows_are_the_queue = True

    def __init__(self, *, notify: bool = True) -> None:
        self.notify = notify
        self._wakeups: list[Wakeup] = []
        self._local = threading.local()

    def subscribe(self, wakeup: Wakeup) -> None:
        self._wakeups.append(wakeup)

    def unsubscribe(self, wakeup: Wakeup) -> None:
        if wakeup in self._wakeups:
            self._wakeups.remove(wakeup)

    @contextlib.contextmanager
    def continuing(self, take: Callable[[EnqueuedStep], bool]) -> Iterator[None]:
        """In this thread, offer each enqueued step to ``take`` first; True means "mine"."""
        previous = getattr(self._local, "take", None)
        self._local.take = take
        try:
            yield
        finally:
            self._local.take = previous

    def continues_here(self) -> bool:
        """Whether this thread is a worker's step thread (it may take what it schedules)."""
        return getattr(self._local, "take", None) is not None

    def notifies_in_transaction(self) -> bool:
        """Whether a start or signal in an application's transaction should NOTIFY inside it
        (``engine.wakeups``); not on a worker's step thread, where the after-commit path decides
        whether the worker takes the row itself."""
        return self.notify and not self.continues_here()

    def enqueue(self, step: EnqueuedStep) -> None:
        take = getattr(self._local, "take", None)
        if take is not None and take(step):
            return  # this worker thread runs it next; nobody else needs waking
        for wakeup in list(self._wakeups):
            wakeup.set()
        if self.notify and not step.notified:  # else its NOTIFY went with the commit
            self._notify(step)

    def _notify(self, step: EnqueuedStep) -> None:
        # Sent here, after commit, on a short autocommit connection — rather than pg_notify()
        # inside the writing transaction — because (1) scheduling stays backend-agnostic and
        # Celery or inline users pay nothing; (2) only here do we know that the eager path did
        # not take the row, so a chain of steps on one worker sends no NOTIFY at all; (3) an
        # application's own commit never queues on PostgreSQL's notification-queue lock. The
        # cost is a lost wake-up if this process dies between commit and NOTIFY: the row is
        # still there and the next poll finds it. (Starts and signals from an application's
        # own transaction NOTIFY inside it instead: ``starting.wake_with_commit``.)
        # Imported here: every configure() builds this backend, and a process that never
        # enqueues (a CLI command reading rows) should not import the engine's wake-ups and
        # the queries they use (issue 42); one that enqueues has imported them already.
        from geneva_drive.engine.wakeups import DUE_NOW_MARGIN

        config = settings()
        engine = config.engine
        if engine is None or not dialect_of(engine).notifies:
            return
        if step.scheduled_for > config.clock.now() + DUE_NOW_MARGIN:
            return  # idle workers already sleep until the next due time
        queue = str(step.job_options.get("queue") or "default")
        # AUTOCOMMIT: the NOTIFY is its own transaction anyway; this saves the BEGIN and COMMIT
        # round trips (the isolation level is put back when the connection returns to the pool).
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            queries.notify_due(connection, queue)

    def __repr__(self) -> str:
        return "DatabaseBackend()" if self.notify else "DatabaseBackend(notify=False)"

"""The database worker: claims due step executions and runs them on a pool of threads.

Each thread loops: claim one due execution (the claim and phase 1 are one transaction), run
it, repeat; when nothing is due it sleeps until the next due time, a poll interval, or a
wake-up from a step scheduled in this process — whichever comes first.

Stopping: the first SIGINT/SIGTERM stops claiming and lets running steps finish; a second
one exits at once (their leases then expire and the executions are recovered).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from types import FrameType

from .backends.database import DatabaseBackend
from .config import Settings, settings
from .executor import RunOptions, claim_and_run
from .queries import next_due_time

log = logging.getLogger("geneva_drive.worker")


class Worker:
    def __init__(
        self,
        *,
        config: Settings | None = None,
        queues: list[str] | None = None,
        concurrency: int | None = None,
        poll_interval: float = 1.0,
        lease: timedelta = timedelta(seconds=30),
    ) -> None:
        self.config = config or settings()
        engine = self.config.require_engine()
        if concurrency is None:
            # SQLite has one writer: more threads would only queue on its lock.
            concurrency = 1 if engine.dialect.name == "sqlite" else 4
        if concurrency < 1:
            raise ValueError(f"Worker(concurrency={concurrency!r}): expected at least 1")
        self.queues = queues or None
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stopping = threading.Event()
        self._wakeup = threading.Event()
        self._until: Callable[[], bool] | None = None
        self.options = RunOptions(
            worker_id=self.worker_id, lease=lease, should_exit=self._stopping.is_set
        )
        self._threads: list[threading.Thread] = []
        self.steps_run = 0
        self._count_lock = threading.Lock()

    # -- running -------------------------------------------------------------------------

    def run(self, *, until: Callable[[], bool] | None = None, install_signals: bool = True) -> None:
        """Run until stopped (or until ``until()`` is true, checked when idle)."""
        backend = self.config.backend
        if isinstance(backend, DatabaseBackend):
            backend.subscribe(self._wakeup)
        if install_signals and threading.current_thread() is threading.main_thread():
            self._install_signal_handlers()
        log.info(
            "worker %s started: concurrency=%d queues=%s",
            self.worker_id,
            self.concurrency,
            ",".join(self.queues or ["*"]),
        )
        self._until = until
        try:
            self._threads = [
                threading.Thread(target=self._loop, name=f"geneva-drive-{i}", daemon=True)
                for i in range(self.concurrency)
            ]
            for thread in self._threads:
                thread.start()
            for thread in self._threads:
                while thread.is_alive():
                    thread.join(timeout=0.5)
        finally:
            if isinstance(backend, DatabaseBackend):
                backend.unsubscribe(self._wakeup)
            log.info("worker %s stopped after %d step(s)", self.worker_id, self.steps_run)

    def stop(self) -> None:
        """Stop claiming; running steps finish (resumable ones stop at their next checkpoint)."""
        self._stopping.set()
        self._wakeup.set()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                ran = claim_and_run(self.queues, self.options, self.config)
            except Exception:
                log.exception("worker loop error; retrying after a pause")
                self._stopping.wait(self.poll_interval)
                continue
            if ran:
                with self._count_lock:
                    self.steps_run += 1
                continue
            if self._until is not None and self._until():
                self.stop()
                return
            self._wakeup.wait(self._idle_timeout())
            self._wakeup.clear()

    def _idle_timeout(self) -> float:
        with self.config.session_factory()() as session:
            due = next_due_time(session, self.queues)
        if due is None:
            return self.poll_interval
        seconds = (due - self.config.clock.now()).total_seconds()
        return max(0.0, min(self.poll_interval, seconds))

    def _install_signal_handlers(self) -> None:
        def handle(signum: int, _frame: FrameType | None) -> None:
            if self._stopping.is_set():
                log.warning("second signal: exiting now; leases of running steps will expire")
                os._exit(1)
            log.info("signal %d: finishing running steps, then stopping", signum)
            self.stop()

        signal.signal(signal.SIGINT, handle)
        signal.signal(signal.SIGTERM, handle)

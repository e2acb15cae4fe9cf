"""The default backend: the ``scheduled`` rows *are* the queue; workers poll and claim them."""

from __future__ import annotations

import threading

from .base import EnqueuedStep


class DatabaseBackend:
    """Nothing to send. An in-process worker is nudged so a step due now starts at once."""

    def __init__(self) -> None:
        self._wakeups: list[threading.Event] = []

    def subscribe(self, wakeup: threading.Event) -> None:
        self._wakeups.append(wakeup)

    def unsubscribe(self, wakeup: threading.Event) -> None:
        if wakeup in self._wakeups:
            self._wakeups.remove(wakeup)

    def enqueue(self, step: EnqueuedStep) -> None:
        for wakeup in list(self._wakeups):
            wakeup.set()

    def __repr__(self) -> str:
        return "DatabaseBackend()"

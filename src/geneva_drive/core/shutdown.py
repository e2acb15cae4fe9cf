"""The process-wide shutdown request every runner honours (gem-spec E.3, rule 3).

When the process is about to stop — a SIGTERM, a Celery warm shutdown, a deploy hook —
:func:`request_shutdown` asks every step running in it to wind down: a resumable step stops at
its next checkpoint, completes as ``continued``, and its successor is scheduled for whoever
runs next; a plain step simply finishes. It is read by the interruption check of every runner:
``geneva-drive worker`` (which also stops claiming), ``executor.run_execution``, the testing
helpers that run interruptibly (``perform_next_step``), and the Celery task. Runs started
with ``interruptible=False`` (``speedrun``) ignore it, as they ignore every interruption rule.

Why process-wide state, when everything else is passed in explicitly: a shutdown concerns the
process, and the code that learns about it (a signal handler, a Celery signal receiver) has
no handle on the steps that are running. The request stays until :func:`clear_shutdown_request`,
so a step that starts after it stops at its first checkpoint too.

Thread-safe and cheap to read: a ``threading.Event``, whose ``is_set()`` takes no lock — the
interruption check reads it at every checkpoint. Safe to call from a signal handler.
"""

from __future__ import annotations

import threading

__all__ = ["clear_shutdown_request", "request_shutdown", "shutdown_requested"]

_requested = threading.Event()


def request_shutdown() -> None:
    """Ask every step running in this process to stop at its next checkpoint."""
    _requested.set()


def shutdown_requested() -> bool:
    """Whether :func:`request_shutdown` was called (and not cleared since)."""
    return _requested.is_set()


def clear_shutdown_request() -> None:
    """Withdraw the request: steps started from now on run as usual (tests, an embedded app)."""
    _requested.clear()

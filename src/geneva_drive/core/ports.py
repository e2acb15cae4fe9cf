"""Ports: interfaces declared here, at the bottom, and implemented by the layers above.

A backend (``runtime.backends``, ``contrib.celery``) implements :class:`Backend`; the engine
hands it an :class:`EnqueuedStep` once the row is committed. Declaring them here lets the
settings, the engine and the DSL name a backend without importing any of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol


@dataclass(frozen=True)
class EnqueuedStep:
    execution_id: int
    workflow_id: int
    step_name: str
    scheduled_for: datetime
    job_options: dict[str, Any] = field(default_factory=dict)
    # Its wake-up already went out inside the writing transaction (see ``engine.starting``).
    notified: bool = False


class Backend(Protocol):
    """What a backend implements.

    A backend may also declare ``accepted_job_options``, a frozenset of the job-option keys it
    understands; geneva-drive then refuses any other key: ``create()`` checks the class's and
    the instance's options, and ``configure()`` already refuses, in every class defined so
    far, keys that look like misspellings of accepted ones. Without it, any key passes.

    And ``rows_are_the_queue = True`` when its workers read the ``scheduled`` rows themselves
    (the database worker), and ``notifies_in_transaction()`` when a start or signal in an
    application's transaction should wake them with a NOTIFY inside that transaction.
    """

    def enqueue(self, step: EnqueuedStep) -> None:
        """Deliver a wake-up for a committed scheduled execution. Must not raise on duplicates."""


def accepted_job_options(backend: Any) -> frozenset[str] | None:
    """The job-option keys ``backend`` declares it understands (None: it takes any)."""
    accepted: Iterable[str] | None = getattr(backend, "accepted_job_options", None)
    return None if accepted is None else frozenset(accepted)


def rows_are_the_queue(backend: Any) -> bool:
    """Whether ``backend``'s workers read the scheduled rows themselves (see :class:`Backend`)."""
    return bool(getattr(backend, "rows_are_the_queue", False))


def notifies_in_transaction(backend: Any) -> bool:
    """Whether ``backend`` wants a NOTIFY inside the writing transaction (see :class:`Backend`)."""
    wants = getattr(backend, "notifies_in_transaction", None)
    return bool(wants is not None and wants())

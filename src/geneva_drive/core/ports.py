"""Ports: interfaces declared here, at the bottom, and implemented by the layers above.

A backend (``runtime.backends``, ``contrib.celery``) implements :class:`Backend`; the engine
hands it an :class:`EnqueuedStep` once the row is committed. Declaring them here lets the
settings, the engine and the DSL name a backend without importing any of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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


# The mapped class of the workflows table is ``definition.workflow.Workflow``, a layer above
# the queries that read it. ``geneva_drive/__init__.py`` (which every import of geneva-drive
# runs first) provides how to import it, so a query run before anything imported the DSL —
# ``admin.stats`` from a script — still finds it.
_workflow_model_loaders: list[Callable[[], object]] = []


def provide_workflow_model(load: Callable[[], object]) -> None:
    _workflow_model_loaders[:] = [load]


def load_workflow_model() -> None:
    """Import the mapped class of the workflows table (a no-op once it is imported)."""
    for load in _workflow_model_loaders:
        load()

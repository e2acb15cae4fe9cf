"""The backend protocol and the after-commit discipline every backend shares.

A step execution row is the obligation; a backend only delivers a *wake-up* for it. Wake-ups
are sent strictly after the transaction that wrote the row commits (never for a rolled-back
row), unless ``enqueue_after_commit`` is off or ``with_inline_enqueue()`` is active.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import event
from sqlalchemy.orm import Session

from ..config import Settings, enqueues_deferred, settings_of
from ..queries.bypass import inside

if TYPE_CHECKING:
    from ..models import StepExecution
    from ..workflow import Workflow

_PENDING = "geneva_drive_pending_enqueues"
_LISTENING = "geneva_drive_listening"


@dataclass(frozen=True)
class EnqueuedStep:
    execution_id: int
    workflow_id: int
    step_name: str
    scheduled_for: datetime
    job_options: dict[str, Any] = field(default_factory=dict)
    # Its wake-up already went out inside the writing transaction (see ``starting``).
    notified: bool = False

    @classmethod
    def for_execution(
        cls, workflow: Workflow, execution: StepExecution, job_options: dict[str, Any] | None = None
    ) -> EnqueuedStep:
        """The wake-up for ``execution``; job options merged as when it was scheduled.

        A row whose step (or class) is gone gets no options: the backend's default routing.
        """
        if job_options is None:
            step_def = type(workflow).steps.named(execution.step_name)
            job_options = workflow.merged_job_options(step_def) if step_def is not None else {}
        return cls(
            execution.id,
            workflow.id,
            execution.step_name,
            execution.scheduled_for,
            job_options,
        )


class Backend(Protocol):
    """What a backend implements.

    A backend may also declare ``accepted_job_options``, a frozenset of the job-option keys it
    understands; geneva-drive then refuses any other key: ``create()`` checks the class's and
    the instance's options, and ``configure()`` already refuses, in every class defined so
    far, keys that look like misspellings of accepted ones. Without it, any key passes.
    """

    def enqueue(self, step: EnqueuedStep) -> None:
        """Deliver a wake-up for a committed scheduled execution. Must not raise on duplicates."""


# The database worker routes by these two columns; the inline backend accepts the same, so a
# test suite on it refuses what a production worker would silently ignore.
DATABASE_JOB_OPTIONS = frozenset({"queue", "priority"})


def job_option_problem(
    backend: Any, keys: Iterable[str], *, misspelt_only: bool = False
) -> str | None:
    """Why ``backend`` cannot take job options with ``keys`` (with a "did you mean"), or None.

    ``misspelt_only``: complain only about keys close to one the backend accepts — the check
    ``configure()`` runs over every class of the process, some of which may be meant for
    another backend (a Celery app's classes in a test run on the database backend).
    """
    accepted: frozenset[str] | None = getattr(backend, "accepted_job_options", None)
    if accepted is None:
        return None
    unknown = sorted(set(keys) - accepted)
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(accepted), n=1)
        if close or not misspelt_only:
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    if not hints:
        return None
    several = len(hints) > 1
    return (
        f"job option{'s' if several else ''} {', '.join(hints)} "
        f"{'are' if several else 'is'} not understood by the configured backend "
        f"{type(backend).__name__}, which accepts: {', '.join(sorted(accepted))} (a key it "
        "does not know would be ignored silently)"
    )


def enqueue_after_commit(session: Session, step: EnqueuedStep) -> None:
    """Hand ``step`` to the session's backend once ``session``'s transaction commits.

    The backend is that of the settings the session was made from (a ``Worker(config=…)``'s
    own), read now: the settings in force at commit time may be other ones.
    """
    config = settings_of(session)
    if not enqueues_deferred(config) or not session.in_transaction():
        _deliver([(step, config)])
        return
    from ..starting import wake_with_commit  # late: starting imports this module

    step = wake_with_commit(session, step)  # PostgreSQL: NOTIFY with the caller's commit
    if _LISTENING not in session.info:
        # Per-session listeners (nothing global is installed); they stay for the session's
        # life because SQLAlchemy forbids removing a listener while it is being dispatched.
        session.info[_LISTENING] = True
        event.listen(session, "after_commit", _after_commit)
        event.listen(session, "after_soft_rollback", _after_soft_rollback)
    # Remember the (innermost) transaction that wrote the row: a rolled-back savepoint
    # drops only its own wake-ups.
    transaction = session.get_nested_transaction() or session.get_transaction()
    session.info.setdefault(_PENDING, []).append((transaction, (step, config)))


def _detach(session: Session) -> list[tuple[EnqueuedStep, Settings]]:
    pending: list[tuple[Any, tuple[EnqueuedStep, Settings]]] = session.info.pop(_PENDING, None)
    return [delivery for _, delivery in pending or []]


def _after_commit(session: Session) -> None:
    # SQLAlchemy also fires after_commit when a savepoint is released; only the outermost
    # commit makes the rows visible to workers.
    if session.in_nested_transaction():
        return
    _deliver(_detach(session))


def _after_soft_rollback(session: Session, rolled_back: Any) -> None:
    # The rows written in the rolled-back transaction (or savepoints inside it) never
    # existed: nothing to wake for them.
    pending = session.info.get(_PENDING) or []
    session.info[_PENDING] = [(tx, step) for tx, step in pending if not inside(tx, rolled_back)]


def _deliver(deliveries: list[tuple[EnqueuedStep, Settings]]) -> None:
    for step, config in deliveries:
        if config.backend is None:
            continue
        try:
            config.backend.enqueue(step)
        except Exception:  # the row is committed; housekeeping/dispatch will pick it up
            config.logger.exception(
                "enqueue of execution %s failed; it stays scheduled and will be recovered",
                step.execution_id,
            )

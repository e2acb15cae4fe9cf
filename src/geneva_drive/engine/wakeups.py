"""Wake-ups: how a committed step reaches a process that runs it.

A step execution row is the obligation; a backend only delivers a *wake-up* for it. Wake-ups
are sent strictly after the transaction that wrote the row commits (never for a rolled-back
row), unless ``enqueue_after_commit`` is off or ``with_inline_enqueue()`` is active. On
PostgreSQL with the database backend the wake-up is a NOTIFY sent inside the writing
transaction instead, delivered by its commit, once per queue.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from geneva_drive.core.ports import EnqueuedStep, notifies_in_transaction
from geneva_drive.core.settings import Settings, enqueues_deferred, settings_of
from geneva_drive.engine.committed import after_commit
from geneva_drive.storage import queries
from geneva_drive.storage.queries.bypass import connection_of

if TYPE_CHECKING:
    from geneva_drive.definition.workflow import Workflow
    from geneva_drive.storage.models import StepExecution

# A row due within this margin counts as due now: its queue is notified at commit (a clock a
# little ahead costs little; a worker woken slightly early just sleeps until the row's due time).
DUE_NOW_MARGIN = timedelta(seconds=1)


def enqueued_step(
    workflow: Workflow, execution: StepExecution, job_options: dict[str, Any] | None = None
) -> EnqueuedStep:
    """The wake-up for ``execution``; job options merged as when it was scheduled.

    A row whose step (or class) is gone gets no options: the backend's default routing.
    """
    if job_options is None:
        step_def = type(workflow).steps.named(execution.step_name)
        job_options = workflow.merged_job_options(step_def) if step_def is not None else {}
    return EnqueuedStep(
        execution.id, workflow.id, execution.step_name, execution.scheduled_for, job_options
    )


def enqueue_after_commit(session: Session, step: EnqueuedStep) -> None:
    """Hand ``step`` to the session's backend once ``session``'s transaction commits.

    The backend is that of the settings the session was made from (a ``Worker(config=…)``'s
    own), read now: the settings in force at commit time may be other ones. The wake-up is
    one of ``engine.committed``'s after-commit actions: sent at the outermost commit, in the
    order written with the log lines and counts of the same transaction, and dropped with
    the (savepoint) transaction that wrote its row if that rolls back.
    """
    config = settings_of(session)
    if not enqueues_deferred(config) or not session.in_transaction():
        _deliver(step, config)
        return
    step = wake_with_commit(session, step)  # PostgreSQL: NOTIFY with the caller's commit
    after_commit(session, partial(_deliver, step, config))


def _deliver(step: EnqueuedStep, config: Settings) -> None:
    if config.backend is None:
        return
    try:
        config.backend.enqueue(step)
    except Exception:  # the row is committed; housekeeping/dispatch will pick it up
        config.logger.exception(
            "enqueue of execution %s failed; it stays scheduled and will be recovered",
            step.execution_id,
        )


# -- the wake-up with the caller's commit --------------------------------------------------

_WOKEN = "geneva_drive_woken_queues"


def wake_with_commit(session: Session, step: EnqueuedStep) -> EnqueuedStep:
    """For ``enqueue_after_commit``: on PostgreSQL, NOTIFY in the caller's transaction (once
    per queue) and return the step marked ``notified``; else the step unchanged."""
    if step.notified:
        return step
    queue = str(step.job_options.get("queue") or "default")
    wake = _wake_for(session, queue, step.scheduled_for)
    if wake is _NO:
        return step
    if wake is _NOW:
        queries.notify_due(connection_of(session), queue)
        _mark_woken(session, queue)
    return dataclasses.replace(step, notified=True)


def wake_in_statement(session: Session, queue: str, due: datetime) -> tuple[str | None, bool]:
    """For a statement of ours that makes a row of ``queue`` due at ``due``: the queue to
    NOTIFY inside that statement (None: no NOTIFY to send), and whether the row counts as
    notified by this transaction (its ``EnqueuedStep.notified``). Call :func:`note_woken`
    once the statement has sent it."""
    wake = _wake_for(session, queue, due)
    return (queue if wake is _NOW else None), wake is not _NO


def note_woken(session: Session, queue: str) -> None:
    """A statement of ours has sent the NOTIFY for ``queue`` in this transaction."""
    _mark_woken(session, queue)


# What a step due now needs from this transaction: nothing (the after-commit path wakes, or
# nobody needs to), a NOTIFY now, or nothing more (its queue was notified already).
_NO, _NOW, _DONE = "no", "now", "done"


def wake_for_start(session: Session, queue: str, due: datetime | None) -> tuple[str | None, bool]:
    """:func:`wake_in_statement` for a start whose first step is due at ``due`` (None: the
    workflow has no step to run)."""
    return (None, False) if due is None else wake_in_statement(session, queue, due)


def _wake_for(session: Session, queue: str, due: datetime) -> str:
    config = settings_of(session)
    backend = config.backend
    if (
        not notifies_in_transaction(backend)  # a worker's step thread: the after-commit path
        or not enqueues_deferred(config)
        or due > config.clock.now() + DUE_NOW_MARGIN  # idle workers sleep until it is due
        or not queries.notifies(connection_of(session))
    ):
        return _NO
    return _DONE if queue in _woken(session) else _NOW


def _woken(session: Session) -> set[str]:
    """Queues already notified in the current transaction, savepoints included.

    A NOTIFY issued in a savepoint that was rolled back is gone with it, so only entries of
    the current (nested) transaction and its ancestors count.
    """
    entries: list[tuple[Any, str]] = session.info.get(_WOKEN) or []
    if not entries:
        return set()
    chain, transaction = set(), session.get_nested_transaction() or session.get_transaction()
    while transaction is not None:
        chain.add(id(transaction))
        transaction = transaction.parent
    return {queue for tx, queue in entries if id(tx) in chain}


def _mark_woken(session: Session, queue: str) -> None:
    transaction = session.get_nested_transaction() or session.get_transaction()
    entries: list[tuple[Any, str]] = session.info.get(_WOKEN) or []
    root = session.get_transaction()
    # Entries of an earlier top-level transaction are stale.
    entries = [e for e in entries if _root(e[0]) is root]
    entries.append((transaction, queue))
    session.info[_WOKEN] = entries


def _root(transaction: Any) -> Any:
    while transaction is not None and transaction.parent is not None:
        transaction = transaction.parent
    return transaction

"""Recovering executions whose run was lost: one at a time (an operator's verb, a lease that
ran out), or in sweeps of one transaction per row that never loop on a row that fails.

Housekeeping (``runtime.housekeeping``) and every worker call these; the Celery dispatcher too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from geneva_drive.core import events
from geneva_drive.core.settings import Settings, settings, settings_of
from geneva_drive.core.states import ExecutionState, WorkflowState
from geneva_drive.definition.workflow import as_workflow
from geneva_drive.engine import limits, outcomes, writer
from geneva_drive.engine.committed import after_commit
from geneva_drive.storage import queries
from geneva_drive.storage.db import session_factory

if TYPE_CHECKING:
    from geneva_drive.storage.models import StepExecution

log = logging.getLogger("geneva_drive.housekeeping")

RECOVERY_ACTIONS = ("reattempt", "cancel")
# The reasons the sweeps recover for (a transient error's hand-back has its message instead).
RECOVERY_REASONS = ("lease_expired", "stuck_in_progress", "stuck_scheduled")


def recover_execution(
    session: Session,
    execution_id: int,
    action: str = "reattempt",
    *,
    still_stuck: Callable[[StepExecution], bool] | None = None,
    reason: str = "manual",
) -> bool:
    """Recover one scheduled or in-progress execution whose run was lost; True if it did.

    Runs in ``session``'s transaction (commit afterwards) under the workflow row lock, then
    the execution's, and re-checks under them: it does nothing unless the execution is still
    ``scheduled``/``in_progress`` and ``still_stuck(execution)`` holds (callers pass the rule
    that selected the row — a heartbeat or a claim may have happened since).

    ``reattempt``: the execution ends ``completed``/``recovered``; a performing workflow goes
    back to ready; a resumable step continues in a successor carrying its cursor, any other
    step runs again in a fresh execution. ``cancel``: the execution ends
    ``canceled``/``recovered`` and the workflow is canceled.

    A paused workflow is left paused whatever the action (H-12): its scheduled execution is
    not touched (``resume()`` runs it); an in-progress one whose worker died is closed —
    ``recovered``, or ``workflow_paused`` for a resumable step so that ``resume()`` continues
    from its cursor — and nothing new is scheduled.
    """
    if action not in RECOVERY_ACTIONS:
        raise ValueError(
            f"recover_execution(execution_id={execution_id}, action={action!r}): the action "
            f"must be one of {', '.join(map(repr, RECOVERY_ACTIONS))}; configure "
            "stuck_recovery_action accordingly"
        )
    found = queries.get_execution(session, execution_id)
    if found is None:
        return False
    workflow = as_workflow(queries.lock_workflow(session, found.workflow_id))
    execution = queries.lock_execution(session, execution_id)  # after the workflow: lock order
    if workflow is None or execution is None:
        return False
    if execution.state not in (ExecutionState.SCHEDULED, ExecutionState.IN_PROGRESS):
        return False
    if still_stuck is not None and not still_stuck(execution):
        return False
    step_def = type(workflow).steps.named(execution.step_name)
    plan = outcomes.for_recovery(
        action,
        was=ExecutionState(execution.state),
        workflow=WorkflowState(workflow.state),
        resumable=step_def is not None and step_def.resumable,
    )
    if plan is None:
        return False  # a paused workflow's scheduled row, kept on purpose for resume()
    execution.write_metadata(
        "recovery",
        {
            "reason": reason,
            "action": action,
            "state": execution.state,
            "lease_owner": execution.lease_owner,
        },
    )
    logger, was = events.execution_logger(workflow, execution), str(execution.state)
    counted = {
        "workflow_class": type(workflow).__name__,
        "step_name": execution.step_name,
        "reason": reason if reason in RECOVERY_REASONS else "other",
    }
    now = settings_of(session).clock.now()
    held = limits.held_key(execution) if execution.state == ExecutionState.IN_PROGRESS else None
    writer.apply(session, workflow, execution, plan, now, guarded=False)
    if held is not None:  # a crashed holder's slot, freed with its recovery
        limits.release(session, execution.id, held, now)
    session.flush()

    def tell() -> None:  # once committed: a recovery rolled back did not happen
        logger.warning("recovering %s execution (%s) with %s", was, reason, action)
        if events.active("recovery"):
            events.emit("recovery", counted)

    after_commit(session, tell)
    return True


# -- the sweeps ------------------------------------------------------------------------------


def recover_expired_leases(config: Settings | None = None, *, limit: int | None = None) -> int:
    """Recover every in-progress execution whose lease ran out. Returns how many were."""
    config = config or settings()
    now = config.clock.now()

    def expired(execution: StepExecution) -> bool:
        return (
            execution.state == ExecutionState.IN_PROGRESS
            and execution.lease_expires_at is not None
            and execution.lease_expires_at < now
        )

    recovered, _ = sweep(
        config,
        lambda s, after, n: queries.expired_lease_ids(s, now, n, after),
        expired,
        "reattempt",
        "lease_expired",
        limit=limit,
    )
    return recovered


def sweep(
    config: Settings,
    select_batch: Callable[[Session, tuple[datetime, int] | None, int], list[tuple[datetime, int]]],
    still_stuck: Callable[[StepExecution], bool],
    action: str,
    reason: str,
    *,
    limit: int | None = None,
) -> tuple[int, int]:
    """Recover rows batch by batch, one transaction per row. Returns (recovered, failed).

    Keyset pagination: each batch starts after the last row seen, so a row that failed (or
    was no longer stuck) is never selected again in this run — the gem re-selected from the
    start and could loop forever on a row whose recovery always raises (H-20).
    """
    batch_size = config.housekeeping_batch_size
    recovered = failed = 0
    after: tuple[datetime, int] | None = None
    factory = session_factory(config)
    while limit is None or recovered + failed < limit:
        with factory() as session, session.begin():
            batch = select_batch(session, after, batch_size)
        if not batch:
            break
        for key in batch:
            after = key
            try:
                with factory() as session, session.begin():
                    done = recover_execution(
                        session, key[1], action, still_stuck=still_stuck, reason=reason
                    )
            except Exception as error:
                failed += 1
                log.exception("could not recover step execution %s (%s)", key[1], reason)
                report(config, error, {"step_execution_id": key[1], "recovery": reason})
                continue
            recovered += int(done)
        if len(batch) < batch_size:
            break
    return recovered, failed


def report(config: Settings, error: BaseException, context: dict[str, Any]) -> None:
    try:
        config.error_reporter(error, context)
    except Exception:
        log.exception("the error reporter itself failed")

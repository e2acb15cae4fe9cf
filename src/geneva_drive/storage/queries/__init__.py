"""Every query geneva-drive runs, named and documented, one module per concern.

- ``claims``: picking due executions for a worker, leases.
- ``executions``: reading and writing execution rows (start, completion, sweep, history).
- ``handover``: a workflow's last completion with the next workflow's claim and start.
- ``workflows``: workflow-row look-ups.
- ``results``: what steps returned (``result_of``, a child's answer to its parent).
- ``signals``: signal rows and the executions that wait for them.
- ``housekeeping``: stuck rows, batched cleanup, gauges.
- ``dispatch``: what an external queue (Celery) was sent and must be sent.
- ``coordination``: NOTIFY/LISTEN and the housekeeping lock.
- ``bypass``: the ORM bypass and the DBAPI short path (the one place relying on SQLAlchemy
  internals), used by the modules above.

Only the engine's modules call these. Lock order, everywhere: the workflow row first, then its
execution rows. Holding the workflow row lock is what serialises everything that happens to one
workflow (phase 1 and phase 3 of the executor, scheduling, signals, operator verbs,
housekeeping); execution rows are only written by a holder of their workflow's lock.

One exception: on PostgreSQL a step's completion in one statement holds its in-progress
execution ``FOR SHARE`` while it waits for the workflow row (``complete_in_one_statement``).
So nothing that holds a workflow row may wait for the lock of an execution in progress: a run
by id locks its execution only while it is scheduled (``prepare.lock_both``), and only a
recovery taking the execution from a run waits for it, a deadlock the database settles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from geneva_drive.core import lazy

if TYPE_CHECKING:
    from geneva_drive.storage.queries._sql import defined_workflow_model, is_transient
    from geneva_drive.storage.queries.bypass import (
        lock_execution,
        lock_workflow,
        remember_workflow_lock,
        write_through,
    )
    from geneva_drive.storage.queries.children import child_results
    from geneva_drive.storage.queries.claims import (
        claim_due_execution,
        claim_execution,
        expired_lease_ids,
        extend_leases,
        next_claimable_due_time,
        recovered_from,
    )
    from geneva_drive.storage.queries.coordination import (
        listen_statement,
        notifies,
        notify_due,
        release_housekeeping_lock,
        try_housekeeping_lock,
    )
    from geneva_drive.storage.queries.dispatch import (
        delivery_facts,
        executions_to_dispatch,
        record_job_id,
    )
    from geneva_drive.storage.queries.executions import (
        attempt_number,
        checkpoint_execution,
        complete_in_one_statement,
        consecutive_reattempt_count,
        current_execution,
        execution_history,
        executions_of_step,
        get_execution,
        insert_execution,
        newest_paused_marker,
        start_both,
        successor_of,
        sweep_strays,
    )
    from geneva_drive.storage.queries.handover import (
        Handover,
        Limited,
        NextClaim,
        finish_and_start_next,
    )
    from geneva_drive.storage.queries.housekeeping import (
        delete_executions_of_old_workflows,
        delete_old_workflows,
        delete_signals_of_old_workflows,
        stuck_in_progress_ids,
        stuck_scheduled_ids,
        waiting_counts,
    )
    from geneva_drive.storage.queries.results import (
        last_step_result,
        last_step_results,
        step_result,
        succeeded_newest_first,
        succeeded_steps,
    )
    from geneva_drive.storage.queries.signals import (
        executions_attached_to,
        find_delivery,
        newest_signal_named,
        parked_executions,
        unconsumed_signals,
    )
    from geneva_drive.storage.queries.workflows import find_ongoing_duplicate

# Each name's module is imported when the name is first used (PEP 562): a command that reads a
# page of workflows needs the admin queries, not the claim, the handover or the dispatch, which
# would cost every CLI command their import at start (issue 42).
_EXPORTS: dict[str, str] = {
    "Handover": "geneva_drive.storage.queries.handover",
    "NextClaim": "geneva_drive.storage.queries.handover",
    "Limited": "geneva_drive.storage.queries.handover",
    "attempt_number": "geneva_drive.storage.queries.executions",
    "checkpoint_execution": "geneva_drive.storage.queries.executions",
    "child_results": "geneva_drive.storage.queries.children",
    "claim_due_execution": "geneva_drive.storage.queries.claims",
    "claim_execution": "geneva_drive.storage.queries.claims",
    "complete_in_one_statement": "geneva_drive.storage.queries.executions",
    "consecutive_reattempt_count": "geneva_drive.storage.queries.executions",
    "current_execution": "geneva_drive.storage.queries.executions",
    "defined_workflow_model": "geneva_drive.storage.queries._sql",
    "delete_executions_of_old_workflows": "geneva_drive.storage.queries.housekeeping",
    "delete_old_workflows": "geneva_drive.storage.queries.housekeeping",
    "delete_signals_of_old_workflows": "geneva_drive.storage.queries.housekeeping",
    "delivery_facts": "geneva_drive.storage.queries.dispatch",
    "execution_history": "geneva_drive.storage.queries.executions",
    "executions_attached_to": "geneva_drive.storage.queries.signals",
    "executions_of_step": "geneva_drive.storage.queries.executions",
    "executions_to_dispatch": "geneva_drive.storage.queries.dispatch",
    "expired_lease_ids": "geneva_drive.storage.queries.claims",
    "extend_leases": "geneva_drive.storage.queries.claims",
    "find_delivery": "geneva_drive.storage.queries.signals",
    "find_ongoing_duplicate": "geneva_drive.storage.queries.workflows",
    "finish_and_start_next": "geneva_drive.storage.queries.handover",
    "get_execution": "geneva_drive.storage.queries.executions",
    "insert_execution": "geneva_drive.storage.queries.executions",
    "is_transient": "geneva_drive.storage.queries._sql",
    "last_step_result": "geneva_drive.storage.queries.results",
    "last_step_results": "geneva_drive.storage.queries.results",
    "listen_statement": "geneva_drive.storage.queries.coordination",
    "lock_execution": "geneva_drive.storage.queries.bypass",
    "lock_workflow": "geneva_drive.storage.queries.bypass",
    "newest_paused_marker": "geneva_drive.storage.queries.executions",
    "newest_signal_named": "geneva_drive.storage.queries.signals",
    "next_claimable_due_time": "geneva_drive.storage.queries.claims",
    "notifies": "geneva_drive.storage.queries.coordination",
    "notify_due": "geneva_drive.storage.queries.coordination",
    "parked_executions": "geneva_drive.storage.queries.signals",
    "record_job_id": "geneva_drive.storage.queries.dispatch",
    "recovered_from": "geneva_drive.storage.queries.claims",
    "release_housekeeping_lock": "geneva_drive.storage.queries.coordination",
    "remember_workflow_lock": "geneva_drive.storage.queries.bypass",
    "start_both": "geneva_drive.storage.queries.executions",
    "step_result": "geneva_drive.storage.queries.results",
    "stuck_in_progress_ids": "geneva_drive.storage.queries.housekeeping",
    "stuck_scheduled_ids": "geneva_drive.storage.queries.housekeeping",
    "succeeded_newest_first": "geneva_drive.storage.queries.results",
    "succeeded_steps": "geneva_drive.storage.queries.results",
    "successor_of": "geneva_drive.storage.queries.executions",
    "sweep_strays": "geneva_drive.storage.queries.executions",
    "try_housekeeping_lock": "geneva_drive.storage.queries.coordination",
    "unconsumed_signals": "geneva_drive.storage.queries.signals",
    "waiting_counts": "geneva_drive.storage.queries.housekeeping",
    "write_through": "geneva_drive.storage.queries.bypass",
}


def __getattr__(name: str) -> Any:
    return lazy.load(__name__, _EXPORTS, globals(), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "Handover",
    "Limited",
    "NextClaim",
    "attempt_number",
    "checkpoint_execution",
    "child_results",
    "claim_due_execution",
    "claim_execution",
    "complete_in_one_statement",
    "consecutive_reattempt_count",
    "current_execution",
    "defined_workflow_model",
    "delete_executions_of_old_workflows",
    "delete_old_workflows",
    "delete_signals_of_old_workflows",
    "delivery_facts",
    "execution_history",
    "executions_attached_to",
    "executions_of_step",
    "executions_to_dispatch",
    "expired_lease_ids",
    "extend_leases",
    "find_delivery",
    "find_ongoing_duplicate",
    "finish_and_start_next",
    "get_execution",
    "insert_execution",
    "is_transient",
    "last_step_result",
    "last_step_results",
    "listen_statement",
    "lock_execution",
    "lock_workflow",
    "newest_paused_marker",
    "newest_signal_named",
    "next_claimable_due_time",
    "notifies",
    "notify_due",
    "parked_executions",
    "record_job_id",
    "recovered_from",
    "release_housekeeping_lock",
    "remember_workflow_lock",
    "start_both",
    "step_result",
    "stuck_in_progress_ids",
    "stuck_scheduled_ids",
    "succeeded_newest_first",
    "succeeded_steps",
    "successor_of",
    "sweep_strays",
    "try_housekeeping_lock",
    "unconsumed_signals",
    "waiting_counts",
    "write_through",
]

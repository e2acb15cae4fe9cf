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

from geneva_drive.storage.queries._sql import is_transient
from geneva_drive.storage.queries.bypass import (
    lock_execution,
    lock_workflow,
    remember_workflow_lock,
    write_through,
)
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
from geneva_drive.storage.queries.handover import Handover, NextClaim, finish_and_start_next
from geneva_drive.storage.queries.housekeeping import (
    delete_executions_of_old_workflows,
    delete_old_workflows,
    delete_signals_of_old_workflows,
    stuck_in_progress_ids,
    stuck_scheduled_ids,
    waiting_counts,
    workflow_counts,
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

__all__ = [
    "Handover",
    "NextClaim",
    "checkpoint_execution",
    "claim_due_execution",
    "claim_execution",
    "complete_in_one_statement",
    "consecutive_reattempt_count",
    "current_execution",
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
    "workflow_counts",
    "write_through",
]

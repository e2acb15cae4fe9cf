"""How every ending of a step execution changes the rows: one decision table, no database.

Each way an execution can end — the body's result, a guard or precondition in phase 1, a
phase-1 error, a signal timeout, an operator verb, lease or stuck recovery — is turned here
into a :class:`Plan`: how the execution row ends, the workflow's next state, what is scheduled
next, how the attached signal settles. :mod:`geneva_drive.writer` applies plans; nothing else
writes execution or workflow state.

The functions are pure: they read only their arguments (policy decisions and reattempt counts
are looked up by the caller beforehand), so the table is tested without a database
(``tests/engine/test_outcome_table.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from geneva_drive.core.states import (
    STAMPED_WORKFLOW_STATES,
    ExecutionState,
    Outcome,
    WorkflowState,
)
from geneva_drive.definition.flow import Action


class Next(StrEnum):
    """What the workflow does after the execution has ended."""

    NOTHING = "nothing"
    FOLLOWING = "following"  # the step after this one in positional order; finish if none
    AGAIN = "again"  # a fresh execution of the same step (a reattempt)
    SUCCESSOR = "successor"  # a resumable step continues, carrying its cursor
    GOTO = "goto"  # a named step (a signal timeout's ``on_timeout="<step>"``)


class Settle(StrEnum):
    """What happens to the signal attached to the execution."""

    KEEP = "keep"  # still claimed: a reattempt or a resume sees the same payload
    CONSUME = "consume"  # the step succeeded: one attached chain ended cleanly
    SKIPPED = "skipped"  # a skip is a decision: it resolves its own step


class ErrorRecord(StrEnum):
    """How much of the error the execution row keeps."""

    NONE = "none"
    METADATA = "metadata"  # a reattempt: the exception in metadata, the columns stay empty
    COLUMNS = "columns"  # a failure: error class, message and backtrace columns too


@dataclass(frozen=True)
class Plan:
    """The row changes one ending of an execution stands for.

    ``workflow``: the workflow's new state, or None to leave it as it is. ``reason``: why a
    reattempt happened (``flow_control`` reattempts are not counted against the cap).
    ``why``: the reason an operator is told when the plan pauses or cancels the workflow, or
    times out a wait (``policy``, ``reattempt_cap``, ``flow_control``, ``missing_code``,
    ``timed_out``, ``operator``, ``cancel_condition``; see ``engine.state_log``).
    """

    state: ExecutionState
    outcome: Outcome
    workflow: WorkflowState | None = None
    next: Next = Next.NOTHING
    wait: timedelta | None = None
    rewind: bool = False
    goto: str | None = None
    settle: Settle = Settle.KEEP
    error: ErrorRecord = ErrorRecord.NONE
    reason: str | None = None
    why: str | None = None


_STAMPS = {
    ExecutionState.COMPLETED: "completed_at",
    ExecutionState.FAILED: "failed_at",
    ExecutionState.CANCELED: "canceled_at",
    ExecutionState.SKIPPED: "skipped_at",
}


def ended_columns(plan: Plan, now: datetime) -> dict[str, Any]:
    """The columns of an execution row ended by ``plan`` at ``now`` (by attribute name)."""
    return {
        "state": plan.state,
        "outcome": plan.outcome,
        _STAMPS[plan.state]: now,
        "finished_at": now,
        "lease_owner": None,
        "lease_expires_at": None,
    }


_KEEP: Any = object()  # moved_columns: the move leaves this column as it is


def moved_columns(
    was: str | None,
    state: WorkflowState,
    now: datetime,
    *,
    current_step: str | None = _KEEP,
    next_step: str | None = _KEEP,
) -> dict[str, Any]:
    """The columns of a workflow row moving from ``was`` (None: a new row) to ``state`` at
    ``now`` (by attribute name) — what every writer of the workflow row writes for a move,
    the ORM's (``writer.move``) and the statements' (create, start, the chained completion):

    - paused, finished and canceled stamp ``transitioned_at``; leaving them clears it;
    - a finished workflow stands at no step;
    - ``current_step`` (the step it performs) and ``next_step`` (the step it runs next), when
      the move changes them.
    """
    columns: dict[str, Any] = {"state": state}
    if state != was and (state in STAMPED_WORKFLOW_STATES or was in STAMPED_WORKFLOW_STATES):
        columns["transitioned_at"] = now if state in STAMPED_WORKFLOW_STATES else None
    if state == WorkflowState.FINISHED:
        columns["current_step_name"] = None
        columns["next_step_name"] = None
        return columns
    if current_step is not _KEEP:
        columns["current_step_name"] = current_step
    if next_step is not _KEEP:
        columns["next_step_name"] = next_step
    return columns


# -- the body's result (phase 3) and its errors ------------------------------------------------


def for_completion() -> Plan:
    return Plan(
        ExecutionState.COMPLETED,
        Outcome.SUCCESS,
        WorkflowState.READY,
        Next.FOLLOWING,
        settle=Settle.CONSUME,
    )


def for_interruption(wait: timedelta | None) -> Plan:
    """A resumable step stopped at a checkpoint (or suspended): a successor continues."""
    return Plan(
        ExecutionState.COMPLETED, Outcome.CONTINUED, WorkflowState.READY, Next.SUCCESSOR, wait
    )


def for_flow_control(
    action: Action, *, resumable: bool, wait: timedelta | None = None, rewind: bool = False
) -> Plan:
    """``self.cancel()``, ``self.pause()``, ``self.reattempt()``… called inside the body."""
    why = "flow_control"
    if action is Action.CANCEL:
        return Plan(ExecutionState.CANCELED, Outcome.CANCELED, WorkflowState.CANCELED, why=why)
    if action is Action.PAUSE:
        if resumable:  # the marker ``resume()`` continues from
            return Plan(
                ExecutionState.COMPLETED, Outcome.WORKFLOW_PAUSED, WorkflowState.PAUSED, why=why
            )
        return Plan(ExecutionState.CANCELED, Outcome.CANCELED, WorkflowState.PAUSED, why=why)
    if action is Action.REATTEMPT:
        return _reattempt(resumable, wait, reason="flow_control", rewind=rewind)
    if action is Action.SKIP:
        return _skip()
    if action is Action.FINISH:
        return _finish()
    return for_interruption(wait)  # Action.SUSPEND


def for_error(
    action: Action,
    *,
    resumable: bool,
    wait: timedelta | None,
    reason: str,
    at_cap: bool = False,
) -> Plan:
    """An exception, from the body or from phase 1, after the exception policies decided.

    ``reason`` is ``exception_policy`` for the body and ``precondition`` for phase 1; both are
    counted against the reattempt cap alike, and resolved alike. ``at_cap``: the action is the
    terminal one a reattempt turned into at the cap (told to the operator as such).
    """
    why = "reattempt_cap" if at_cap else "policy"
    if action is Action.REATTEMPT:
        return _reattempt(resumable, wait, reason=reason, error=ErrorRecord.METADATA)
    if action is Action.CANCEL:
        return Plan(
            ExecutionState.FAILED,
            Outcome.CANCELED,
            WorkflowState.CANCELED,
            error=ErrorRecord.COLUMNS,
            why=why,
        )
    if action is Action.SKIP:
        return replace(_skip(), error=ErrorRecord.METADATA, why=why if at_cap else None)
    if action is Action.FINISH:
        return replace(_finish(), error=ErrorRecord.METADATA, why=why if at_cap else None)
    return Plan(
        ExecutionState.FAILED,
        Outcome.FAILED,
        WorkflowState.PAUSED,
        error=ErrorRecord.COLUMNS,
        why=why,
    )


def while_canceled(plan: Plan) -> Plan:
    """The workflow was canceled by an operator while the step ran: keep the result only.

    ``plan`` is what the result would mean on a running workflow (for an error, any failure
    plan: policies are not consulted). The row says what the step did; nothing follows, the
    workflow stays canceled, and the attached signal stays as it is.
    """
    if plan.state is ExecutionState.FAILED:
        return Plan(ExecutionState.FAILED, Outcome.CANCELED, error=ErrorRecord.COLUMNS)
    if plan.state is ExecutionState.SKIPPED:
        return Plan(ExecutionState.SKIPPED, Outcome.SKIPPED)
    if plan.state is ExecutionState.COMPLETED and plan.outcome is Outcome.SUCCESS:
        return Plan(ExecutionState.COMPLETED, Outcome.SUCCESS)
    # Stopped at a checkpoint, suspended, reattempting, or canceled or paused by the step
    # itself: it did not finish.
    return Plan(ExecutionState.CANCELED, Outcome.CANCELED)


def while_paused(plan: Plan, *, interrupted: bool) -> Plan:
    """The workflow was paused by an operator while the step ran.

    The step's result is recorded as usual, but the pause holds: where the workflow would go
    back to ``ready`` it stays paused, and its next execution waits for ``resume()``. A
    resumable step that stopped at a checkpoint (``interrupted``) leaves instead the marker
    ``resume()`` continues from.
    """
    if interrupted:
        return Plan(ExecutionState.COMPLETED, Outcome.WORKFLOW_PAUSED)
    if plan.workflow is WorkflowState.READY:
        return replace(plan, workflow=None)
    return plan


def _reattempt(
    resumable: bool,
    wait: timedelta | None,
    *,
    reason: str,
    rewind: bool = False,
    error: ErrorRecord = ErrorRecord.NONE,
) -> Plan:
    return Plan(
        ExecutionState.COMPLETED,
        Outcome.REATTEMPTED,
        WorkflowState.READY,
        Next.SUCCESSOR if resumable else Next.AGAIN,
        wait,
        rewind=rewind and resumable,
        error=error,
        reason=reason,
    )


def _skip() -> Plan:
    return Plan(
        ExecutionState.SKIPPED,
        Outcome.SKIPPED,
        WorkflowState.READY,
        Next.FOLLOWING,
        settle=Settle.SKIPPED,
    )


def _finish() -> Plan:
    return Plan(
        ExecutionState.COMPLETED, Outcome.SUCCESS, WorkflowState.FINISHED, settle=Settle.CONSUME
    )


# -- guards in phase 1, in the gem's order ---------------------------------------------------


def for_ended_workflow() -> Plan:
    """The workflow finished or was canceled before this execution ran: it never will."""
    return Plan(ExecutionState.CANCELED, Outcome.CANCELED)


def for_missing_hero() -> Plan:
    return Plan(ExecutionState.CANCELED, Outcome.CANCELED, WorkflowState.CANCELED)


def for_undefined_step() -> Plan:
    """The deployed code has no such step: fail and pause, for a fix and ``resume_at()``."""
    return Plan(
        ExecutionState.FAILED,
        Outcome.FAILED,
        WorkflowState.PAUSED,
        error=ErrorRecord.COLUMNS,
        why="missing_code",
    )


def for_removed_step() -> Plan:
    """A ``removed_step`` gravestone: skip past it."""
    return _skip()


def for_cancel_condition() -> Plan:
    return Plan(
        ExecutionState.CANCELED, Outcome.CANCELED, WorkflowState.CANCELED, why="cancel_condition"
    )


def for_skip_condition() -> Plan:
    return _skip()


# -- signal timeouts -------------------------------------------------------------------------


def for_fired_timer() -> Plan:
    """The timer row itself, when it resolves its parked execution: it did its job."""
    return Plan(ExecutionState.COMPLETED, Outcome.TIMED_OUT)


def for_disarmed_timer() -> Plan:
    """A timer no longer needed: the signal came first, or the parked row left otherwise."""
    return Plan(ExecutionState.CANCELED, Outcome.CANCELED)


def for_timed_out_wait(on_timeout: str) -> Plan:
    """The parked execution when its wait times out: its body never ran.

    ``on_timeout`` is ``skip``, ``cancel``, ``pause`` or the name of the step to go to.
    """
    why = "timed_out"
    if on_timeout == "cancel":
        return Plan(ExecutionState.CANCELED, Outcome.TIMED_OUT, WorkflowState.CANCELED, why=why)
    if on_timeout == "pause":  # resume() waits for the signal again
        return Plan(ExecutionState.CANCELED, Outcome.TIMED_OUT, WorkflowState.PAUSED, why=why)
    if on_timeout == "skip":
        return Plan(
            ExecutionState.SKIPPED, Outcome.TIMED_OUT, WorkflowState.READY, Next.FOLLOWING, why=why
        )
    return Plan(
        ExecutionState.SKIPPED,
        Outcome.TIMED_OUT,
        WorkflowState.READY,
        Next.GOTO,
        goto=on_timeout,
        why=why,
    )


# -- operators and housekeeping --------------------------------------------------------------


def for_operator_cancel() -> Plan:
    return Plan(ExecutionState.CANCELED, Outcome.CANCELED, WorkflowState.CANCELED, why="operator")


def for_operator_skip() -> Plan:
    return _skip()


def for_stray() -> Plan:
    """A scheduled or waiting row left behind when a new execution is created (the sweep)."""
    return Plan(ExecutionState.CANCELED, Outcome.CANCELED)


def for_recovery(
    action: str, *, was: ExecutionState, workflow: WorkflowState, resumable: bool
) -> Plan | None:
    """An execution whose run was lost (expired lease, stuck row); None: leave it alone.

    A paused workflow stays paused (gem bug H-12): its scheduled row is kept for ``resume()``,
    and an in-progress one whose worker died is closed — as the marker a resumable step's
    ``resume()`` continues from — with nothing scheduled.
    """
    ongoing = workflow in (WorkflowState.READY, WorkflowState.PERFORMING)
    if workflow is WorkflowState.PAUSED:
        if was is ExecutionState.SCHEDULED:
            return None
        outcome = Outcome.WORKFLOW_PAUSED if resumable else Outcome.RECOVERED
        return Plan(ExecutionState.COMPLETED, outcome)
    if action == "cancel":
        return Plan(
            ExecutionState.CANCELED,
            Outcome.RECOVERED,
            WorkflowState.CANCELED if ongoing else None,
        )
    if not ongoing:  # finished or canceled meanwhile: close the row, schedule nothing
        return Plan(ExecutionState.COMPLETED, Outcome.RECOVERED)
    return Plan(
        ExecutionState.COMPLETED,
        Outcome.RECOVERED,
        WorkflowState.READY,
        Next.SUCCESSOR if resumable else Next.AGAIN,
    )

# ruff: noqa: E501 -- one row of the decision table per line reads as a table
"""The decision table of ``geneva_drive.engine.outcomes``, row by row, without a database.

Rows follow gem-spec C (the executor's transition tables) plus our deliberate deltas: operator
verbs while a step runs, signal timeouts, recovery of paused workflows.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from geneva_drive.core.states import ExecutionState as X
from geneva_drive.core.states import Outcome as O
from geneva_drive.core.states import WorkflowState as W
from geneva_drive.definition.flow import Action
from geneva_drive.engine import outcomes as o
from geneva_drive.engine.outcomes import ErrorRecord as E
from geneva_drive.engine.outcomes import Next as N
from geneva_drive.engine.outcomes import Settle as S

WAIT = timedelta(minutes=5)


def row(plan: o.Plan) -> tuple[object, ...]:
    return (plan.state, plan.outcome, plan.workflow, plan.next, plan.settle, plan.error)


TABLE = [
    # -- the body's result ---------------------------------------------------------------------
    ("completed", o.for_completion(), (X.COMPLETED, O.SUCCESS, W.READY, N.FOLLOWING, S.CONSUME, E.NONE)),
    ("stopped at a checkpoint", o.for_interruption(None), (X.COMPLETED, O.CONTINUED, W.READY, N.SUCCESSOR, S.KEEP, E.NONE)),
    ("cancel()", o.for_flow_control(Action.CANCEL, resumable=False), (X.CANCELED, O.CANCELED, W.CANCELED, N.NOTHING, S.KEEP, E.NONE)),
    ("pause()", o.for_flow_control(Action.PAUSE, resumable=False), (X.CANCELED, O.CANCELED, W.PAUSED, N.NOTHING, S.KEEP, E.NONE)),
    ("pause() in a resumable step", o.for_flow_control(Action.PAUSE, resumable=True), (X.COMPLETED, O.WORKFLOW_PAUSED, W.PAUSED, N.NOTHING, S.KEEP, E.NONE)),
    ("reattempt()", o.for_flow_control(Action.REATTEMPT, resumable=False, wait=WAIT), (X.COMPLETED, O.REATTEMPTED, W.READY, N.AGAIN, S.KEEP, E.NONE)),
    ("reattempt() in a resumable step", o.for_flow_control(Action.REATTEMPT, resumable=True), (X.COMPLETED, O.REATTEMPTED, W.READY, N.SUCCESSOR, S.KEEP, E.NONE)),
    ("skip()", o.for_flow_control(Action.SKIP, resumable=False), (X.SKIPPED, O.SKIPPED, W.READY, N.FOLLOWING, S.SKIPPED, E.NONE)),
    ("finish()", o.for_flow_control(Action.FINISH, resumable=False), (X.COMPLETED, O.SUCCESS, W.FINISHED, N.NOTHING, S.CONSUME, E.NONE)),
    ("suspend()", o.for_flow_control(Action.SUSPEND, resumable=True, wait=WAIT), (X.COMPLETED, O.CONTINUED, W.READY, N.SUCCESSOR, S.KEEP, E.NONE)),
    # -- an error, after the policies decided (body or phase 1 alike) ------------------------
    ("error: pause", o.for_error(Action.PAUSE, resumable=False, wait=None, reason="exception_policy"), (X.FAILED, O.FAILED, W.PAUSED, N.NOTHING, S.KEEP, E.COLUMNS)),
    ("error: cancel", o.for_error(Action.CANCEL, resumable=False, wait=None, reason="exception_policy"), (X.FAILED, O.CANCELED, W.CANCELED, N.NOTHING, S.KEEP, E.COLUMNS)),
    ("error: reattempt", o.for_error(Action.REATTEMPT, resumable=False, wait=WAIT, reason="precondition"), (X.COMPLETED, O.REATTEMPTED, W.READY, N.AGAIN, S.KEEP, E.METADATA)),
    ("error: reattempt, resumable", o.for_error(Action.REATTEMPT, resumable=True, wait=WAIT, reason="exception_policy"), (X.COMPLETED, O.REATTEMPTED, W.READY, N.SUCCESSOR, S.KEEP, E.METADATA)),
    ("error: skip", o.for_error(Action.SKIP, resumable=False, wait=None, reason="exception_policy"), (X.SKIPPED, O.SKIPPED, W.READY, N.FOLLOWING, S.SKIPPED, E.METADATA)),
    ("error: finish", o.for_error(Action.FINISH, resumable=False, wait=None, reason="precondition"), (X.COMPLETED, O.SUCCESS, W.FINISHED, N.NOTHING, S.CONSUME, E.METADATA)),
    # -- guards in phase 1 -------------------------------------------------------------------
    ("workflow already ended", o.for_ended_workflow(), (X.CANCELED, O.CANCELED, None, N.NOTHING, S.KEEP, E.NONE)),
    ("hero gone", o.for_missing_hero(), (X.CANCELED, O.CANCELED, W.CANCELED, N.NOTHING, S.KEEP, E.NONE)),
    ("step not defined", o.for_undefined_step(), (X.FAILED, O.FAILED, W.PAUSED, N.NOTHING, S.KEEP, E.COLUMNS)),
    ("removed_step gravestone", o.for_removed_step(), (X.SKIPPED, O.SKIPPED, W.READY, N.FOLLOWING, S.SKIPPED, E.NONE)),
    ("cancel_if true", o.for_cancel_condition(), (X.CANCELED, O.CANCELED, W.CANCELED, N.NOTHING, S.KEEP, E.NONE)),
    ("skip_if true", o.for_skip_condition(), (X.SKIPPED, O.SKIPPED, W.READY, N.FOLLOWING, S.SKIPPED, E.NONE)),
    # -- signal timeouts -----------------------------------------------------------------------
    ("timer fires", o.for_fired_timer(), (X.COMPLETED, O.TIMED_OUT, None, N.NOTHING, S.KEEP, E.NONE)),
    ("timer disarmed", o.for_disarmed_timer(), (X.CANCELED, O.CANCELED, None, N.NOTHING, S.KEEP, E.NONE)),
    ("timed out: skip", o.for_timed_out_wait("skip"), (X.SKIPPED, O.TIMED_OUT, W.READY, N.FOLLOWING, S.KEEP, E.NONE)),
    ("timed out: cancel", o.for_timed_out_wait("cancel"), (X.CANCELED, O.TIMED_OUT, W.CANCELED, N.NOTHING, S.KEEP, E.NONE)),
    ("timed out: pause", o.for_timed_out_wait("pause"), (X.CANCELED, O.TIMED_OUT, W.PAUSED, N.NOTHING, S.KEEP, E.NONE)),
    ("timed out: go to a step", o.for_timed_out_wait("escalate"), (X.SKIPPED, O.TIMED_OUT, W.READY, N.GOTO, S.KEEP, E.NONE)),
    # -- operators and housekeeping ------------------------------------------------------------
    ("operator cancel", o.for_operator_cancel(), (X.CANCELED, O.CANCELED, W.CANCELED, N.NOTHING, S.KEEP, E.NONE)),
    ("operator skip", o.for_operator_skip(), (X.SKIPPED, O.SKIPPED, W.READY, N.FOLLOWING, S.SKIPPED, E.NONE)),
    ("stray swept", o.for_stray(), (X.CANCELED, O.CANCELED, None, N.NOTHING, S.KEEP, E.NONE)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "plan", "expected"), TABLE, ids=[case for case, _, _ in TABLE])
def test_each_ending_has_one_plan(case, plan, expected):
    assert row(plan) == expected


def test_a_reattempt_carries_its_wait_and_its_reason():
    plan = o.for_error(Action.REATTEMPT, resumable=False, wait=WAIT, reason="precondition")
    assert (plan.wait, plan.reason) == (WAIT, "precondition")
    assert o.for_flow_control(Action.REATTEMPT, resumable=False).reason == "flow_control"


def test_rewind_applies_to_resumable_steps_only():
    resumable = o.for_flow_control(Action.REATTEMPT, resumable=True, rewind=True)
    plain = o.for_flow_control(Action.REATTEMPT, resumable=False, rewind=True)
    assert (resumable.rewind, plain.rewind) == (True, False)


def test_a_timeout_to_a_named_step_names_it():
    assert o.for_timed_out_wait("escalate").goto == "escalate"


RECOVERY = [
    ("reattempt", X.IN_PROGRESS, W.PERFORMING, False, (X.COMPLETED, O.RECOVERED, W.READY, N.AGAIN)),
    (
        "reattempt",
        X.IN_PROGRESS,
        W.PERFORMING,
        True,
        (X.COMPLETED, O.RECOVERED, W.READY, N.SUCCESSOR),
    ),
    ("reattempt", X.SCHEDULED, W.READY, False, (X.COMPLETED, O.RECOVERED, W.READY, N.AGAIN)),
    ("reattempt", X.IN_PROGRESS, W.CANCELED, False, (X.COMPLETED, O.RECOVERED, None, N.NOTHING)),
    (
        "cancel",
        X.IN_PROGRESS,
        W.PERFORMING,
        False,
        (X.CANCELED, O.RECOVERED, W.CANCELED, N.NOTHING),
    ),
    ("cancel", X.SCHEDULED, W.FINISHED, False, (X.CANCELED, O.RECOVERED, None, N.NOTHING)),
    ("reattempt", X.IN_PROGRESS, W.PAUSED, True, (X.COMPLETED, O.WORKFLOW_PAUSED, None, N.NOTHING)),
    ("cancel", X.IN_PROGRESS, W.PAUSED, False, (X.COMPLETED, O.RECOVERED, None, N.NOTHING)),
]


@pytest.mark.parametrize(("action", "was", "workflow", "resumable", "expected"), RECOVERY)
def test_recovery_of_a_lost_run(action, was, workflow, resumable, expected):
    plan = o.for_recovery(action, was=was, workflow=workflow, resumable=resumable)
    assert plan is not None
    assert (plan.state, plan.outcome, plan.workflow, plan.next) == expected


def test_a_paused_workflows_scheduled_row_is_left_for_resume():
    assert o.for_recovery("reattempt", was=X.SCHEDULED, workflow=W.PAUSED, resumable=False) is None


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        (o.for_completion(), (X.COMPLETED, O.SUCCESS)),
        (o.for_flow_control(Action.FINISH, resumable=False), (X.COMPLETED, O.SUCCESS)),
        (o.for_flow_control(Action.SKIP, resumable=False), (X.SKIPPED, O.SKIPPED)),
        (o.for_error(Action.PAUSE, resumable=False, wait=None, reason=""), (X.FAILED, O.CANCELED)),
        (o.for_interruption(None), (X.CANCELED, O.CANCELED)),
        (o.for_flow_control(Action.REATTEMPT, resumable=False), (X.CANCELED, O.CANCELED)),
        (o.for_flow_control(Action.PAUSE, resumable=True), (X.CANCELED, O.CANCELED)),
    ],
)
def test_a_result_on_a_workflow_canceled_meanwhile_is_recorded_and_nothing_follows(plan, expected):
    kept = o.while_canceled(plan)
    assert (kept.state, kept.outcome) == expected
    assert (kept.workflow, kept.next, kept.settle) == (None, N.NOTHING, S.KEEP)


def test_a_pause_made_while_the_step_ran_holds_over_its_result():
    kept = o.while_paused(o.for_completion(), interrupted=False)
    assert (kept.state, kept.workflow, kept.next) == (X.COMPLETED, None, N.FOLLOWING)
    failed = o.while_paused(
        o.for_error(Action.PAUSE, resumable=False, wait=None, reason=""), interrupted=False
    )
    assert failed.workflow is W.PAUSED
    finished = o.while_paused(o.for_flow_control(Action.FINISH, resumable=False), interrupted=False)
    assert finished.workflow is W.FINISHED
    marker = o.while_paused(o.for_interruption(None), interrupted=True)
    assert (marker.state, marker.outcome, marker.next) == (
        X.COMPLETED,
        O.WORKFLOW_PAUSED,
        N.NOTHING,
    )


def test_ended_columns_stamp_the_state_and_release_the_lease():
    now = datetime(2030, 1, 1, tzinfo=UTC)
    assert o.ended_columns(o.for_undefined_step(), now) == {
        "state": X.FAILED,
        "outcome": O.FAILED,
        "failed_at": now,
        "finished_at": now,
        "lease_owner": None,
        "lease_expires_at": None,
    }


AT = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
MOVES = [
    (
        "a new workflow is ready at its first step",
        (None, W.READY, {"next_step": "a"}),
        {"state": W.READY, "next_step_name": "a"},
    ),
    (
        "a step starts",
        (W.READY, W.PERFORMING, {"current_step": "a"}),
        {"state": W.PERFORMING, "current_step_name": "a"},
    ),
    (
        "a step completes and the next is scheduled",
        (W.PERFORMING, W.READY, {"current_step": None, "next_step": "b"}),
        {"state": W.READY, "current_step_name": None, "next_step_name": "b"},
    ),
    (
        "pausing stamps the move",
        (W.READY, W.PAUSED, {}),
        {"state": W.PAUSED, "transitioned_at": AT},
    ),
    (
        "resuming clears the stamp",
        (W.PAUSED, W.READY, {}),
        {"state": W.READY, "transitioned_at": None},
    ),
    (
        "canceling stamps the move",
        (W.PERFORMING, W.CANCELED, {}),
        {"state": W.CANCELED, "transitioned_at": AT},
    ),
    (
        "finishing stamps it and leaves no step",
        (W.PERFORMING, W.FINISHED, {"next_step": "b"}),
        {
            "state": W.FINISHED,
            "transitioned_at": AT,
            "current_step_name": None,
            "next_step_name": None,
        },
    ),
    ("staying paused writes no stamp", (W.PAUSED, W.PAUSED, {}), {"state": W.PAUSED}),
]


@pytest.mark.parametrize(("case", "move", "columns"), MOVES, ids=[m[0] for m in MOVES])
def test_a_workflow_move_writes_these_columns(case, move, columns):
    was, state, steps = move
    assert o.moved_columns(was, state, AT, **steps) == columns

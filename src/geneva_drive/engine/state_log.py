"""The operator's log of state changes: paused, canceled, reattempt cap reached, timed out.

Each is logged once, by the writer applying the plan that makes it (or by the operator verb),
with the workflow and step as context and, as fields, ``transition`` (the workflow's state
after it) and ``reason`` (the plan's ``why``). A lease recovery is logged where it is decided
(``recovery.recover_execution``). Failures an operator must act on are warnings; moves someone
asked for (the step itself, an operator, a condition) are information.

Each is told when its transaction commits (``engine.committed``): a pause rolled back was
never a pause. The message is built when the change is made, from the rows as they are then.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from geneva_drive.core import events, text
from geneva_drive.core.states import WorkflowState
from geneva_drive.engine.committed import after_commit

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from geneva_drive.definition.workflow import Workflow
    from geneva_drive.engine.outcomes import Plan
    from geneva_drive.storage.models import StepExecution

_STOPPED = (WorkflowState.PAUSED, WorkflowState.CANCELED)
_ALWAYS_TOLD = ("timed_out", "reattempt_cap")  # told even when the workflow goes on
_WARNINGS = ("policy", "reattempt_cap", "missing_code")


def planned(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    plan: Plan,
    was: str,
    error: BaseException | None,
) -> None:
    """Log what ``plan`` did to ``workflow`` (in state ``was`` before), if an operator cares."""
    why = plan.why
    if why is None:
        return
    now = WorkflowState(workflow.state)
    if not ((now in _STOPPED and now != was) or why in _ALWAYS_TOLD):
        return
    level = logging.WARNING if why in _WARNINGS else logging.INFO
    _tell(
        session,
        events.execution_logger(workflow, execution),
        level,
        _message(why, now, execution, plan, error),
        {"transition": str(now), "reason": why},
    )


def by_operator(session: Session, workflow: Workflow, state: WorkflowState) -> None:
    """An operator verb paused or canceled ``workflow`` (without a plan: nothing to end)."""
    fields = {"transition": str(state), "reason": "operator"}
    message = f"workflow {state} by an operator"
    _tell(session, events.workflow_logger(workflow), logging.INFO, message, fields)


def _tell(session: Session, logger: Any, level: int, message: str, fields: dict[str, str]) -> None:
    after_commit(session, lambda: logger.log(level, "%s", message, fields=fields))


def _message(
    why: str,
    now: WorkflowState,
    execution: StepExecution,
    plan: Plan,
    error: BaseException | None,
) -> str:
    result = f"workflow {now}" if now in _STOPPED else _went_on(plan)
    cause = f"{type(error).__name__}: {text.message_of(error)}" if error is not None else ""
    if why == "policy":
        return f"{result} by its exception policy after {cause}"
    if why == "reattempt_cap":
        return f"reattempt cap reached after {cause}; {result} (its terminal action)"
    if why == "missing_code":
        return (
            f"{result}: step {execution.step_name!r} is not defined in the deployed code; "
            "deploy it and resume(), or resume_at() another step"
        )
    if why == "timed_out":
        waited = (execution.read_metadata("timed_out") or {}).get("after_seconds")
        after = f" after {waited:g} s" if waited is not None else ""
        return f"wait for signal {execution.awaiting_signal!r} timed out{after}; {result}"
    if why == "flow_control":
        return f"{result} by the step itself"
    if why == "cancel_condition":
        return f"{result}: its cancel_if condition held"
    return f"{result} by an {why}" if why == "operator" else f"{result} ({why})"


def _went_on(plan: Plan) -> str:
    if plan.goto is not None:
        return f"going to step {plan.goto!r}"
    return "the step is skipped" if plan.state == "skipped" else f"the workflow is {plan.workflow}"

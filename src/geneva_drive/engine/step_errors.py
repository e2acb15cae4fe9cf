"""A step's errors: what of the application's code counts as one, and the plan it becomes.

Phase 1 (a precondition, a matcher) and phase 3 (the body) both hand an error to
:func:`error_plan`, the one path by which the exception policies decide what follows it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from geneva_drive.core import events
from geneva_drive.core.settings import Settings
from geneva_drive.definition.policy import Decision, resolve
from geneva_drive.engine import outcomes
from geneva_drive.storage import queries

if TYPE_CHECKING:
    from geneva_drive.definition.steps import StepDefinition
    from geneva_drive.definition.workflow import Workflow
    from geneva_drive.storage.models import StepExecution


# What the application's code (a step body, its hooks, a precondition, a matcher) may raise
# that becomes the step's failure, recorded and resolved by the exception policies. With
# KeyboardInterrupt and SystemExit: raised *by step code* (``sys.exit()`` in a library, a
# re-raised interrupt) they are that step's error, not a request to stop the process — left to
# propagate, they killed the worker thread with the row in progress, and the next worker to
# recover it died the same way. A real SIGINT/SIGTERM reaches the database worker through its
# signal handlers, never as an exception in a step thread. Flow-control signals are caught
# before these (their own BaseException subclasses); GeneratorExit is the interpreter's.
STEP_ERRORS = (Exception, KeyboardInterrupt, SystemExit)


def error_plan(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition | None,
    error: BaseException,
    config: Settings,
    reason: str,
) -> outcomes.Plan:
    """The exception policies' decision on ``error``, as a plan; the one path for every error."""
    decision = _decide(session, workflow, execution, step_def, error, config)
    resumable = step_def is not None and step_def.resumable
    at_cap = decision.terminal and decision.problem is None  # (a misconfigured policy's too)
    return outcomes.for_error(
        decision.action, resumable=resumable, wait=decision.wait, reason=reason, at_cap=at_cap
    )


def _decide(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition | None,
    error: BaseException,
    config: Settings,
) -> Decision:
    count = queries.consecutive_reattempt_count(session, workflow.id, execution.step_name)
    decision = resolve(
        error,
        step_policy=step_def.exception_policy if step_def is not None else None,
        class_policies=type(workflow)._exception_policies,
        reattempt_count=count,
        workflow=workflow,
    )
    if decision.should_report:
        context = {
            **events.workflow_context(workflow),
            "execution_id": execution.id,  # as in every log record about a step
            "step_execution_id": execution.id,  # the name reporters were first given
            "step_name": execution.step_name,
            "action": str(decision.action),
            "terminal": decision.terminal,
        }
        try:
            config.error_reporter(error, {k: v for k, v in context.items() if v is not None})
        except Exception:
            config.logger.exception("the error reporter itself failed")
    return decision

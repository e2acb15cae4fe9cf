"""Compensation (sagas): what a canceled workflow undoes before it ends ``canceled``.

A step declared ``@step(compensate="release_stock")`` owes ``release_stock`` once it has
succeeded. Canceling the workflow — by a verb, a policy, ``cancel_if``, a signal timeout, the
step itself — then runs the owed compensations one by one, most recently completed step first,
each as an execution of its own (attempts, exception policies, timeline row), and the workflow
ends ``canceled`` after the last. Each runs at most once.

**The state while compensating.** No new workflow state: the workflow stays ``ready`` /
``performing`` (``paused`` after a failed compensation, as after any failed step) with its
next step the compensation, and the metadata ``compensation`` records which step is being
compensated and which are done. So every path that runs, reattempts, pauses, resumes,
retries or recovers a step — and the state machine's checks — apply to compensations
unchanged, and the unique "one ongoing workflow per hero" still holds the hero until the
last compensation ended. What differs is decided here, and applied by ``writer``:

- a compensation that succeeds, is skipped or finishes marks its step compensated, and the
  next one is scheduled (or the workflow ends ``canceled``);
- a compensation that cancels (``self.cancel()``, an exception policy ``cancel``) ends the
  workflow ``canceled`` at once: the remaining compensations are abandoned, on purpose;
- a cancel verb on a compensating workflow changes nothing (it is being canceled);
- ``cancel_if`` and the hero guard are not asked before a compensation (they would cancel
  the workflow again, and a compensation may need to run without its hero).

A cancel verb on a *performing* workflow of a class with compensations cannot start them at
once — the running step's worker owns its row, and its result may add a compensation. It is
recorded as pending (the workflow shows ``paused``, so that the running step's phase 3 takes
the careful path); phase 3 keeps the step's result and starts the compensations.
``resume()`` meanwhile withdraws the pending cancel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from geneva_drive.storage import queries

if TYPE_CHECKING:
    from geneva_drive.definition.steps import StepDefinition
    from geneva_drive.definition.workflow import Workflow
    from geneva_drive.storage.models import StepExecution

STATE = "compensation"  # workflow metadata: {"step": being compensated | None, "done": [...]}
PENDING = "cancel_pending"  # workflow metadata: a cancel waits for the running step to end
COMPENSATES = "compensates"  # execution metadata of a compensation: the step it undoes


def has_compensations(workflow: Workflow) -> bool:
    return bool(type(workflow).steps.compensated)


def is_compensation(workflow: Workflow, step_name: str | None) -> bool:
    return type(workflow).steps.compensation(step_name) is not None


def _state(workflow: Workflow) -> dict[str, Any]:
    stored = workflow.read_metadata(STATE)
    return dict(stored) if isinstance(stored, dict) else {"step": None, "done": []}


def compensating(workflow: Workflow) -> bool:
    """Whether the workflow is being canceled: running (or paused at) its compensations."""
    return _state(workflow).get("step") is not None


def cancel_pending(workflow: Workflow) -> bool:
    return bool(workflow.read_metadata(PENDING))


def set_pending(workflow: Workflow, pending: bool) -> None:
    workflow.write_metadata(PENDING, True if pending else None)


def next_owed(session: Session, workflow: Workflow) -> tuple[str, StepDefinition] | None:
    """(step, its compensation) to run next, or None when nothing more is owed."""
    steps = type(workflow).steps
    compensated = steps.compensated
    if not compensated:
        return None
    done = set(_state(workflow).get("done") or ())
    session.flush()  # the execution just ended counts
    for step in queries.succeeded_newest_first(session, workflow.id, compensated):
        if step not in done:
            definition = steps.compensation(compensated[step])
            if definition is not None:
                return step, definition
    return None


def begin(workflow: Workflow, step: str) -> None:
    """Record that ``step`` is being compensated (the workflow is compensating)."""
    state = _state(workflow)
    workflow.write_metadata(STATE, {"step": step, "done": list(state.get("done") or ())})


def mark_done(workflow: Workflow) -> None:
    """The compensation of the step being compensated ended: that step is compensated."""
    state = _state(workflow)
    done = list(state.get("done") or ())
    if state.get("step") is not None and state["step"] not in done:
        done.append(state["step"])
    workflow.write_metadata(STATE, {"step": None, "done": done})


def label(execution: StepExecution, step: str) -> None:
    """Say on a compensation's execution which step it undoes (shown in the timeline)."""
    execution.write_metadata(COMPENSATES, step)


def abandon(workflow: Workflow) -> None:
    """A compensation canceled the workflow: the remaining ones will not run."""
    state = _state(workflow)
    abandoned = state.get("step")
    workflow.write_metadata(
        STATE, {"step": None, "done": list(state.get("done") or ()), "abandoned_at": abandoned}
    )

"""The deploy check's reads: in-flight rows grouped by what a deploy can break.

A deploy breaks a row by removing what the row names: its workflow class (``type``), its hero's
class (``hero_type``) or the step it stands at. So the check needs one line per distinct
(class, hero class, step, state), with a count and an example id — never the rows themselves.

Each query reads in-flight rows only, through the partial indexes on the execution states
(``scheduled``, ``waiting``, ``in_progress``; one query per state, so that each one's
``state = '…'`` matches its index) and the workflows' ``(state, transitioned_at)`` index for
paused workflows. Its cost grows with the work in flight, not with the history kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session

from geneva_drive.core.states import ACTIVE_EXECUTION_STATES, ExecutionState, WorkflowState
from geneva_drive.storage.models import StepExecution
from geneva_drive.storage.queries._sql import in_state, workflow_model

# The order they are read and reported in: what runs soonest first.
ACTIVE_STATES = (ExecutionState.IN_PROGRESS, ExecutionState.SCHEDULED, ExecutionState.WAITING)
PAUSED = WorkflowState.PAUSED.value  # the ``state`` of a group of paused workflows


@dataclass(frozen=True)
class InFlightGroup:
    """In-flight rows that name the same class, hero class and step, in the same state.

    ``state`` is the execution's state, or ``"paused"`` for paused workflows that keep no
    active execution (paused after a failure: ``resume`` starts their ``step`` afresh).
    ``step`` is None only for such a workflow that stands at no step.
    """

    workflow_type: str
    hero_type: str | None
    step: str | None
    state: str
    count: int
    first_id: int  # the smallest workflow id in the group: one to `show` or `resume-at`


def in_flight_groups(session: Session) -> list[InFlightGroup]:
    """Every in-flight row, grouped: active executions by state, then paused workflows."""
    groups = [group for state in ACTIVE_STATES for group in _active(session, state)]
    return groups + _paused_without_active(session)


def _active(session: Session, state: ExecutionState) -> list[InFlightGroup]:
    wf = workflow_model()
    stmt = (
        select(wf.type, wf.hero_type, StepExecution.step_name, func.count(), func.min(wf.id))
        .select_from(StepExecution)
        .join(wf, wf.id == StepExecution.workflow_id)
        .where(in_state(StepExecution.state, state))
        .group_by(wf.type, wf.hero_type, StepExecution.step_name)
        .order_by(wf.type, wf.hero_type, StepExecution.step_name)
    )
    return [
        InFlightGroup(type_, hero_type, step, state.value, int(count), int(first))
        for type_, hero_type, step, count, first in session.execute(stmt)
    ]


def _paused_without_active(session: Session) -> list[InFlightGroup]:
    """Paused workflows with no scheduled, waiting or running execution.

    A paused workflow that keeps its next execution (paused while ready or waiting) is
    already counted with that execution; the NOT EXISTS is one probe of the executions'
    ``(workflow_id, state)`` index per paused workflow.
    """
    wf = workflow_model()
    active = exists().where(
        StepExecution.workflow_id == wf.id,
        in_state(StepExecution.state, *sorted(ACTIVE_EXECUTION_STATES)),
    )
    stmt = (
        select(wf.type, wf.hero_type, wf.next_step_name, func.count(), func.min(wf.id))
        .where(wf.state == WorkflowState.PAUSED, ~active)
        .group_by(wf.type, wf.hero_type, wf.next_step_name)
        .order_by(wf.type, wf.hero_type, wf.next_step_name)
    )
    return [
        InFlightGroup(type_, hero_type, step, PAUSED, int(count), int(first))
        for type_, hero_type, step, count, first in session.execute(stmt)
    ]

"""Step results: what a step's body returned, kept on its successful execution.

A result is written once, with the execution's completion, and never changed: a step that
runs again (a reattempt, a rewind, ``resume_at``) gets a new execution row and its own result.
"The result of a step" is therefore the result of its *latest* successful execution, by
``(created_at, id)`` — the order of every other "latest" among a workflow's executions.
These read the stored JSON; callers decode it (``serialization.decode``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from geneva_drive.core.states import ExecutionState, Outcome
from geneva_drive.storage.models import StepExecution

_E = StepExecution


def _succeeded() -> tuple[Any, ...]:
    # A reattempt, a checkpoint and a timer also end "completed": only a success has a result.
    return _E.state == ExecutionState.COMPLETED, _E.outcome == Outcome.SUCCESS


def step_result(session: Session, workflow_id: int, step: str) -> tuple[bool, Any]:
    """(whether ``step`` has a successful execution, the stored result of its latest one)."""
    stmt = (
        select(_E.result_json)
        .where(_E.workflow_id == workflow_id, _E.step_name == step, *_succeeded())
        .order_by(_E.created_at.desc(), _E.id.desc())
        .limit(1)
    )
    row = session.execute(stmt).first()
    return (False, None) if row is None else (True, row[0])


def succeeded_steps(session: Session, workflow_id: int) -> list[str]:
    """The names of the workflow's steps that have a successful execution, in the order they
    first succeeded."""
    stmt = (
        select(_E.step_name, func.min(_E.id))
        .where(_E.workflow_id == workflow_id, *_succeeded())
        .group_by(_E.step_name)
        .order_by(func.min(_E.id))
    )
    return [name for name, _ in session.execute(stmt)]


def last_step_result(session: Session, workflow_id: int) -> Any:
    """The stored result of the workflow's last successful step (None: none has succeeded,
    or the last one returned nothing) — a child workflow's answer to its parent."""
    return last_step_results(session, [workflow_id]).get(workflow_id)


def last_step_results(session: Session, workflow_ids: Iterable[int]) -> dict[int, Any]:
    """:func:`last_step_result` of each workflow, by id, in one statement per 1,000 ids.

    The latest success of each is its highest execution id (ids grow with creation, and a
    workflow runs one step at a time): one grouped lookup on the ``(workflow_id, state)``
    index, then the rows by primary key — never a scan of every execution.
    """
    ids = list(dict.fromkeys(workflow_ids))
    found: dict[int, Any] = {}
    for start in range(0, len(ids), 1000):
        chunk = ids[start : start + 1000]
        latest = (
            select(func.max(_E.id))
            .where(_E.workflow_id.in_(chunk), *_succeeded())
            .group_by(_E.workflow_id)
        )
        stmt = select(_E.workflow_id, _E.result_json).where(_E.id.in_(latest.scalar_subquery()))
        found.update({int(w): value for w, value in session.execute(stmt)})
    return found


def succeeded_newest_first(session: Session, workflow_id: int, steps: Iterable[str]) -> list[str]:
    """Those of ``steps`` that have a successful execution, the most recently completed first
    (by each one's latest success): the order their compensations run in."""
    names = list(steps)
    if not names:
        return []
    stmt = (
        select(_E.step_name, func.max(_E.id))
        .where(_E.workflow_id == workflow_id, _E.step_name.in_(names), *_succeeded())
        .group_by(_E.step_name)
        .order_by(func.max(_E.id).desc())
    )
    return [name for name, _ in session.execute(stmt)]

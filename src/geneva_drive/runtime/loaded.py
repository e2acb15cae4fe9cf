"""Which workflow and hero classes this process has loaded, and what a worker leaves alone.

A worker runs a step with the code it has imported. A row of a workflow class it has not
imported loads as the base ``Workflow`` (whose steps are "not defined": the workflow would be
paused), and a hero of an unloaded model cannot be read (the workflow would be paused, or
canceled when it has no hero). Neither is the row's fault, so a worker claims only the rows it
can run (``queries.claims.ClaimScope``) and says, once per class, what it leaves for workers
that have the code.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Sequence

from sqlalchemy.orm import Session

from geneva_drive.core.errors import GenevaDriveError
from geneva_drive.definition.fairness import is_fair
from geneva_drive.definition.workflow import Workflow
from geneva_drive.storage.heroes import loaded_hero_types
from geneva_drive.storage.queries.claims import ClaimScope, unclaimable_counts


class NoWorkflowsLoaded(GenevaDriveError):
    """A worker was started in a process that defines no workflow class."""


def loaded_workflow_types() -> list[str]:
    """The ``workflow_type`` of every ``Workflow`` subclass defined in this process."""
    base = Workflow.__mapper__
    return sorted(
        str(identity)
        for identity, mapper in list(base.polymorphic_map.items())
        if mapper is not base
    )


def claim_scope(queues: Sequence[str] | None) -> ClaimScope:
    """What a worker on ``queues`` may claim with the classes loaded right now."""
    return ClaimScope(
        queues=tuple(queues or ()),
        workflow_types=tuple(loaded_workflow_types()),
        hero_types=tuple(loaded_hero_types()),
        loaded_only=True,
        fair=any(is_fair(m.class_) for m in list(Workflow.__mapper__.self_and_descendants)),
    )


def require_workflows(scope: ClaimScope) -> None:
    if not scope.workflow_types:
        raise NoWorkflowsLoaded(
            "no workflows loaded; pass --app <module that defines your Workflow classes> "
            "(from Python: import those modules before Worker.run())"
        )


class UnloadedClassReport:
    """Logs, once per class for the life of a worker, the rows it leaves for other workers."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._told: set[tuple[str, str | None]] = set()

    def survey(self, session: Session, scope: ClaimScope) -> int:
        """Warn about classes not yet reported; returns how many scheduled rows it leaves."""
        left = 0
        for workflow_type, hero_type, count in unclaimable_counts(session, scope):
            left += count
            unknown_type = workflow_type not in scope.workflow_types
            key = (workflow_type, None if unknown_type else hero_type)
            if key in self._told:
                continue
            self._told.add(key)
            if unknown_type:
                self._log.warning(unknown_type_message(workflow_type, count, scope))
            else:
                self._log.warning(unknown_hero_message(workflow_type, hero_type, count))
        return left


def unknown_type_message(workflow_type: str, count: int, scope: ClaimScope) -> str:
    message = (
        f"leaving {count} scheduled step(s) of workflow_type {workflow_type!r} alone: no "
        "Workflow class with that workflow_type is loaded in this worker "
        f"(loaded: {', '.join(scope.workflow_types)}). Pass --app <module that defines it>; "
        f"if the class was renamed, set workflow_type = {workflow_type!r} on it so that its "
        "rows keep their type"
    )
    close = difflib.get_close_matches(workflow_type, scope.workflow_types, n=1)
    if close:
        message += f" (renamed to {close[0]}?)"
    return message


def unknown_hero_message(workflow_type: str, hero_type: str | None, count: int) -> str:
    return (
        f"leaving {count} scheduled step(s) of workflow_type {workflow_type!r} alone: their "
        f"hero_type {hero_type!r} names no mapped class loaded in this worker. Pass --app "
        f"<module that defines {hero_type}> as well (or import it from the workflow's module)"
    )

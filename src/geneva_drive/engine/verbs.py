"""The engine's implementation of ``Workflow``'s verbs (the port ``definition.ports.Verbs``).

``geneva_drive/__init__.py`` installs one :class:`EngineVerbs`; ``Workflow.create()``,
``signal()``, ``pause()`` … reach the engine through it, never by importing it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session, object_session

from geneva_drive.core.errors import AdminInputError
from geneva_drive.core.states import ONGOING_WORKFLOW_STATES
from geneva_drive.definition.ports import StartResult
from geneva_drive.engine import children, operations, signals, starting
from geneva_drive.storage.queries import admin as q

if TYPE_CHECKING:
    from geneva_drive.definition.workflow import Workflow
    from geneva_drive.storage.models import Signal, StepExecution

W = TypeVar("W", bound="Workflow")


class EngineVerbs:
    def create(
        self,
        cls: type[W],
        session: Session,
        *,
        hero: Any,
        allow_multiple: bool,
        step_job_options: dict[str, Any] | None,
        input: Any = None,
    ) -> W:
        return starting.create(
            cls,
            session,
            hero=hero,
            allow_multiple=allow_multiple,
            step_job_options=step_job_options,
            input=input,
        )

    def create_many(
        self,
        cls: type[Workflow],
        session: Session,
        *,
        heroes: Iterable[Any] | None,
        count: int | None,
        allow_multiple: bool,
        step_job_options: dict[str, Any] | None,
        raise_on_conflict: bool,
        inputs: Sequence[Any] | None = None,
    ) -> StartResult:
        return starting.create_many(
            cls,
            session,
            heroes=heroes,
            count=count,
            allow_multiple=allow_multiple,
            step_job_options=step_job_options,
            raise_on_conflict=raise_on_conflict,
            inputs=inputs,
        )

    def start_child(
        self,
        parent: Workflow,
        cls: type[W],
        *,
        key: str,
        hero: Any,
        allow_multiple: bool,
        input: Any = None,
    ) -> W:
        return children.start_child(
            parent, cls, key=key, hero=hero, allow_multiple=allow_multiple, input=input
        )

    def signal(
        self,
        workflow: Workflow,
        name: str,
        payload: Any,
        idempotency_key: str | None,
        *,
        allow_unknown: bool,
    ) -> Signal:
        return signals.deliver_signal(
            workflow,
            name,
            payload=payload,
            idempotency_key=idempotency_key,
            allow_unknown=allow_unknown,
        )

    def pause(self, workflow: Workflow) -> None:
        operations.pause_workflow(workflow)

    def resume(self, workflow: Workflow) -> StepExecution | None:
        return operations.resume_workflow(workflow)

    def skip(self, workflow: Workflow) -> None:
        operations.skip_workflow(workflow)

    def cancel(self, workflow: Workflow) -> None:
        operations.cancel_workflow(workflow)

    def of_hero(
        self, cls: type[Workflow], hero: Any, session: Session | None, *, ongoing_only: bool
    ) -> list[Workflow]:
        return workflows_of_hero(cls, hero, session, ongoing_only=ongoing_only)


def workflows_of_hero(
    cls: type[Workflow], hero: Any, session: Session | None, *, ongoing_only: bool
) -> list[Workflow]:
    """Workflows of ``cls`` (and its subclasses) for ``hero``; only ongoing ones if asked.

    ``session``: the hero's own session unless given.
    """
    if session is None:
        session = object_session(hero)
    if session is None:
        raise AdminInputError(
            f"{cls.__name__}.ongoing_for({hero!r}): the hero is not in a session; pass "
            "session=<your session>"
        )
    identity = sa_inspect(hero, raiseerr=False)
    key = getattr(identity, "identity", None)
    if key is None or len(key) != 1:
        raise AdminInputError(
            f"for_hero({hero!r}): expected a saved instance of a mapped class with a "
            "single-column primary key (the kind of hero create() takes)"
        )
    hero_type = starting.stored_hero_type(type(hero), f"for_hero({hero!r})")
    rows = q.hero_workflows(session, cls, hero_type, str(key[0]), ongoing_only=ongoing_only)
    return [w for w in rows if not ongoing_only or w.state in ONGOING_WORKFLOW_STATES]

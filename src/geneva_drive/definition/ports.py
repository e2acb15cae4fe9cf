"""The verbs of ``Workflow`` that act on rows, declared here and implemented by the engine.

``Workflow.create()``, ``signal()``, ``pause()`` and the other verbs keep their signatures and
call :func:`verbs`, whose implementation (``engine.verbs.EngineVerbs``) is provided by
``geneva_drive/__init__.py`` — the package every import of geneva-drive runs first. So the DSL
never imports the engine, which is built on it (River's ``WorkUnit``, "implemented by" the
layer above). It is provided as a factory, called at the first verb: importing geneva-drive
(or only its DSL) does not import the engine, so a command that uses neither stays quick.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from geneva_drive.definition.workflow import Workflow
    from geneva_drive.storage.models import Signal, StepExecution

W = TypeVar("W", bound="Workflow")


@dataclass
class StartResult:
    """What ``create_many`` did, per hero.

    ``created``: (hero, workflow id) of each workflow started, in the order given (hero None
    for hero-less ones). ``conflicts``: (hero, id of the ongoing workflow that holds it, or
    None if it is not visible yet) of each hero refused because it already has an ongoing
    workflow of this class — or because it was listed twice.
    """

    created: list[tuple[Any, int]] = field(default_factory=list)
    conflicts: list[tuple[Any, int | None]] = field(default_factory=list)

    @property
    def workflow_ids(self) -> list[int]:
        return [workflow_id for _, workflow_id in self.created]

    def __len__(self) -> int:
        return len(self.created)


class Verbs(Protocol):
    """What the engine does for ``Workflow``'s verbs, in the caller's transaction."""

    def create(
        self,
        cls: type[W],
        session: Session,
        *,
        hero: Any,
        allow_multiple: bool,
        step_job_options: dict[str, Any] | None,
        input: Any = None,
    ) -> W: ...

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
    ) -> StartResult: ...

    def signal(
        self,
        workflow: Workflow,
        name: str,
        payload: Any,
        idempotency_key: str | None,
        *,
        allow_unknown: bool,
    ) -> Signal: ...

    def start_child(
        self,
        parent: Workflow,
        cls: type[W],
        *,
        key: str,
        hero: Any,
        allow_multiple: bool,
        input: Any = None,
    ) -> W: ...

    def pause(self, workflow: Workflow) -> None: ...

    def resume(self, workflow: Workflow) -> StepExecution | None: ...

    def skip(self, workflow: Workflow) -> None: ...

    def cancel(self, workflow: Workflow) -> None: ...

    def of_hero(
        self, cls: type[Workflow], hero: Any, session: Session | None, *, ongoing_only: bool
    ) -> list[Workflow]: ...


_installed: list[Verbs] = []
_factory: list[Callable[[], Verbs]] = []


def install_verbs(implementation: Verbs) -> None:
    """Use ``implementation`` for ``Workflow``'s verbs from now on."""
    _installed[:] = [implementation]


def provide_verbs(factory: Callable[[], Verbs]) -> None:
    """Called once, by ``geneva_drive/__init__.py``: how to build the engine's implementation,
    at the first verb (building it imports the engine)."""
    _factory[:] = [factory]


def verbs() -> Verbs:
    if not _installed:
        if not _factory:  # pragma: no cover - importing any geneva_drive module provides it
            raise RuntimeError("geneva-drive's engine is not loaded; import geneva_drive first")
        # Two threads racing here each build one; the verbs hold no state, either will do.
        _installed[:] = [_factory[0]()]
    return _installed[0]

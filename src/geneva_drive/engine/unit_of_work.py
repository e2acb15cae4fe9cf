"""The step's unit of work: while a step body runs, only the library ends its transaction.

A step's writes commit together with its outcome (DESIGN 4.2 #1). A body that calls
``self.session.commit()`` breaks that silently: commit-then-raise leaves half the step's writes
committed and the step ``failed``, and a rollback or close throws away what the library wrote
for the execution. So while the body runs, :func:`guard` makes ``commit()``, ``rollback()`` and
``close()`` on the step's session raise :class:`UnitOfWorkError` before they do anything; the
step then fails like any other error (its writes roll back, the policies decide). Savepoints
(``with session.begin_nested():``) stay allowed: they end inside the unit of work.

The library's own transaction ends inside a body — a resumable step's checkpoint commits, a
lost lease rolls back — go through :func:`commit` and :func:`rollback`, which call the
``Session`` methods themselves and so pass the guard.

Cost: the guard shadows three methods with instance attributes on entry and removes them on
exit — six dict operations, no event dispatch, about a microsecond a step (0.1% of a no-op
step's worker CPU); a session outside a step is untouched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from geneva_drive.core.errors import UnitOfWorkError

if TYPE_CHECKING:
    from geneva_drive.definition.steps import StepDefinition

_GUARDED = ("commit", "rollback", "close")

EARLY_WRITES = (
    "the step's writes are committed with its outcome, so to make some writes durable "
    "earlier — before a slow external call, say — put them in a step of their own before "
    "this one (each step commits when it ends); writes that must outlive this step's "
    "failure may also go through a session of your own, Session(engine), committed "
    "independently (PostgreSQL and MariaDB; SQLite has one writer at a time, and the step "
    "holds it)"
)


class _Guard:
    """The context manager :func:`guard` returns; its bound methods stand in for the verbs."""

    __slots__ = ("execution_id", "session", "step")

    def __init__(self, session: Session, step: StepDefinition, execution_id: int | None) -> None:
        self.session = session
        self.step = step
        self.execution_id = execution_id

    def __enter__(self) -> None:
        shadowed = vars(self.session)  # instance attributes win over the Session methods
        shadowed["commit"] = self._commit
        shadowed["rollback"] = self._rollback
        shadowed["close"] = self._close

    def __exit__(self, *_exc: object) -> None:
        shadowed = vars(self.session)
        for verb in _GUARDED:
            shadowed.pop(verb, None)

    def _commit(self, *_args: Any, **_kwargs: Any) -> None:
        self._refuse("commit")

    def _rollback(self, *_args: Any, **_kwargs: Any) -> None:
        self._refuse("rollback")

    def _close(self, *_args: Any, **_kwargs: Any) -> None:
        self._refuse("close")

    def _refuse(self, verb: str) -> None:
        raise UnitOfWorkError(
            f"{self.step.label} (execution id={self.execution_id}): self.session.{verb}() is "
            "not allowed inside a step — it would end the transaction the step's outcome is "
            f"recorded in, leaving the step's work half committed (or its record lost); "
            f"{EARLY_WRITES}"
        )


def guard(session: Session, step: StepDefinition, execution_id: int | None) -> _Guard:
    """While the block runs, ``commit()``, ``rollback()`` and ``close()`` on ``session`` raise."""
    return _Guard(session, step, execution_id)


def commit(session: Session) -> None:
    """The library's own commit inside a step body (a checkpoint); passes the guard."""
    Session.commit(session)


def rollback(session: Session) -> None:
    """The library's own rollback inside a step body; passes the guard."""
    Session.rollback(session)

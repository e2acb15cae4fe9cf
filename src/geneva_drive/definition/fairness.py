"""A class's ``fairness_key``: checked when the class is defined, run once per workflow.

``fairness_key = lambda wf: wf.hero.tenant_id`` makes a worker's claims rotate among the
keys' workflows (``storage.queries.fairness``). The callable runs once, when ``create()``
starts the workflow (``engine.starting.keys_before_start``) — never in a claim — and its
value is stored on the workflow and copied onto each of its executions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from geneva_drive.core.awaiting import settle
from geneva_drive.core.errors import StepConfigurationError

if TYPE_CHECKING:
    from geneva_drive.definition.workflow import Workflow

# The column that stores a key (``models.workflows_table.c.fair_key``).
MAX_FAIR_KEY_LENGTH = 255


def check_fairness_key(cls: type[Workflow]) -> None:
    """``fairness_key`` is None or a callable of the workflow: a class definition error else."""
    value = getattr(cls, "fairness_key", None)
    if value is not None and not callable(value):
        raise StepConfigurationError(
            f"{cls.__name__}.fairness_key: expected a callable of the workflow returning its "
            f"key (fairness_key = lambda wf: wf.hero.tenant_id) or None, got {value!r:.80}"
        )


def fairness_key_of(cls: type[Workflow]) -> Callable[[Any], Any] | None:
    """The class's key callable, or None: its workflows claim in the ordinary order."""
    found: Callable[[Any], Any] | None = getattr(cls, "fairness_key", None)
    return found


def fair_key(cls: type[Workflow], workflow: Workflow, whose: str) -> str | None:
    """The stored key of ``workflow`` (not yet inserted: ``whose`` names it in errors, e.g.
    ``hero Account 'x'``).

    Runs the application's callable: an error there, or a value that is no key, is a
    ``StepConfigurationError`` naming the class and the hero, raised before anything is
    written.
    """
    key = fairness_key_of(cls)
    if key is None:
        return None
    try:
        value = settle(key(workflow))
    except Exception as error:
        raise StepConfigurationError(
            f"{cls.__name__}.fairness_key raised {type(error).__name__}: {error} (for the "
            f"{whose}); make it return a str or int for every workflow of the class, or "
            "None for one that takes no part in the rotation"
        ) from error
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, str | int)
        or value == ""
        or len(str(value)) > MAX_FAIR_KEY_LENGTH
    ):
        raise StepConfigurationError(
            f"{cls.__name__}.fairness_key returned {value!r:.80} (for the {whose}); it must "
            f"return a non-empty str of at most {MAX_FAIR_KEY_LENGTH} characters, an int, or "
            "None"
        )
    return str(value)


def is_fair(cls: type[Workflow]) -> bool:
    """Whether ``cls``'s workflows take part in the rotation of fair claims."""
    return fairness_key_of(cls) is not None

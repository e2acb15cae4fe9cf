"""Which job options a backend takes, checked where they are written (class, ``create()``,
``configure()``), with a "did you mean" for the misspelt ones."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from geneva_drive.core.errors import StepConfigurationError
from geneva_drive.core.ports import accepted_job_options
from geneva_drive.definition.steps import validate_job_options


def job_option_problem(
    backend: Any, keys: Iterable[str], *, misspelt_only: bool = False
) -> str | None:
    """Why ``backend`` cannot take job options with ``keys`` (with a "did you mean"), or None.

    ``misspelt_only``: complain only about keys close to one the backend accepts — the check
    ``configure()`` runs over every class of the process, some of which may be meant for
    another backend (a Celery app's classes in a test run on the database backend).
    """
    accepted = accepted_job_options(backend)
    if accepted is None:
        return None
    unknown = sorted(set(keys) - accepted)
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(accepted), n=1)
        if close or not misspelt_only:
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    if not hints:
        return None
    several = len(hints) > 1
    return (
        f"job option{'s' if several else ''} {', '.join(hints)} "
        f"{'are' if several else 'is'} not understood by the configured backend "
        f"{type(backend).__name__}, which accepts: {', '.join(sorted(accepted))} (a key it "
        "does not know would be ignored silently)"
    )


def checked_step_job_options(cls: type[Any], options: Any, backend: Any) -> dict[str, Any] | None:
    """``step_job_options`` as stored, or a ``StepConfigurationError`` naming the class;
    ``backend``: the one that will receive the steps (the session's settings')."""
    label = f"{cls.__name__}.step_job_options"
    validated = validate_job_options(options or None, label)
    problem = job_option_problem(backend, validated or ())
    if problem is not None:
        raise StepConfigurationError(f"{label}: {problem}")
    return validated or None

"""The one ``configure()`` call that wires geneva-drive into an application.

The wiring lives here, above the engine, because it is the only place that builds a backend
(the database worker's, by default) and checks every defined class's job options against it;
the settings it installs are plain data (``core.settings``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from geneva_drive.core.errors import StepConfigurationError
from geneva_drive.core.settings import Settings, install, settings
from geneva_drive.runtime.backends.database import DatabaseBackend
from geneva_drive.storage.db import prepare_engine

# Serialises configure() calls: each reads the current settings and installs a changed copy.
_lock = threading.Lock()


def configure(**changes: Any) -> Settings:
    """Replace settings (keyword arguments as in :class:`Settings`) and return the result.

    An SQLite engine is prepared for concurrent use (WAL, busy timeout, ``BEGIN IMMEDIATE``).
    Without a ``backend``, the database worker backend is used.
    """
    unknown = set(changes) - set(Settings.__dataclass_fields__)
    if unknown:
        raise StepConfigurationError(
            f"configure() got unknown setting(s) {', '.join(sorted(unknown))}; known settings: "
            f"{', '.join(sorted(Settings.__dataclass_fields__))}"
        )
    engine = changes.get("engine")
    if engine is not None:
        prepare_engine(engine)
    with _lock:
        candidate = replace(settings(), **changes)
        if candidate.backend is None:
            candidate = replace(candidate, backend=DatabaseBackend())
        _check_defined_classes(candidate.backend)  # before anything changes
        install(candidate)
        return candidate


def _check_defined_classes(backend: Any) -> None:
    """Refuse misspelt job options in every workflow class defined so far. A class is defined
    by subclassing ``Workflow``, so a process that never imported the DSL (a CLI command that
    only reads the tables) has none, and does not import it to find that out (issue 42)."""
    dsl = sys.modules.get("geneva_drive.definition.workflow")
    if dsl is not None:
        dsl.check_registered_job_options(backend)


@contextlib.contextmanager
def configured(**changes: Any) -> Iterator[Settings]:
    """``configure(**changes)`` for the duration of a block, then restore what was there."""
    previous = settings()
    try:
        yield configure(**changes)
    finally:
        with _lock:
            install(previous)

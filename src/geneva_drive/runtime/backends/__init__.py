"""Execution backends: how a scheduled step execution reaches a process that runs it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from geneva_drive.core import lazy
from geneva_drive.core.ports import Backend, EnqueuedStep

if TYPE_CHECKING:
    from geneva_drive.runtime.backends.database import DatabaseBackend
    from geneva_drive.runtime.backends.inline import InlineBackend

__all__ = ["Backend", "DatabaseBackend", "EnqueuedStep", "InlineBackend"]

# Imported when first named (PEP 562): the database backend, which every configure() builds,
# does not need the inline backend's executor, and a CLI command that reads rows runs no step.
_EXPORTS = {
    "DatabaseBackend": "geneva_drive.runtime.backends.database",
    "InlineBackend": "geneva_drive.runtime.backends.inline",
}


def __getattr__(name: str) -> Any:
    return lazy.load(__name__, _EXPORTS, globals(), name)

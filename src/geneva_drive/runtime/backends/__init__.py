"""Execution backends: how a scheduled step execution reaches a process that runs it."""

from geneva_drive.core.ports import Backend, EnqueuedStep
from geneva_drive.runtime.backends.database import DatabaseBackend
from geneva_drive.runtime.backends.inline import InlineBackend

__all__ = ["Backend", "DatabaseBackend", "EnqueuedStep", "InlineBackend"]

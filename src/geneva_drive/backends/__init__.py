"""Execution backends: how a scheduled step execution reaches a process that runs it."""

from .base import Backend, EnqueuedStep
from .database import DatabaseBackend
from .inline import InlineBackend

__all__ = ["Backend", "DatabaseBackend", "EnqueuedStep", "InlineBackend"]

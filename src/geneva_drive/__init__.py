"""geneva-drive: durable multi-step workflows that live in your own SQL database.

Public API — everything a user imports comes from here::

    from geneva_drive import Workflow, step, resumable_step, ExceptionPolicy, configure
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from geneva_drive.core import lazy
from geneva_drive.core.ports import provide_workflow_model
from geneva_drive.definition.ports import Verbs, provide_verbs

if TYPE_CHECKING:
    from geneva_drive.core.clock import FrozenClock, SystemClock
    from geneva_drive.core.errors import (
        AmbiguousHeroType,
        AsyncDriverMissing,
        ChildFailed,
        CursorTooLargeError,
        GenevaDriveError,
        InputTooLargeError,
        InvalidStateError,
        InvalidStateTransition,
        MetadataTooLargeError,
        ResultTooLargeError,
        SerializationError,
        SignalPayloadTooLargeError,
        StepConfigurationError,
        StepExecutionError,
        StepNotDefinedError,
        UnitOfWorkError,
        UnknownSignal,
        UnstorableTextError,
        WorkerCrashed,
        WorkflowAlreadyOngoing,
        WorkflowClassNotLoaded,
        WorkflowNotOngoing,
    )
    from geneva_drive.core.events import subscribe
    from geneva_drive.core.settings import Settings, settings, with_inline_enqueue
    from geneva_drive.core.shutdown import (
        clear_shutdown_request,
        request_shutdown,
        shutdown_requested,
    )
    from geneva_drive.core.states import ExecutionState, Outcome, WorkflowState
    from geneva_drive.definition.limits import ConcurrencyLimit, RateLimit
    from geneva_drive.definition.matchers import SignalMatcher
    from geneva_drive.definition.policy import ExceptionPolicy, exponential_backoff
    from geneva_drive.definition.schedule import Schedule
    from geneva_drive.definition.steps import (
        StepDefinition,
        removed_step,
        repeat_step,
        resumable_step,
        step,
    )
    from geneva_drive.definition.workflow import Workflow
    from geneva_drive.runtime.backends import DatabaseBackend, InlineBackend
    from geneva_drive.runtime.configure import configure
    from geneva_drive.storage.db import (
        create_async_engine,
        create_engine,
        immediate_transactions,
        prepare_engine,
    )
    from geneva_drive.storage.migrate import install
    from geneva_drive.storage.models import Signal, StepExecution


# Importing the package imports nothing heavy: each public name's module is imported when the
# name is first used (PEP 562), so ``geneva-drive --version`` loads no SQLAlchemy and a script
# that uses the DSL loads no Alembic. Every name still imports as ``from geneva_drive import X``.
_EXPORTS: dict[str, str] = {
    "AmbiguousHeroType": "geneva_drive.core.errors",
    "AsyncDriverMissing": "geneva_drive.core.errors",
    "ChildFailed": "geneva_drive.core.errors",
    "ConcurrencyLimit": "geneva_drive.definition.limits",
    "CursorTooLargeError": "geneva_drive.core.errors",
    "DatabaseBackend": "geneva_drive.runtime.backends",
    "ExceptionPolicy": "geneva_drive.definition.policy",
    "ExecutionState": "geneva_drive.core.states",
    "FrozenClock": "geneva_drive.core.clock",
    "GenevaDriveError": "geneva_drive.core.errors",
    "InlineBackend": "geneva_drive.runtime.backends",
    "InputTooLargeError": "geneva_drive.core.errors",
    "InvalidStateError": "geneva_drive.core.errors",
    "InvalidStateTransition": "geneva_drive.core.errors",
    "MetadataTooLargeError": "geneva_drive.core.errors",
    "Outcome": "geneva_drive.core.states",
    "RateLimit": "geneva_drive.definition.limits",
    "ResultTooLargeError": "geneva_drive.core.errors",
    "Schedule": "geneva_drive.definition.schedule",
    "SerializationError": "geneva_drive.core.errors",
    "Settings": "geneva_drive.core.settings",
    "Signal": "geneva_drive.storage.models",
    "SignalMatcher": "geneva_drive.definition.matchers",
    "SignalPayloadTooLargeError": "geneva_drive.core.errors",
    "StepConfigurationError": "geneva_drive.core.errors",
    "StepDefinition": "geneva_drive.definition.steps",
    "StepExecution": "geneva_drive.storage.models",
    "StepExecutionError": "geneva_drive.core.errors",
    "StepNotDefinedError": "geneva_drive.core.errors",
    "SystemClock": "geneva_drive.core.clock",
    "UnitOfWorkError": "geneva_drive.core.errors",
    "UnknownSignal": "geneva_drive.core.errors",
    "UnstorableTextError": "geneva_drive.core.errors",
    "WorkerCrashed": "geneva_drive.core.errors",
    "Workflow": "geneva_drive.definition.workflow",
    "WorkflowAlreadyOngoing": "geneva_drive.core.errors",
    "WorkflowClassNotLoaded": "geneva_drive.core.errors",
    "WorkflowNotOngoing": "geneva_drive.core.errors",
    "WorkflowState": "geneva_drive.core.states",
    "clear_shutdown_request": "geneva_drive.core.shutdown",
    "configure": "geneva_drive.runtime.configure",
    "create_async_engine": "geneva_drive.storage.db",
    "create_engine": "geneva_drive.storage.db",
    "exponential_backoff": "geneva_drive.definition.policy",
    "immediate_transactions": "geneva_drive.storage.db",
    "install": "geneva_drive.storage.migrate",
    "prepare_engine": "geneva_drive.storage.db",
    "removed_step": "geneva_drive.definition.steps",
    "repeat_step": "geneva_drive.definition.steps",
    "request_shutdown": "geneva_drive.core.shutdown",
    "resumable_step": "geneva_drive.definition.steps",
    "settings": "geneva_drive.core.settings",
    "shutdown_requested": "geneva_drive.core.shutdown",
    "step": "geneva_drive.definition.steps",
    "subscribe": "geneva_drive.core.events",
    "with_inline_enqueue": "geneva_drive.core.settings",
}


def __getattr__(name: str) -> Any:
    return lazy.load(__name__, _EXPORTS, globals(), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def _engine_verbs() -> Verbs:
    from geneva_drive.engine.verbs import EngineVerbs

    return EngineVerbs()


def _workflow_model() -> object:
    from geneva_drive.definition.workflow import Workflow

    return Workflow


# The queries find the workflows table's mapped class at run time (it is a layer above them):
# imported when the first query needs it, if nothing has imported it before.
provide_workflow_model(_workflow_model)

# Workflow's verbs (create, signal, pause, …) act through the engine, which the DSL does not
# import: every import of a geneva_drive module runs this file first, so they are provided —
# built, and the engine imported, at the first verb.
provide_verbs(_engine_verbs)

__version__ = "0.1.0"

__all__ = [
    "AmbiguousHeroType",
    "AsyncDriverMissing",
    "ChildFailed",
    "ConcurrencyLimit",
    "CursorTooLargeError",
    "DatabaseBackend",
    "ExceptionPolicy",
    "ExecutionState",
    "FrozenClock",
    "GenevaDriveError",
    "InlineBackend",
    "InputTooLargeError",
    "InvalidStateError",
    "InvalidStateTransition",
    "MetadataTooLargeError",
    "Outcome",
    "RateLimit",
    "ResultTooLargeError",
    "Schedule",
    "SerializationError",
    "Settings",
    "Signal",
    "SignalMatcher",
    "SignalPayloadTooLargeError",
    "StepConfigurationError",
    "StepDefinition",
    "StepExecution",
    "StepExecutionError",
    "StepNotDefinedError",
    "SystemClock",
    "UnitOfWorkError",
    "UnknownSignal",
    "UnstorableTextError",
    "WorkerCrashed",
    "Workflow",
    "WorkflowAlreadyOngoing",
    "WorkflowClassNotLoaded",
    "WorkflowNotOngoing",
    "WorkflowState",
    "clear_shutdown_request",
    "configure",
    "create_async_engine",
    "create_engine",
    "exponential_backoff",
    "immediate_transactions",
    "install",
    "prepare_engine",
    "removed_step",
    "repeat_step",
    "request_shutdown",
    "resumable_step",
    "settings",
    "shutdown_requested",
    "step",
    "subscribe",
    "with_inline_enqueue",
]

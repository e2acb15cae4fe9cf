"""geneva-drive: durable multi-step workflows that live in your own SQL database.

Public API — everything a user imports comes from here::

    from geneva_drive import Workflow, step, resumable_step, ExceptionPolicy, configure
"""

from geneva_drive.core.clock import FrozenClock, SystemClock
from geneva_drive.core.errors import (
    CursorTooLargeError,
    GenevaDriveError,
    InvalidStateError,
    InvalidStateTransition,
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
    WorkflowNotOngoing,
)
from geneva_drive.core.events import subscribe
from geneva_drive.core.settings import Settings, settings, with_inline_enqueue
from geneva_drive.core.shutdown import clear_shutdown_request, request_shutdown, shutdown_requested
from geneva_drive.core.states import ExecutionState, Outcome, WorkflowState
from geneva_drive.definition.matchers import SignalMatcher
from geneva_drive.definition.policy import ExceptionPolicy, exponential_backoff
from geneva_drive.definition.ports import install_verbs
from geneva_drive.definition.steps import (
    StepDefinition,
    removed_step,
    repeat_step,
    resumable_step,
    step,
)
from geneva_drive.definition.workflow import Workflow
from geneva_drive.engine.verbs import EngineVerbs
from geneva_drive.runtime.backends import DatabaseBackend, InlineBackend
from geneva_drive.runtime.configure import configure
from geneva_drive.storage.db import create_engine, immediate_transactions, prepare_engine
from geneva_drive.storage.migrate import install
from geneva_drive.storage.models import Signal, StepExecution

# Workflow's verbs (create, signal, pause, …) act through the engine, which the DSL does not
# import: every import of a geneva_drive module runs this file first, so they are installed.
install_verbs(EngineVerbs())

__version__ = "0.1.0"

__all__ = [
    "CursorTooLargeError",
    "DatabaseBackend",
    "ExceptionPolicy",
    "ExecutionState",
    "FrozenClock",
    "GenevaDriveError",
    "InlineBackend",
    "InvalidStateError",
    "InvalidStateTransition",
    "Outcome",
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
    "WorkflowNotOngoing",
    "WorkflowState",
    "clear_shutdown_request",
    "configure",
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

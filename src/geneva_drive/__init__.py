"""geneva-drive: durable multi-step workflows that live in your own SQL database.

Public API — everything a user imports comes from here::

    from geneva_drive import Workflow, step, resumable_step, ExceptionPolicy, configure
"""

from .backends import DatabaseBackend, InlineBackend
from .clock import FrozenClock, SystemClock
from .config import Settings, configure, settings, with_inline_enqueue
from .engine import create_engine, immediate_transactions, prepare_engine
from .errors import (
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
    WorkerCrashed,
    WorkflowAlreadyOngoing,
    WorkflowNotOngoing,
)
from .events import subscribe
from .migrate import install
from .models import Signal, StepExecution
from .policy import ExceptionPolicy, exponential_backoff
from .shutdown import clear_shutdown_request, request_shutdown, shutdown_requested
from .states import ExecutionState, Outcome, WorkflowState
from .steps import SignalMatcher, StepDefinition, removed_step, repeat_step, resumable_step, step
from .workflow import Workflow

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

"""Every exception geneva-drive raises on purpose.

    GenevaDriveError
    ├── StepConfigurationError     a workflow class or option is defined wrongly
    │   ├── UnknownStepOptionError an option name @step does not know (also a TypeError)
    │   ├── PolicyResolutionError  a policy that cannot be applied (an unimportable matcher)
    │   └── AmbiguousHeroType      a hero_type that names two mapped classes (a LookupError)
    ├── UnitOfWorkError            a step ended its session's transaction, or lost it
    ├── InvalidStateError          a verb was called on a workflow in the wrong state
    │   └── AdminRefused           an admin action the workflow's state does not allow
    ├── AdminInputError            an admin filter, cursor, actor or argument that cannot be used
    ├── AdminNotFound              no workflow with that id (admin API)
    ├── InvalidStateTransition     the executor refused an illegal state change (a bug guard)
    ├── WorkflowAlreadyOngoing     a second ongoing workflow of one class for one hero
    ├── WorkflowNotOngoing         a new signal for a finished or canceled workflow
    ├── UnknownSignal              a signal no step of the workflow's class waits for (a ValueError)
    ├── PayloadTooLargeError
    │   ├── SignalPayloadTooLargeError
    │   ├── CursorTooLargeError
    │   ├── InputTooLargeError     a workflow's input over max_value_size
    │   ├── ResultTooLargeError    a step's result over max_value_size
    │   └── MetadataTooLargeError  a workflow's metadata over max_value_size
    ├── SerializationError         a value the JSON codec cannot store
    │   └── UnstorableTextError    text with NUL or a lone surrogate (also a ValueError)
    ├── WorkerCrashed              a database worker's thread died; the worker stopped
    ├── AsyncDriverMissing         async steps are loaded, their database's async driver is not
    ├── ChildFailed                a child workflow a fan-in step waits for was canceled
    └── StepExecutionError         carries the execution and workflow it concerns
        └── StepNotDefinedError    a row names a step the class no longer defines
            └── WorkflowClassNotLoaded  a verb needs the steps of a class this process lacks

Flow-control signals (``self.pause()`` inside a step and friends) are *not* here: they are
``BaseException`` subclasses in ``flow.py`` so that ``except Exception`` in application code
cannot swallow them.
"""

from __future__ import annotations

from typing import Any


class GenevaDriveError(Exception):
    """Base class of every error geneva-drive raises deliberately."""


class StepConfigurationError(GenevaDriveError):
    """A workflow class, step option, policy or job option is invalid."""


class UnknownStepOptionError(StepConfigurationError, TypeError):
    """``@step`` got an option it does not know (a TypeError too, as for any bad keyword)."""


class PolicyResolutionError(StepConfigurationError):
    """An exception policy could not be applied to an error (e.g. its dotted matcher is gone)."""

    policy: Any = None  # the ExceptionPolicy concerned, once known


class AmbiguousHeroType(StepConfigurationError, LookupError):
    """Two mapped classes store the same ``hero_type`` (by default a class's bare name), so a
    stored hero could be read from the wrong table; ``__hero_type__`` on one of them fixes it."""


class UnitOfWorkError(GenevaDriveError):
    """A step body tried to end the transaction its writes belong to, or carried on after
    an error from its session had ended it."""


class WorkerCrashed(GenevaDriveError):
    """A thread of the database worker died of an unexpected error, so the worker stopped."""


class AsyncDriverMissing(GenevaDriveError):
    """A worker has async steps to run but not the async driver of its database (the extra
    that provides it is named in the message); raised when the worker starts."""


class InvalidStateError(GenevaDriveError):
    """A verb was called on a workflow whose state does not allow it."""


class InvalidStateTransition(GenevaDriveError):
    """The executor's transition table refused a change of state."""


class WorkflowAlreadyOngoing(GenevaDriveError):
    """Another ongoing workflow of the same class exists for the same hero."""


class WorkflowNotOngoing(GenevaDriveError):
    """A new signal was sent to a finished or canceled workflow."""


class UnknownSignal(GenevaDriveError, ValueError):
    """``signal(name)`` names a signal no step of the workflow's class waits for (a typo, most
    likely); nothing was written. A ValueError, like the signal path's other bad input."""


class SerializationError(GenevaDriveError):
    """A payload, cursor or metadata value cannot be encoded as typed JSON."""


class UnstorableTextError(SerializationError, ValueError):
    """A value the caller chose holds text no database of ours can store: NUL (``\\x00``)
    or a lone surrogate. Refused on every database before anything is written; see
    :mod:`geneva_drive.core.text`."""


class PayloadTooLargeError(GenevaDriveError):
    """An encoded value is larger than its configured limit."""


class SignalPayloadTooLargeError(PayloadTooLargeError):
    """A signal payload exceeds ``max_signal_payload_size``."""


class CursorTooLargeError(PayloadTooLargeError):
    """A resumable-step cursor exceeds ``max_cursor_size``."""


class ChildFailed(GenevaDriveError):
    """A child workflow ended ``canceled`` while its parent waits for it (``@step(
    wait_for_children=…)``): raised in the parent's waiting step, so the parent's exception
    policies decide. Carries the child's id, class, key and the error that ended it (if any).
    """

    def __init__(
        self,
        message: str,
        *,
        child_id: int | None = None,
        child_class: str | None = None,
        child_key: str | None = None,
        child_error: str | None = None,
    ):
        super().__init__(message)
        self.child_id = child_id
        self.child_class = child_class
        self.child_key = child_key
        self.child_error = child_error


class InputTooLargeError(PayloadTooLargeError):
    """A workflow's ``input`` exceeds ``max_value_size``; nothing was written."""


class ResultTooLargeError(PayloadTooLargeError):
    """A step returned a value whose encoding exceeds ``max_value_size`` (the step fails)."""


class MetadataTooLargeError(PayloadTooLargeError):
    """``write_metadata()`` would make a workflow's metadata exceed ``max_value_size``."""


class StepExecutionError(GenevaDriveError):
    """An error about one step execution; carries the execution and its workflow."""

    def __init__(self, message: str, *, step_execution: Any = None, workflow: Any = None):
        super().__init__(message)
        self.step_execution = step_execution
        self.workflow = workflow


class StepNotDefinedError(StepExecutionError):
    """An execution names a step that its workflow class does not define."""

    @classmethod
    def for_step(cls, workflow: Any, name: str, *, doing: str) -> StepNotDefinedError:
        """ "<Class> id=<id>: cannot <doing> step <name>, which is not defined; known steps…"."""
        known = ", ".join(type(workflow).steps.names) or "none"
        return cls(
            f"{type(workflow).__name__} id={workflow.id}: cannot {doing} step {name!r}, which "
            f"is not defined (any more); known steps: {known}",
            workflow=workflow,
        )


class AdminInputError(GenevaDriveError, ValueError):
    """An admin call got an argument it cannot use; the message says what it expected."""


class AdminNotFound(GenevaDriveError, LookupError):
    """No workflow has the given id."""


class AdminRefused(InvalidStateError):
    """An action the workflow's state does not allow; the database was left unchanged."""


class WorkflowClassNotLoaded(StepNotDefinedError):
    """A verb that moves along a workflow's steps, on a row whose class this process has not
    imported: the row loads as the base ``Workflow``, which knows no steps, so the verb cannot
    tell which step comes next (skipping would finish the workflow)."""

    @classmethod
    def for_verb(cls, workflow: Any, verb: str) -> WorkflowClassNotLoaded:
        return cls(
            f"{workflow.type} id={workflow.id}: cannot {verb}: its class {workflow.type!r} is "
            "not loaded in this process, so its steps are unknown; import the module that "
            "defines it (the CLI's and the dashboard's --app, or GENEVA_DRIVE_APP) and try again",
            workflow=workflow,
        )

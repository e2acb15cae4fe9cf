"""The curated public API: exactly these names, and every one of them importable."""

from __future__ import annotations

import importlib

import pytest

import geneva_drive

EXPECTED_PUBLIC_NAMES = [
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

EXPECTED_TESTING_NAMES = [
    "FrozenClock",
    "SimulatedCrash",
    "advance_and_run",
    "assert_cursor",
    "assert_signal_state",
    "assert_step_executed",
    "assert_step_has_successor",
    "assert_waiting_for_signal",
    "assert_workflow_state",
    "configured",
    "crash_next_step",
    "history",
    "perform_next_step",
    "perform_step_inline",
    "reload",
    "run_due",
    "run_iterations",
    "run_schedules",
    "run_until_parked",
    "speedrun",
    "speedrun_current_step",
]


def test_the_public_api_is_exactly_the_expected_names():
    # Adding or removing a public name is a decision: update this list in the same change.
    assert sorted(geneva_drive.__all__) == sorted(EXPECTED_PUBLIC_NAMES)


def test_the_public_api_lists_no_name_twice():
    assert len(set(geneva_drive.__all__)) == len(geneva_drive.__all__)


@pytest.mark.parametrize("name", EXPECTED_PUBLIC_NAMES)
def test_every_public_name_imports_from_the_package(name):
    module = importlib.import_module("geneva_drive")
    assert getattr(module, name) is not None


def test_star_import_provides_exactly_the_public_names():
    namespace: dict[str, object] = {}
    exec("from geneva_drive import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(EXPECTED_PUBLIC_NAMES)


def test_the_package_has_a_version_string():
    assert isinstance(geneva_drive.__version__, str)
    assert geneva_drive.__version__.count(".") == 2


def test_the_testing_helpers_are_exactly_the_expected_names():
    testing = importlib.import_module("geneva_drive.testing")
    assert sorted(testing.__all__) == sorted(EXPECTED_TESTING_NAMES)
    for name in EXPECTED_TESTING_NAMES:
        assert callable(getattr(testing, name)), name


def test_every_deliberate_error_derives_from_the_package_base_error():
    errors = [
        getattr(geneva_drive, name)
        for name in EXPECTED_PUBLIC_NAMES
        if name.endswith(("Error", "Transition", "Ongoing"))
    ]
    assert len(errors) == 16
    assert all(issubclass(error, geneva_drive.GenevaDriveError) for error in errors)


def test_payload_size_errors_share_a_base_class():
    from geneva_drive.core.errors import PayloadTooLargeError

    assert issubclass(geneva_drive.SignalPayloadTooLargeError, PayloadTooLargeError)
    assert issubclass(geneva_drive.CursorTooLargeError, PayloadTooLargeError)
    assert issubclass(geneva_drive.InputTooLargeError, PayloadTooLargeError)
    assert issubclass(geneva_drive.ResultTooLargeError, PayloadTooLargeError)
    assert issubclass(geneva_drive.MetadataTooLargeError, PayloadTooLargeError)


def test_step_not_defined_is_a_step_execution_error_carrying_its_context():
    error = geneva_drive.StepNotDefinedError("gone", step_execution="e", workflow="w")
    assert isinstance(error, geneva_drive.StepExecutionError)
    assert (error.step_execution, error.workflow, str(error)) == ("e", "w", "gone")


def test_flow_control_signals_are_not_exceptions_an_app_could_swallow():
    from geneva_drive.definition.flow import FlowControl

    assert issubclass(FlowControl, BaseException)
    assert not issubclass(FlowControl, Exception)

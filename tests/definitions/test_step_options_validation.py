"""Every bad step option fails when the class is defined, naming the class, the step and a fix.

The classes here are built with ``type(...)`` inside ``pytest.raises``: they never register.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta

import pytest

from geneva_drive import ExceptionPolicy, SignalMatcher, StepConfigurationError, Workflow
from geneva_drive.definition.steps import resumable_step, step


def _noop(wf):
    pass


def _walk(wf, it):
    pass


def _define(class_name, /, **options):
    """Define ``class_name`` with one step ``a`` built from ``options``; returns the class."""
    return type(class_name, (Workflow,), {"a": step(_noop, **options)})


def _define_resumable(class_name, /, **options):
    return type(class_name, (Workflow,), {"a": resumable_step(_walk, **options)})


class ValidationParent(Workflow):
    @step
    def existing(self):
        pass


# -- names ---------------------------------------------------------------------------------


def test_a_step_name_already_used_by_the_parent_is_refused():
    with pytest.raises(
        StepConfigurationError,
        match=r"ValidationDupChild\.step 'existing'.*already defined.*another name",
    ):
        type("ValidationDupChild", (ValidationParent,), {"again": step(_noop, name="existing")})


def test_an_explicit_name_clashing_with_a_method_step_in_the_same_class_is_refused():
    with pytest.raises(
        StepConfigurationError, match=r"ValidationDupSame\.step 'a'.*already defined"
    ):
        type("ValidationDupSame", (Workflow,), {"a": step(_noop), "b": step(_noop, name="a")})


def test_an_anonymous_name_clashing_with_an_explicit_step_n_is_refused():
    with pytest.raises(StepConfigurationError, match=r"step 'step_2'.*already defined"):
        type(
            "ValidationDupAnonymous",
            (Workflow,),
            {"a": step(_noop, name="step_2"), "b": step(lambda wf: None)},
        )


@pytest.mark.parametrize("bad_name", ["", "   ", 5, "x" * 256])
def test_a_step_name_must_be_a_non_blank_short_string(bad_name):
    with pytest.raises(StepConfigurationError, match=r"ValidationBadName\.step .*name= must be"):
        _define("ValidationBadName", name=bad_name)


def test_a_step_needs_a_callable():
    with pytest.raises(
        StepConfigurationError, match=r"ValidationNotCallable\.step 'step_1': needs a callable"
    ):
        not_callable = step("not callable")  # type: ignore[call-overload]
        type("ValidationNotCallable", (Workflow,), {"a": not_callable})


# -- wait= ---------------------------------------------------------------------------------


@pytest.mark.parametrize("wait", ["5 minutes", SignalMatcher("paid")])
def test_wait_refuses_a_signal_and_points_to_wait_for(wait):
    with pytest.raises(
        StepConfigurationError,
        match=r"ValidationWaitSignal\.step 'a': wait= takes a duration.*use wait_for=",
    ):
        _define("ValidationWaitSignal", wait=wait)


@pytest.mark.parametrize("wait", [-1, timedelta(seconds=-1)])
def test_wait_must_not_be_negative(wait):
    with pytest.raises(
        StepConfigurationError, match=r"ValidationWaitNegative.*'a'.*not be negative"
    ):
        _define("ValidationWaitNegative", wait=wait)


@pytest.mark.parametrize("wait", [True, object(), [5]])
def test_wait_must_be_a_timedelta_or_seconds(wait):
    with pytest.raises(
        StepConfigurationError, match=r"ValidationWaitType.*'a'.*timedelta or a number of seconds"
    ):
        _define("ValidationWaitType", wait=wait)


# -- wait_for= -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "wait_for", [5, 2.5, timedelta(hours=1), datetime(2030, 1, 1), date(2030, 1, 1)]
)
def test_wait_for_refuses_a_duration_or_time_and_points_to_wait(wait_for):
    with pytest.raises(
        StepConfigurationError,
        match=r"ValidationWaitForDuration\.step 'a': wait_for= takes a signal name.*use wait=",
    ):
        _define("ValidationWaitForDuration", wait_for=wait_for)


def test_wait_for_refuses_a_blank_signal_name():
    with pytest.raises(StepConfigurationError, match=r"ValidationWaitForBlank.*'a'.*non-blank"):
        _define("ValidationWaitForBlank", wait_for="  ")


@pytest.mark.parametrize("wait_for", [object(), True, ["paid"]])
def test_wait_for_refuses_objects_that_cannot_match_signals(wait_for):
    with pytest.raises(
        StepConfigurationError,
        match=r"ValidationWaitForType.*'a'.*SignalMatcher, or an object with matches",
    ):
        _define("ValidationWaitForType", wait_for=wait_for)


# -- skip_if= ------------------------------------------------------------------------------


@pytest.mark.parametrize("skip_if", [5, ["flag"]])
def test_skip_if_must_be_a_callable_method_name_or_bool(skip_if):
    with pytest.raises(
        StepConfigurationError, match=r"ValidationSkipIf\.step 'a': skip_if= takes a callable"
    ):
        _define("ValidationSkipIf", skip_if=skip_if)


# -- on_exception= and friends -------------------------------------------------------------


@pytest.mark.parametrize("action", ["explode", "reattempt!", "finish"])
def test_on_exception_refuses_an_unknown_action_and_lists_the_valid_ones(action):
    with pytest.raises(
        StepConfigurationError,
        match=r"ValidationOnExcName.*'a'.*'pause', 'cancel', 'reattempt', 'skip'",
    ):
        _define("ValidationOnExcName", on_exception=action)


def test_on_exception_refuses_an_unsupported_type():
    with pytest.raises(
        StepConfigurationError,
        match=r"ValidationOnExcType\.step 'a': on_exception= must be an action name, an "
        r"ExceptionPolicy, a list of them, or a handler",
    ):
        _define("ValidationOnExcType", on_exception=5)


def test_on_exception_refuses_an_exception_class_and_suggests_a_policy():
    # An exception class is callable, so it used to be taken for a handler silently.
    with pytest.raises(
        StepConfigurationError,
        match=r"ValidationOnExcClass\.step 'a': on_exception=KeyError is an exception class.*"
        r"ExceptionPolicy\('reattempt', matching=KeyError\)",
    ):
        _define("ValidationOnExcClass", on_exception=KeyError)


def test_on_exception_as_a_list_takes_only_exception_policies():
    with pytest.raises(
        StepConfigurationError, match=r"ValidationOnExcList.*'a'.*ExceptionPolicy objects only"
    ):
        _define("ValidationOnExcList", on_exception=[ExceptionPolicy("pause"), "skip"])


def test_on_exception_refuses_an_empty_list():
    with pytest.raises(StepConfigurationError, match=r"ValidationOnExcEmpty.*'a'.*as a list"):
        _define("ValidationOnExcEmpty", on_exception=[])


@pytest.mark.parametrize("option", ["max_reattempts", "terminal_action"])
def test_reattempt_options_need_on_exception_reattempt(option):
    value = 3 if option == "max_reattempts" else "cancel"
    with pytest.raises(
        StepConfigurationError,
        match=rf"ValidationNeedsReattempt\.step 'a': {option}= needs on_exception='reattempt'",
    ):
        _define("ValidationNeedsReattempt", on_exception="pause", **{option: value})


def test_max_reattempts_without_any_on_exception_is_refused():
    with pytest.raises(
        StepConfigurationError, match=r"ValidationBareCap.*'a'.*needs on_exception='reattempt'"
    ):
        _define("ValidationBareCap", max_reattempts=3)


@pytest.mark.parametrize(
    "policy", [ExceptionPolicy("reattempt"), [ExceptionPolicy("pause")], lambda wf, e: None]
)
def test_max_reattempts_beside_a_policy_object_says_to_set_it_on_the_policy(policy):
    with pytest.raises(
        StepConfigurationError,
        match=r"ValidationCapOnPolicy.*'a'.*set max_reattempts on the policy instead",
    ):
        _define("ValidationCapOnPolicy", on_exception=policy, max_reattempts=2)


@pytest.mark.parametrize("cap", [0, -1, 2.5, True, "3"])
def test_max_reattempts_must_be_a_positive_integer(cap):
    with pytest.raises(
        StepConfigurationError, match=r"ValidationCapValue.*'a'.*positive integer or None"
    ):
        _define("ValidationCapValue", on_exception="reattempt", max_reattempts=cap)


@pytest.mark.parametrize("terminal", ["reattempt", "finish", None])
def test_terminal_action_must_be_pause_cancel_or_skip(terminal):
    with pytest.raises(
        StepConfigurationError,
        match=r"ValidationTerminal.*'a'.*terminal_action= must be one of 'pause', 'cancel', 'skip'",
    ):
        _define("ValidationTerminal", on_exception="reattempt", terminal_action=terminal)


def test_an_invalid_policy_built_for_a_step_reports_the_step():
    with pytest.raises(StepConfigurationError, match=r"ValidationPolicyWrap\.step 'a'"):
        _define("ValidationPolicyWrap", on_exception="reattempt", max_reattempts=0)


# -- before_step= / after_step= -----------------------------------------------------------


@pytest.mark.parametrize("option", ["before_step", "after_step"])
def test_a_position_must_reference_an_already_defined_step(option):
    with pytest.raises(
        StepConfigurationError,
        match=rf"ValidationForward\.step 'a': {option}='later' references non-existent step.*"
        r"already been defined",
    ):
        type(
            "ValidationForward",
            (Workflow,),
            {"a": step(_noop, **{option: "later"}), "later": step(_noop)},
        )


def test_before_step_and_after_step_together_are_refused():
    with pytest.raises(
        StepConfigurationError,
        match=r"ValidationBothPositions\.step 'b': cannot take both before_step= and after_step=",
    ):
        type(
            "ValidationBothPositions",
            (Workflow,),
            {"a": step(_noop), "b": step(_noop, before_step="a", after_step="a")},
        )


# -- job_options= --------------------------------------------------------------------------


def test_job_options_must_be_a_dict():
    with pytest.raises(
        StepConfigurationError, match=r"ValidationJobType\.step 'a': job_options= must be a dict"
    ):
        _define("ValidationJobType", job_options=[("queue", "mail")])


@pytest.mark.parametrize("key", ["wait", "wait_until", "eta", "countdown"])
def test_job_options_cannot_schedule_the_step_and_point_to_wait(key):
    with pytest.raises(
        StepConfigurationError,
        match=rf"ValidationJobReserved\.step 'a': job_options cannot set {key}.*use the step's "
        "wait= instead",
    ):
        _define("ValidationJobReserved", job_options={key: 5})


@pytest.mark.parametrize("queue", ["", 5])
def test_job_options_queue_must_be_a_non_empty_string(queue):
    with pytest.raises(StepConfigurationError, match=r"ValidationJobQueue.*'a'.*queue= must be"):
        _define("ValidationJobQueue", job_options={"queue": queue})


@pytest.mark.parametrize("priority", ["high", True, 1.5])
def test_job_options_priority_must_be_an_int(priority):
    with pytest.raises(
        StepConfigurationError, match=r"ValidationJobPriority.*'a'.*priority= must be an int"
    ):
        _define("ValidationJobPriority", job_options={"priority": priority})


def test_job_options_keys_must_be_strings():
    with pytest.raises(StepConfigurationError, match=r"ValidationJobKey.*'a'.*keys must be str"):
        _define("ValidationJobKey", job_options={1: "x"})


# -- resumable-only options ----------------------------------------------------------------


@pytest.mark.parametrize(
    "option", ["max_iterations", "max_runtime", "checkpoint_every", "checkpoint_interval"]
)
def test_resumable_options_on_a_plain_step_point_to_resumable_step(option):
    with pytest.raises(
        StepConfigurationError, match=r"ValidationPlainResumable\.step 'a'.*need @resumable_step"
    ):
        _define("ValidationPlainResumable", **{option: 5})


@pytest.mark.parametrize("option", ["max_iterations", "checkpoint_every"])
@pytest.mark.parametrize("value", [0, -3, 2.5, True])
def test_counted_resumable_limits_must_be_positive_integers(option, value):
    with pytest.raises(
        StepConfigurationError,
        match=rf"ValidationIterations\.step 'a': invalid {option}=: must be a positive integer",
    ):
        _define_resumable("ValidationIterations", **{option: value})


@pytest.mark.parametrize("option", ["max_runtime", "checkpoint_interval"])
@pytest.mark.parametrize("value", [0, -1, timedelta(0), "5m", True])
def test_timed_resumable_limits_must_be_positive_durations(option, value):
    with pytest.raises(
        StepConfigurationError,
        match=rf"ValidationRuntime\.step 'a': invalid {option}=: must be a positive duration",
    ):
        _define_resumable("ValidationRuntime", **{option: value})


def test_a_resumable_step_function_must_take_the_iterator():
    with pytest.raises(
        StepConfigurationError,
        match=r"ValidationResumableArity\.step 'a': is a resumable step: .*take \(self, it\)",
    ):
        type("ValidationResumableArity", (Workflow,), {"a": resumable_step(_noop)})


def test_a_failed_definition_leaves_no_trace_so_the_name_can_be_defined_correctly():
    with pytest.raises(StepConfigurationError):
        _define("ValidationRetryName", wait=-1)
    fixed = _define("ValidationRetryName", wait=1)
    assert fixed.steps.names == ["a"]
    assert Workflow.__mapper__.polymorphic_map["ValidationRetryName"].class_ is fixed

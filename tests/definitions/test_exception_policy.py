"""The ExceptionPolicy value object: construction rules, matchers, and backoff helpers."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from geneva_drive import ExceptionPolicy, exponential_backoff
from geneva_drive.core.errors import PolicyResolutionError
from geneva_drive.definition.policy import PolicyError, PolicyList, wait_for_attempt


class PolicyAppError(Exception):
    pass


class PolicyAppSubError(PolicyAppError):
    pass


def _handler(wf, error):
    wf.skip()


# -- declarative policies ------------------------------------------------------------------


@pytest.mark.parametrize("action", ["pause", "cancel", "reattempt", "skip"])
def test_a_declarative_policy_takes_one_of_the_four_actions(action):
    policy = ExceptionPolicy(action)
    assert policy.action == action
    assert policy.declarative


@pytest.mark.parametrize("action", ["pause!", "finish", None, 5])
def test_an_unknown_action_is_refused_with_the_valid_ones_listed(action):
    with pytest.raises(PolicyError, match="action must be one of 'pause', 'cancel', 'reattempt'"):
        ExceptionPolicy(action)


def test_a_policy_error_is_a_value_error():
    assert issubclass(PolicyError, ValueError)


def test_an_exception_class_as_the_action_is_refused_and_points_to_matching():
    # Exception classes are callable: they used to be taken for a handler silently.
    with pytest.raises(
        PolicyError, match=r"ExceptionPolicy\(TimeoutError\).*matching=TimeoutError"
    ):
        ExceptionPolicy(TimeoutError)


def test_max_reattempts_defaults_to_unlimited_on_a_policy_object():
    # Unlike the step shorthand on_exception="reattempt", which defaults to 100.
    assert ExceptionPolicy("reattempt").max_reattempts is None


def test_terminal_action_defaults_to_pause():
    assert ExceptionPolicy("reattempt", max_reattempts=2).terminal_action == "pause"


@pytest.mark.parametrize("action", ["pause", "cancel", "skip"])
@pytest.mark.parametrize(
    ("option", "value"), [("wait", 5), ("max_reattempts", 3), ("terminal_action", "cancel")]
)
def test_reattempt_only_options_are_refused_for_other_actions(action, option, value):
    with pytest.raises(PolicyError, match=rf"{option}= only applies to 'reattempt'"):
        ExceptionPolicy(action, **{option: value})


@pytest.mark.parametrize("cap", [0, -1, 1.5, True, "3"])
def test_max_reattempts_must_be_a_positive_integer_or_none(cap):
    with pytest.raises(PolicyError, match="max_reattempts= must be a positive integer or None"):
        ExceptionPolicy("reattempt", max_reattempts=cap)


@pytest.mark.parametrize("terminal", ["reattempt", "finish"])
def test_terminal_action_must_be_pause_cancel_or_skip(terminal):
    with pytest.raises(PolicyError, match="terminal_action= must be one of 'pause', 'cancel'"):
        ExceptionPolicy("reattempt", terminal_action=terminal)


@pytest.mark.parametrize("wait", ["5", True, [1]])
def test_wait_must_be_a_duration_seconds_or_callable(wait):
    with pytest.raises(PolicyError, match="wait= takes a timedelta, seconds, or a callable"):
        ExceptionPolicy("reattempt", wait=wait)


@pytest.mark.parametrize("wait", [-1, timedelta(seconds=-5)])
def test_wait_must_not_be_negative(wait):
    with pytest.raises(PolicyError, match="wait= must not be negative"):
        ExceptionPolicy("reattempt", wait=wait)


@pytest.mark.parametrize("wait", [15, 2.5, timedelta(minutes=1), lambda attempt: attempt * 10])
def test_wait_accepts_seconds_a_timedelta_or_a_callable(wait):
    assert ExceptionPolicy("reattempt", wait=wait).wait is wait


@pytest.mark.parametrize("report", ["always", "never", "terminal_only"])
def test_report_accepts_the_three_modes(report):
    assert ExceptionPolicy("pause", report=report).report == report


def test_report_defaults_to_always():
    assert ExceptionPolicy("pause").report == "always"


def test_an_unknown_report_mode_is_refused():
    with pytest.raises(PolicyError, match="report= must be one of always, never, terminal_only"):
        ExceptionPolicy("pause", report="sometimes")


# -- imperative policies -------------------------------------------------------------------


def test_a_handler_makes_an_imperative_policy():
    policy = ExceptionPolicy(handler=_handler)
    assert not policy.declarative
    assert policy.handler is _handler
    assert policy.action is None


def test_a_function_given_as_the_first_argument_is_the_handler():
    policy = ExceptionPolicy(_handler, matching=KeyError)
    assert policy.handler is _handler
    assert not policy.blanket


@pytest.mark.parametrize(
    "options",
    [{"action": "pause"}, {"wait": 5}, {"max_reattempts": 3}],
)
def test_an_imperative_policy_refuses_declarative_options(options):
    with pytest.raises(PolicyError, match=r"an imperative policy .* decides for itself"):
        ExceptionPolicy(handler=_handler, **options)


def test_an_imperative_policy_refuses_a_terminal_action():
    with pytest.raises(PolicyError, match="terminal_action= has no meaning"):
        ExceptionPolicy(handler=_handler, terminal_action="cancel")


def test_a_handler_must_be_callable():
    with pytest.raises(PolicyError, match="handler= must be callable"):
        ExceptionPolicy(handler="skip")  # type: ignore[arg-type]


def test_an_imperative_policy_keeps_its_report_mode():
    assert ExceptionPolicy(handler=_handler, report="never").report == "never"


# -- matching ------------------------------------------------------------------------------


def test_a_policy_without_matchers_is_blanket_and_captures_everything():
    policy = ExceptionPolicy("pause")
    assert policy.blanket
    assert policy.captures(RuntimeError())
    assert policy.captures(KeyboardInterrupt())


def test_an_exception_class_matcher_captures_that_class_and_its_subclasses_only():
    policy = ExceptionPolicy("skip", matching=PolicyAppError)
    assert not policy.blanket
    assert policy.captures(PolicyAppError())
    assert policy.captures(PolicyAppSubError())
    assert not policy.captures(ValueError())


def test_several_matchers_capture_any_of_them():
    policy = ExceptionPolicy("skip", matching=[KeyError, TimeoutError])
    assert policy.captures(KeyError())
    assert policy.captures(TimeoutError())
    assert not policy.captures(ValueError())


def test_a_tuple_of_matchers_is_accepted_like_a_list():
    assert ExceptionPolicy("skip", matching=(KeyError, TimeoutError)).captures(TimeoutError())


def test_a_dotted_class_name_is_resolved_when_matching():
    policy = ExceptionPolicy("skip", matching="json.JSONDecodeError")
    assert policy.captures(json.JSONDecodeError("bad", "doc", 0))
    assert not policy.captures(ValueError())


def test_a_builtin_exception_name_without_a_module_is_resolved():
    policy = ExceptionPolicy("skip", matching="KeyError")
    assert policy.captures(KeyError())
    assert not policy.captures(IndexError())


def test_a_class_name_for_this_test_module_is_resolved():
    policy = ExceptionPolicy("skip", matching=f"{__name__}.PolicyAppError")
    assert policy.captures(PolicyAppSubError())


@pytest.mark.parametrize(
    "name", ["no.such.module.Error", "json.NoSuchError", "NoSuchBuiltinError", "json.dumps"]
)
def test_a_class_name_that_cannot_be_resolved_is_a_policy_resolution_error(name):
    # Before: silently matched nothing, so the error fell through to the default pause.
    with pytest.raises(PolicyResolutionError, match=rf"matching={name!r}"):
        ExceptionPolicy("skip", matching=name).captures(Exception())


@pytest.mark.parametrize("name", ["no such.Error", "mod..Error", ""])
def test_a_matching_string_that_is_no_dotted_name_is_refused_at_once(name):
    with pytest.raises(PolicyError, match="is no dotted class name"):
        ExceptionPolicy("skip", matching=name)


def test_a_predicate_matcher_decides_per_error():
    policy = ExceptionPolicy("reattempt", matching=lambda error: "timeout" in str(error))
    assert policy.captures(RuntimeError("gateway timeout"))
    assert not policy.captures(RuntimeError("card declined"))


def test_a_non_exception_class_matcher_is_refused():
    with pytest.raises(PolicyError, match="int is not an exception class"):
        ExceptionPolicy("pause", matching=int)  # type: ignore[arg-type]


def test_a_matcher_that_is_neither_class_name_nor_predicate_is_refused():
    with pytest.raises(PolicyError, match="matching= takes exception classes, dotted class names"):
        ExceptionPolicy("pause", matching=5)  # type: ignore[arg-type]


def test_a_single_policy_is_its_own_list_of_policies():
    policy = ExceptionPolicy("pause")
    assert policy.policies == [policy]


# -- policy lists --------------------------------------------------------------------------


def test_a_policy_list_picks_the_first_member_that_captures_in_list_order():
    specific = ExceptionPolicy("skip", matching=KeyError)
    blanket = ExceptionPolicy("cancel")
    assert PolicyList([specific, blanket]).pick(KeyError()) is specific
    assert PolicyList([blanket, specific]).pick(KeyError()) is blanket


def test_a_policy_list_captures_only_what_a_member_captures():
    policies = PolicyList([ExceptionPolicy("skip", matching=KeyError)])
    assert policies.captures(KeyError())
    assert not policies.captures(ValueError())
    assert policies.pick(ValueError()) is None


# -- waits and backoff ---------------------------------------------------------------------


def test_a_fixed_wait_is_the_same_for_every_attempt():
    assert wait_for_attempt(30, 0, None) == timedelta(seconds=30)
    assert wait_for_attempt(timedelta(seconds=30), 7, None) == timedelta(seconds=30)


def test_no_wait_means_no_delay():
    assert wait_for_attempt(None, 3, None) is None


def test_a_callable_wait_gets_the_attempt_number():
    assert wait_for_attempt(lambda n: n * 10, 3, None) == timedelta(seconds=30)
    assert wait_for_attempt(lambda n: timedelta(minutes=n), 2, None) == timedelta(minutes=2)


def test_a_longer_retry_after_on_the_error_wins_over_the_wait():
    error = RuntimeError("slow down")
    error.retry_after = 120  # type: ignore[attr-defined]
    assert wait_for_attempt(30, 0, error) == timedelta(seconds=120)


def test_a_retry_after_timedelta_applies_even_without_a_wait():
    error = RuntimeError("slow down")
    error.retry_after = timedelta(minutes=5)  # type: ignore[attr-defined]
    assert wait_for_attempt(None, 0, error) == timedelta(minutes=5)


def test_a_shorter_retry_after_does_not_shorten_the_wait():
    error = RuntimeError("slow down")
    error.retry_after = 1  # type: ignore[attr-defined]
    assert wait_for_attempt(30, 0, error) == timedelta(seconds=30)


def test_exponential_backoff_without_jitter_doubles_per_attempt_up_to_the_cap():
    wait = exponential_backoff(2, cap=60, jitter=0)
    assert [wait(n).total_seconds() for n in range(7)] == [2, 4, 8, 16, 32, 60, 60]


def test_exponential_backoff_uses_the_given_factor_and_timedelta_base():
    wait = exponential_backoff(timedelta(seconds=1), factor=3, jitter=0)
    assert wait(2) == timedelta(seconds=9)


def test_exponential_backoff_jitter_stays_within_its_fraction():
    wait = exponential_backoff(100, cap=timedelta(hours=1), jitter=0.1)
    samples = [wait(0).total_seconds() for _ in range(200)]
    assert all(90 <= s <= 110 for s in samples)
    assert len(set(samples)) > 1


def test_exponential_backoff_is_accepted_as_a_policy_wait():
    wait = exponential_backoff(1, jitter=0)
    policy = ExceptionPolicy("reattempt", wait=wait, max_reattempts=5)
    assert wait_for_attempt(policy.wait, 3, None) == timedelta(seconds=8)

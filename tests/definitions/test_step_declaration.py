"""Declaring steps: names, callables, and what each option turns into (no database)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from geneva_drive import (
    ExceptionPolicy,
    SignalMatcher,
    StepConfigurationError,
    StepDefinition,
    Workflow,
    removed_step,
    repeat_step,
    resumable_step,
    step,
)
from geneva_drive.definition.policy import PolicyList


def _module_level_check(wf):
    return "checked"


class DeclarationNames(Workflow):
    @step
    def named_step(self):
        return "named"

    second = step(lambda self: None)
    third = step(lambda self: None)
    aliased = step(_module_level_check)
    explicit = step(lambda self: None, name="given_name")


def _named_like_a_step(wf):
    pass


_named_like_a_step.__name__ = "check"


class DeclarationReusedFunction(Workflow):
    @step
    def check(self):
        pass

    one = step(_module_level_check)
    other = step(_module_level_check)
    later = step(_named_like_a_step)  # same __name__ as the step above, but both are kept


class DeclarationParent(Workflow):
    @step
    def first(self):
        pass

    @step
    def second(self):
        pass


class DeclarationChildAnonymous(DeclarationParent):
    extra = step(lambda self: None)


class DeclarationRepeated(Workflow):
    @step
    def start(self):
        pass

    polls = repeat_step(_module_level_check, waits=[60, timedelta(minutes=5), 3600])


class _CustomMatcher:
    def matches(self, signal):
        return True


class DeclarationOptions(Workflow):
    @step(wait=90)
    def numeric_wait(self):
        pass

    @step(wait=timedelta(hours=1))
    def delta_wait(self):
        pass

    @step(wait_for="approved")
    def named_signal(self):
        pass

    matcher = SignalMatcher("paid", lambda wf, payload: payload["ok"])

    @step(wait_for=matcher)
    def matcher_signal(self):
        pass

    @step(wait_for=_CustomMatcher())
    def custom_signal(self):
        pass

    @step(job_options={"queue": "mail", "priority": 5})
    def with_job_options(self):
        pass

    @step
    def plain(self):
        pass


class DeclarationPolicies(Workflow):
    @step(on_exception="reattempt")
    def default_cap(self):
        pass

    @step(on_exception="reattempt", max_reattempts=None)
    def unlimited(self):
        pass

    @step(on_exception="reattempt", max_reattempts=3, terminal_action="skip")
    def capped(self):
        pass

    @step(on_exception="cancel")
    def cancels(self):
        pass

    given = ExceptionPolicy("skip", matching=KeyError)

    @step(on_exception=given)
    def given_policy(self):
        pass

    @step(on_exception=[ExceptionPolicy("skip", matching=KeyError), ExceptionPolicy("cancel")])
    def listed(self):
        pass

    @step(on_exception=lambda wf, error: wf.skip())
    def handled(self):
        pass

    @step
    def no_policy(self):
        pass


class DeclarationSkipIf(Workflow):
    flag = True

    def is_flagged(self):
        return self.flag

    @step(skip_if="is_flagged")
    def by_method(self):
        pass

    @step(skip_if="flag")
    def by_attribute(self):
        pass

    @step(skip_if=lambda wf: wf.flag)
    def by_callable(self):
        pass

    @step(skip_if=True)
    def always(self):
        pass

    @step
    def never(self):
        pass


class DeclarationResumable(Workflow):
    @resumable_step(max_iterations=10, max_runtime=30)
    def walk(self, it):
        pass

    @step
    def after(self):
        pass


class DeclarationGravestone(Workflow):
    @step
    def kept(self):
        pass

    dropped = removed_step("dropped")

    @step
    def last(self):
        pass


# -- names ---------------------------------------------------------------------------------


def test_a_decorated_method_step_is_named_after_the_method():
    assert DeclarationNames.steps[0].name == "named_step"


def test_a_lambda_step_gets_a_step_n_name_counting_the_steps_before_it():
    names = DeclarationNames.steps.names
    assert names[1:3] == ["step_2", "step_3"]


def test_a_step_built_from_a_named_function_takes_the_attribute_name():
    assert DeclarationNames.steps.names[3] == "aliased"


def test_an_explicit_name_wins_over_the_attribute_name():
    assert "given_name" in DeclarationNames.steps  # type: ignore[comparison-overlap]
    assert "explicit" not in DeclarationNames.steps  # type: ignore[comparison-overlap]


def test_anonymous_step_numbering_counts_inherited_steps():
    assert DeclarationChildAnonymous.steps.names == ["first", "second", "step_3"]


def test_repeat_step_declares_one_anonymous_step_per_wait_in_order():
    steps = DeclarationRepeated.steps
    assert steps.names == ["start", "step_2", "step_3", "step_4"]
    assert [s.wait_delta for s in steps][1:] == [
        timedelta(seconds=60),
        timedelta(minutes=5),
        timedelta(hours=1),
    ]
    assert {s.callable for s in steps[1:]} == {_module_level_check}


def test_a_step_knows_the_class_it_was_defined_in():
    assert DeclarationChildAnonymous.steps.named("first").defined_in == "DeclarationParent"
    assert DeclarationChildAnonymous.steps.named("step_3").defined_in == "DeclarationChildAnonymous"


def test_a_decorated_step_is_still_callable_as_a_method():
    assert DeclarationNames().named_step() == "named"


def test_the_class_attribute_is_the_step_definition():
    assert isinstance(DeclarationNames.named_step, StepDefinition)
    assert DeclarationNames.named_step is DeclarationNames.steps.named("named_step")


def test_running_a_step_calls_its_function_with_the_workflow():
    wf = DeclarationNames()
    assert DeclarationNames.steps.named("aliased").run(wf) == "checked"


# -- waits and signals ---------------------------------------------------------------------


def test_a_numeric_wait_is_read_as_seconds():
    assert DeclarationOptions.steps.named("numeric_wait").wait_delta == timedelta(seconds=90)


def test_a_timedelta_wait_is_kept():
    assert DeclarationOptions.steps.named("delta_wait").wait_delta == timedelta(hours=1)


def test_a_step_without_wait_has_no_delay():
    assert DeclarationOptions.steps.named("plain").wait_delta is None


def test_a_signal_name_becomes_a_signal_matcher_of_that_name():
    definition = DeclarationOptions.steps.named("named_signal")
    assert isinstance(definition.signal_matcher, SignalMatcher)
    assert definition.signal_matcher.name == "approved"
    assert definition.waits_for_signal


def test_a_signal_matcher_is_used_as_given():
    definition = DeclarationOptions.steps.named("matcher_signal")
    assert definition.signal_matcher is DeclarationOptions.matcher


def test_any_object_with_a_matches_method_is_accepted_as_a_matcher():
    definition = DeclarationOptions.steps.named("custom_signal")
    assert isinstance(definition.signal_matcher, _CustomMatcher)


def test_a_step_without_wait_for_does_not_wait_for_a_signal():
    assert not DeclarationOptions.steps.named("plain").waits_for_signal


def test_a_signal_matcher_needs_a_non_blank_name():
    with pytest.raises(ValueError, match="non-blank signal name"):
        SignalMatcher(" ")


# -- job options ---------------------------------------------------------------------------


def test_step_job_options_are_stored_on_the_definition():
    definition = DeclarationOptions.steps.named("with_job_options")
    assert definition.job_options == {"queue": "mail", "priority": 5}


def test_a_step_without_job_options_has_none():
    assert DeclarationOptions.steps.named("plain").job_options is None


# -- exception policies --------------------------------------------------------------------


def _single_policy(step_name: str) -> ExceptionPolicy:
    policy = DeclarationPolicies.steps.named(step_name).exception_policy
    assert isinstance(policy, ExceptionPolicy), policy  # not a PolicyList
    return policy


def test_on_exception_reattempt_defaults_to_a_cap_of_100_then_pause():
    policy = _single_policy("default_cap")
    assert (policy.action, policy.max_reattempts, policy.terminal_action) == (
        "reattempt",
        100,
        "pause",
    )


def test_an_explicit_max_reattempts_of_none_means_unlimited():
    policy = _single_policy("unlimited")
    assert policy.action == "reattempt"
    assert policy.max_reattempts is None


def test_max_reattempts_and_terminal_action_go_into_the_step_policy():
    policy = _single_policy("capped")
    assert (policy.max_reattempts, policy.terminal_action) == (3, "skip")


def test_a_non_reattempt_action_becomes_an_uncapped_blanket_policy():
    policy = _single_policy("cancels")
    assert (policy.action, policy.max_reattempts, policy.blanket) == ("cancel", None, True)


def test_an_exception_policy_object_is_used_as_given():
    policy = DeclarationPolicies.steps.named("given_policy").exception_policy
    assert policy is DeclarationPolicies.given


def test_a_list_of_policies_becomes_a_policy_list_in_the_same_order():
    policy = DeclarationPolicies.steps.named("listed").exception_policy
    assert isinstance(policy, PolicyList)
    assert [m.action for m in policy.members] == ["skip", "cancel"]


def test_a_callable_on_exception_becomes_an_imperative_policy():
    policy = _single_policy("handled")
    assert not policy.declarative
    assert policy.blanket


def test_a_step_without_on_exception_has_no_step_policy():
    assert DeclarationPolicies.steps.named("no_policy").exception_policy is None


# -- skip_if -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["by_method", "by_attribute", "by_callable"])
def test_skip_if_follows_its_condition_on_the_workflow(name):
    wf = DeclarationSkipIf()
    definition = DeclarationSkipIf.steps.named(name)
    assert definition.should_skip(wf) is True
    wf.flag = False
    assert definition.should_skip(wf) is False


def test_skip_if_true_always_skips_and_no_condition_never_does():
    wf = DeclarationSkipIf()
    assert DeclarationSkipIf.steps.named("always").should_skip(wf) is True
    assert DeclarationSkipIf.steps.named("never").should_skip(wf) is False


# -- resumable and removed steps -----------------------------------------------------------


def test_a_resumable_step_is_marked_resumable_and_a_plain_step_is_not():
    assert DeclarationResumable.steps.named("walk").resumable
    assert not DeclarationResumable.steps.named("after").resumable


def test_a_numeric_max_runtime_is_read_as_seconds():
    definition = DeclarationResumable.steps.named("walk")
    assert definition.max_runtime == timedelta(seconds=30)
    assert definition.max_iterations == 10


def test_a_removed_step_keeps_its_name_and_position_but_is_not_runnable():
    steps = DeclarationGravestone.steps
    assert steps.names == ["kept", "dropped", "last"]
    assert steps.named("dropped").removed
    assert [s.name for s in steps.runnable()] == ["kept", "last"]


# -- mistakes caught at declaration --------------------------------------------------------


def test_an_unknown_step_option_is_refused_where_it_is_written():
    with pytest.raises(TypeError, match="bogus"):

        class DeclarationUnknownOption(Workflow):
            @step(bogus=1)
            def a(self):
                pass


def test_the_if_option_is_not_accepted_use_skip_if():
    # The gem aliases if: to skip_if: with the *same* polarity (H-3); we refuse it outright.
    with pytest.raises(TypeError, match="'if'"):
        step(lambda self: None, **{"if": True})


def test_two_steps_with_the_same_method_name_in_one_class_body_are_refused():
    with pytest.raises(
        StepConfigurationError,
        match=r"DeclarationTwice\.step 'a'.*declared twice.*rename one",
    ):

        class DeclarationTwice(Workflow):
            @step
            def a(self):
                pass

            @step(wait=5)  # type: ignore[no-redef]
            def a(self):  # noqa: F811 - the mistake under test
                pass


def test_two_resumable_steps_with_the_same_method_name_are_refused():
    with pytest.raises(StepConfigurationError, match=r"DeclarationTwiceResumable.*declared twice"):

        class DeclarationTwiceResumable(Workflow):
            @resumable_step
            def a(self, it):
                pass

            @resumable_step  # type: ignore[no-redef]
            def a(self, it):  # noqa: F811 - the mistake under test
                pass


def test_one_function_may_back_several_differently_named_steps():
    assert DeclarationReusedFunction.steps.names == ["check", "one", "other", "later"]

"""Which policy decides an error, and what it decides (``policy.resolve``; no database)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from geneva_drive import ExceptionPolicy, Workflow, step
from geneva_drive.definition.flow import Action
from geneva_drive.definition.policy import (
    DEFAULT_POLICY,
    Decision,
    PolicyList,
    policy_stack,
    resolve,
)


class ResolutionFlow(Workflow):
    @step
    def only(self):
        pass


class ResolutionParentPolicies(Workflow):
    exception_policies = [ExceptionPolicy("skip", matching=KeyError)]


class ResolutionChildPolicies(ResolutionParentPolicies):
    exception_policies = [
        ExceptionPolicy("pause", matching=LookupError),
        ExceptionPolicy("cancel", matching=KeyError),  # newest: consulted first
    ]


def _resolve(error, *, step_policy=None, class_policies=(), count=0, workflow=None):
    return resolve(
        error,
        step_policy=step_policy,
        class_policies=list(class_policies),
        reattempt_count=count,
        workflow=workflow if workflow is not None else ResolutionFlow(),
    )


# -- the default ---------------------------------------------------------------------------


def test_without_any_policy_an_error_pauses_and_is_reported():
    decision = _resolve(RuntimeError())
    assert decision.action is Action.PAUSE
    assert decision.policy is DEFAULT_POLICY
    assert decision.should_report
    assert not decision.terminal


def test_the_default_policy_ends_the_stack():
    assert policy_stack(None, []) == [DEFAULT_POLICY]


# -- order of resolution -------------------------------------------------------------------


def test_the_step_policy_wins_over_class_policies():
    step_policy = ExceptionPolicy("skip")
    decision = _resolve(
        KeyError(),
        step_policy=step_policy,
        class_policies=[ExceptionPolicy("cancel", matching=KeyError)],
    )
    assert decision.policy is step_policy
    assert decision.action is Action.SKIP


def test_a_step_policy_that_does_not_match_falls_through_to_class_policies():
    class_policy = ExceptionPolicy("cancel")
    decision = _resolve(
        ValueError(),
        step_policy=ExceptionPolicy("skip", matching=KeyError),
        class_policies=[class_policy],
    )
    assert decision.policy is class_policy


def test_a_specific_class_policy_wins_over_a_newer_blanket_one():
    specific = ExceptionPolicy("skip", matching=KeyError)
    decision = _resolve(KeyError(), class_policies=[specific, ExceptionPolicy("cancel")])
    assert decision.policy is specific


def test_among_specific_class_policies_the_newest_wins():
    older = ExceptionPolicy("skip", matching=KeyError)
    newer = ExceptionPolicy("cancel", matching=KeyError)
    assert _resolve(KeyError(), class_policies=[older, newer]).policy is newer


def test_among_blanket_class_policies_the_newest_wins():
    older = ExceptionPolicy("skip")
    newer = ExceptionPolicy("cancel")
    assert _resolve(KeyError(), class_policies=[older, newer]).policy is newer


def test_a_childs_specific_policy_wins_over_the_parents():
    decision = _resolve(KeyError(), class_policies=ResolutionChildPolicies._exception_policies)
    assert decision.action is Action.CANCEL


def test_the_parents_policy_still_applies_to_what_the_child_does_not_cover():
    decision = _resolve(KeyError(), class_policies=ResolutionParentPolicies._exception_policies)
    assert decision.action is Action.SKIP
    broader = _resolve(IndexError(), class_policies=ResolutionChildPolicies._exception_policies)
    assert broader.action is Action.PAUSE


def test_the_stack_is_step_then_specific_then_blanket_newest_first_then_default():
    step_policy = ExceptionPolicy("skip")
    s1, b1 = ExceptionPolicy("skip", matching=KeyError), ExceptionPolicy("cancel")
    s2, b2 = ExceptionPolicy("pause", matching=ValueError), ExceptionPolicy("pause")
    stack = policy_stack(step_policy, [s1, b1, s2, b2])
    assert stack == [step_policy, s2, s1, b2, b1, DEFAULT_POLICY]


def test_unmatched_errors_fall_through_everything_to_the_default_pause():
    decision = _resolve(
        ValueError(),
        step_policy=ExceptionPolicy("skip", matching=KeyError),
        class_policies=[ExceptionPolicy("cancel", matching=TimeoutError)],
    )
    assert decision.policy is DEFAULT_POLICY


# -- step-level lists ----------------------------------------------------------------------


def test_a_step_list_uses_the_first_member_that_captures():
    specific = ExceptionPolicy("skip", matching=KeyError)
    fallback = ExceptionPolicy("cancel")
    step_policy = PolicyList([specific, fallback])
    assert _resolve(KeyError(), step_policy=step_policy).policy is specific
    assert _resolve(ValueError(), step_policy=step_policy).policy is fallback


def test_a_blanket_member_listed_first_shadows_later_specific_ones():
    blanket = ExceptionPolicy("cancel")
    step_policy = PolicyList([blanket, ExceptionPolicy("skip", matching=KeyError)])
    assert _resolve(KeyError(), step_policy=step_policy).policy is blanket


def test_a_step_list_without_a_capturing_member_falls_through_to_class_policies():
    class_policy = ExceptionPolicy("cancel")
    decision = _resolve(
        ValueError(),
        step_policy=PolicyList([ExceptionPolicy("skip", matching=KeyError)]),
        class_policies=[class_policy],
    )
    assert decision.policy is class_policy


# -- reattempts, caps and terminal actions -------------------------------------------------


def test_a_reattempt_below_its_cap_reattempts_with_the_policy_wait():
    policy = ExceptionPolicy("reattempt", wait=15, max_reattempts=3)
    decision = _resolve(RuntimeError(), step_policy=policy, count=2)
    assert decision.action is Action.REATTEMPT
    assert decision.wait == timedelta(seconds=15)
    assert not decision.terminal


def test_a_reattempt_at_its_cap_turns_into_the_terminal_action():
    policy = ExceptionPolicy("reattempt", wait=15, max_reattempts=3, terminal_action="cancel")
    decision = _resolve(RuntimeError(), step_policy=policy, count=3)
    assert decision.action is Action.CANCEL
    assert decision.terminal
    assert decision.wait is None


@pytest.mark.parametrize(("terminal", "action"), [("pause", Action.PAUSE), ("skip", Action.SKIP)])
def test_each_terminal_action_is_applied_at_the_cap(terminal, action):
    policy = ExceptionPolicy("reattempt", max_reattempts=1, terminal_action=terminal)
    assert _resolve(RuntimeError(), step_policy=policy, count=1).action is action


def test_an_uncapped_reattempt_never_turns_terminal():
    policy = ExceptionPolicy("reattempt")
    decision = _resolve(RuntimeError(), step_policy=policy, count=10_000)
    assert decision.action is Action.REATTEMPT


def test_a_class_level_cap_also_caps_a_step_level_reattempt():
    # The global cap is the smallest max_reattempts anywhere in the stack (gem H-9).
    step_policy = ExceptionPolicy("reattempt", max_reattempts=100, terminal_action="skip")
    class_policy = ExceptionPolicy("reattempt", matching=TimeoutError, max_reattempts=3)
    below = _resolve(
        RuntimeError(), step_policy=step_policy, class_policies=[class_policy], count=2
    )
    at = _resolve(RuntimeError(), step_policy=step_policy, class_policies=[class_policy], count=3)
    assert below.action is Action.REATTEMPT
    assert at.action is Action.SKIP  # the matched policy's terminal action
    assert at.terminal


def test_the_smallest_cap_of_a_step_list_applies():
    step_policy = PolicyList(
        [
            ExceptionPolicy("reattempt", matching=KeyError, max_reattempts=10),
            ExceptionPolicy("reattempt", max_reattempts=2, terminal_action="cancel"),
        ]
    )
    decision = _resolve(KeyError(), step_policy=step_policy, count=2)
    assert decision.terminal
    assert decision.action is Action.PAUSE  # the KeyError member's own terminal action


def test_a_non_reattempt_action_is_never_turned_terminal():
    decision = _resolve(
        RuntimeError(),
        step_policy=ExceptionPolicy("skip"),
        class_policies=[ExceptionPolicy("reattempt", matching=KeyError, max_reattempts=1)],
        count=5,
    )
    assert decision.action is Action.SKIP
    assert not decision.terminal


def test_the_reattempt_wait_follows_the_attempt_number():
    policy = ExceptionPolicy("reattempt", wait=lambda n: 10 * (n + 1))
    assert _resolve(RuntimeError(), step_policy=policy, count=0).wait == timedelta(seconds=10)
    assert _resolve(RuntimeError(), step_policy=policy, count=4).wait == timedelta(seconds=50)


def test_a_retry_after_on_the_error_stretches_the_reattempt_wait():
    error = RuntimeError("rate limited")
    error.retry_after = 600  # type: ignore[attr-defined]
    decision = _resolve(error, step_policy=ExceptionPolicy("reattempt", wait=5))
    assert decision.wait == timedelta(seconds=600)


# -- imperative handlers -------------------------------------------------------------------


def test_a_handler_that_reattempts_decides_reattempt_with_its_wait():
    policy = ExceptionPolicy(handler=lambda wf, error: wf.reattempt(wait=45))
    decision = _resolve(RuntimeError(), step_policy=policy)
    assert decision.action is Action.REATTEMPT
    assert decision.wait == timedelta(seconds=45)


@pytest.mark.parametrize(
    ("verb", "action"),
    [("skip", Action.SKIP), ("cancel", Action.CANCEL), ("pause", Action.PAUSE)],
)
def test_a_handler_decides_by_the_flow_control_verb_it_calls(verb, action):
    policy = ExceptionPolicy(handler=lambda wf, error: getattr(wf, verb)())
    assert _resolve(RuntimeError(), step_policy=policy).action is action


def test_a_handler_that_returns_without_flow_control_pauses():
    seen = []
    policy = ExceptionPolicy(handler=lambda wf, error: seen.append((wf, error)))
    workflow, error = ResolutionFlow(), RuntimeError("boom")
    decision = _resolve(error, step_policy=policy, workflow=workflow)
    assert decision.action is Action.PAUSE
    assert seen == [(workflow, error)]


def test_a_handler_leaves_the_workflow_outside_step_context_afterwards():
    workflow = ResolutionFlow()
    policy = ExceptionPolicy(handler=lambda wf, e: wf.skip())
    _resolve(RuntimeError(), step_policy=policy, workflow=workflow)
    assert not workflow._in_step


def test_a_handler_reattempt_is_capped_like_a_declarative_one():
    policy = ExceptionPolicy(handler=lambda wf, error: wf.reattempt())
    decision = _resolve(
        RuntimeError(),
        step_policy=policy,
        class_policies=[ExceptionPolicy("reattempt", matching=KeyError, max_reattempts=2)],
        count=2,
    )
    assert decision.action is Action.PAUSE
    assert decision.terminal


def test_a_handler_is_not_run_when_a_higher_policy_decides():
    calls = []
    class_policy = ExceptionPolicy(handler=lambda wf, error: calls.append(error))
    _resolve(KeyError(), step_policy=ExceptionPolicy("skip"), class_policies=[class_policy])
    assert calls == []


# -- reporting -----------------------------------------------------------------------------


def _decision(report, terminal):
    return Decision(Action.PAUSE, None, terminal, report, DEFAULT_POLICY)


@pytest.mark.parametrize(
    ("report", "terminal", "expected"),
    [
        ("always", False, True),
        ("always", True, True),
        ("never", False, False),
        ("never", True, False),
        ("terminal_only", False, False),
        ("terminal_only", True, True),
    ],
)
def test_should_report_follows_the_report_mode(report, terminal, expected):
    assert _decision(report, terminal).should_report is expected


def test_the_decision_carries_the_report_mode_of_the_deciding_policy():
    policy = ExceptionPolicy("reattempt", max_reattempts=1, report="terminal_only")
    assert not _resolve(RuntimeError(), step_policy=policy, count=0).should_report
    assert _resolve(RuntimeError(), step_policy=policy, count=1).should_report


def test_a_handler_policy_with_report_never_is_not_reported():
    policy = ExceptionPolicy(handler=lambda wf, error: wf.skip(), report="never")
    assert not _resolve(RuntimeError(), step_policy=policy).should_report


def test_a_wait_callable_returning_nan_gives_the_default_pause_with_the_problem_noted():
    # Before: timedelta(seconds=nan) raised inside resolution, which phase 3 does not survive.
    policy = ExceptionPolicy("reattempt", wait=lambda attempt: float("nan"))
    error = RuntimeError("flaky")
    decision = _resolve(error, step_policy=policy)
    assert decision.action is Action.PAUSE
    assert decision.problem is not None
    assert "its wait= callable" in str(decision.problem)
    assert any("could not be applied to RuntimeError" in note for note in error.__notes__)


def test_a_handler_that_raises_gives_the_default_pause_instead_of_escaping():
    def handler(wf, error):
        raise KeyError("bug in the handler")

    error = RuntimeError("flaky")
    decision = _resolve(error, step_policy=ExceptionPolicy(handler=handler))
    assert decision.action is Action.PAUSE
    assert "its handler raised KeyError" in str(decision.problem)

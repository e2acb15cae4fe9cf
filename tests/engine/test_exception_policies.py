"""What happens when a step raises: policies, reattempt limits, reporting."""

from __future__ import annotations

from datetime import timedelta

import pytest

from geneva_drive import ExceptionPolicy, Workflow, step
from geneva_drive.engine.executor import run_execution
from geneva_drive.runtime.configure import configured
from geneva_drive.testing import perform_next_step, perform_step_inline, speedrun
from tests.engine._support import current, executions, history, reload
from tests.support.app import Order


class PolicyBoom(Exception):
    pass


class PolicyOther(Exception):
    pass


class PolicyDefaultPause(Workflow):
    @step
    def first(self) -> None:
        raise PolicyBoom("the gateway is down")

    @step
    def second(self) -> None:
        pass


class PolicyStepCancel(Workflow):
    @step(on_exception="cancel")
    def first(self) -> None:
        raise PolicyBoom("nope")


class PolicyStepSkip(Workflow):
    @step(on_exception="skip")
    def first(self) -> None:
        raise PolicyBoom("skip me")

    @step
    def second(self) -> None:
        pass


class PolicyStepReattemptWait(Workflow):
    @step(on_exception=ExceptionPolicy("reattempt", wait=timedelta(seconds=45)))
    def first(self) -> None:
        raise PolicyBoom("try later")


class PolicyReattemptTwiceThenPause(Workflow):
    @step(on_exception="reattempt", max_reattempts=2)
    def first(self) -> None:
        raise PolicyBoom("always")


class PolicyReattemptThenCancel(Workflow):
    @step(on_exception="reattempt", max_reattempts=1, terminal_action="cancel")
    def first(self) -> None:
        raise PolicyBoom("always")


class PolicyReattemptThenSkip(Workflow):
    @step(on_exception="reattempt", max_reattempts=1, terminal_action="skip")
    def first(self) -> None:
        raise PolicyBoom("always")

    @step
    def second(self) -> None:
        pass


class PolicyClassByType(Workflow):
    exception_policies = [ExceptionPolicy("cancel", matching=PolicyBoom)]

    @step
    def first(self) -> None:
        raise PolicyBoom("by type")


class PolicyClassByDottedName(Workflow):
    exception_policies = [
        ExceptionPolicy("skip", matching="tests.engine.test_exception_policies.PolicyBoom")
    ]

    @step
    def first(self) -> None:
        raise PolicyBoom("by name")

    @step
    def second(self) -> None:
        pass


class PolicyClassNoMatch(Workflow):
    exception_policies = [ExceptionPolicy("cancel", matching=PolicyOther)]

    @step
    def first(self) -> None:
        raise PolicyBoom("not the other one")


class PolicySpecificBeatsBlanket(Workflow):
    # The blanket policy is declared last (newest) but a specific match still wins.
    exception_policies = [
        ExceptionPolicy("skip", matching=PolicyBoom),
        ExceptionPolicy("cancel"),
    ]

    @step
    def first(self) -> None:
        raise PolicyBoom("specific")

    @step
    def second(self) -> None:
        pass


class PolicyNewestSpecificWins(Workflow):
    exception_policies = [
        ExceptionPolicy("skip", matching=PolicyBoom),
        ExceptionPolicy("cancel", matching=PolicyBoom),
    ]

    @step
    def first(self) -> None:
        raise PolicyBoom("both match")


class PolicyParent(Workflow):
    exception_policies = [ExceptionPolicy("skip", matching=PolicyBoom)]

    @step
    def first(self) -> None:
        raise PolicyBoom("inherited")

    @step
    def second(self) -> None:
        pass


class PolicyChild(PolicyParent):
    exception_policies = [ExceptionPolicy("cancel", matching=PolicyBoom)]


class PolicyChildInheritsOnly(PolicyParent):
    pass


class PolicyStepListOrder(Workflow):
    @step(
        on_exception=[
            ExceptionPolicy("skip", matching=PolicyBoom),
            ExceptionPolicy("cancel"),
        ]
    )
    def first(self) -> None:
        raise self.hero_error()

    @step
    def second(self) -> None:
        pass

    def hero_error(self) -> Exception:
        return PolicyBoom("boom") if self.hero.status == "boom" else PolicyOther("other")


class PolicyStepListFallsThrough(Workflow):
    exception_policies = [ExceptionPolicy("cancel")]

    @step(on_exception=[ExceptionPolicy("skip", matching=PolicyOther)])
    def first(self) -> None:
        raise PolicyBoom("unmatched by the step list")


class PolicyStepBeatsClass(Workflow):
    exception_policies = [ExceptionPolicy("cancel", matching=PolicyBoom)]

    @step(on_exception="skip")
    def first(self) -> None:
        raise PolicyBoom("step wins")


def _handler_reattempt(wf, error):
    wf.reattempt(wait=30)


def _handler_skip(wf, error):
    wf.skip()


def _handler_finish(wf, error):
    wf.finish()


def _handler_returns(wf, error):
    return None


class PolicyHandlerReattempt(Workflow):
    @step(on_exception=_handler_reattempt)
    def first(self) -> None:
        raise PolicyBoom("handled")


class PolicyHandlerSkip(Workflow):
    @step(on_exception=_handler_skip)
    def first(self) -> None:
        raise PolicyBoom("handled")

    @step
    def second(self) -> None:
        pass


class PolicyHandlerFinish(Workflow):
    @step(on_exception=_handler_finish)
    def first(self) -> None:
        raise PolicyBoom("handled")

    @step
    def second(self) -> None:
        pass


class PolicyHandlerReturns(Workflow):
    @step(on_exception=_handler_returns)
    def first(self) -> None:
        raise PolicyBoom("handled")


class PolicyGlobalCap(Workflow):
    # The class-level cap of 1 also caps the step's own reattempt policy (cap of 5).
    exception_policies = [ExceptionPolicy("reattempt", matching=PolicyOther, max_reattempts=1)]

    @step(on_exception="reattempt", max_reattempts=5, terminal_action="cancel")
    def first(self) -> None:
        raise PolicyBoom("capped")


class PolicyFlowReattemptsDoNotCount(Workflow):
    @step(on_exception="reattempt", max_reattempts=1)
    def first(self) -> None:
        self.hero.counter += 1
        if self.hero.counter <= 3:
            self.reattempt()
        raise PolicyBoom("after three flow-control reattempts")


class PolicyCountByStatus(Workflow):
    @step(on_exception="reattempt", max_reattempts=1)
    def first(self) -> None:
        if self.hero.status == "fail":
            raise PolicyBoom("failing on purpose")

    @step
    def second(self) -> None:
        pass


class PolicyReportNever(Workflow):
    @step(on_exception=ExceptionPolicy("pause", report="never"))
    def first(self) -> None:
        raise PolicyBoom("quiet")


class PolicyReportTerminalOnly(Workflow):
    @step(
        on_exception=ExceptionPolicy(
            "reattempt", max_reattempts=1, report="terminal_only", terminal_action="cancel"
        )
    )
    def first(self) -> None:
        raise PolicyBoom("only at the end")


def _run_failing(wf, error: type[Exception] = PolicyBoom) -> None:
    """Run the next step, which raises: the helper raises it again once the outcome is
    committed, whatever the policy made of it."""
    with pytest.raises(error):
        perform_next_step(wf)


def _start(session, cls, **hero_fields):
    order = Order(**hero_fields)
    session.add(order)
    wf = cls.create(session, hero=order)
    session.commit()
    return wf


class Reporter:
    def __init__(self) -> None:
        self.calls: list[tuple[BaseException, dict]] = []

    def __call__(self, error: BaseException, context: dict) -> None:
        self.calls.append((error, context))


# -- the default ---------------------------------------------------------------------------


def test_by_default_a_raising_step_fails_and_pauses_the_workflow(session, clock):
    wf = _start(session, PolicyDefaultPause)
    clock.advance(seconds=11)

    _run_failing(wf)

    assert history(session, wf) == [("first", "failed", "failed")]
    reload(session, wf)
    assert wf.state == "paused"
    assert wf.transitioned_at == clock.now()
    assert wf.next_step_name == "first"


def test_a_failed_execution_stores_the_error_columns_and_metadata(session, clock):
    wf = _start(session, PolicyDefaultPause)

    _run_failing(wf)

    [execution] = executions(session, wf)
    assert execution.error_class_name == "tests.engine.test_exception_policies.PolicyBoom"
    assert execution.error_message == "the gateway is down"
    assert "Traceback" in execution.error_backtrace
    assert "raise PolicyBoom" in execution.error_backtrace
    assert execution.failed_at == clock.now()
    info = execution.exception_info
    assert info["class"] == "tests.engine.test_exception_policies.PolicyBoom"
    assert info["message"] == "the gateway is down"
    assert info["backtrace"]


def test_the_step_exception_is_reraised_after_the_outcome_is_committed(session):
    wf = _start(session, PolicyDefaultPause)
    execution_id = current(session, wf).id

    with pytest.raises(PolicyBoom, match="the gateway is down"):
        run_execution(execution_id, reraise=True)

    assert history(session, wf) == [("first", "failed", "failed")]


# -- declarative actions -------------------------------------------------------------------


def test_a_cancel_policy_fails_the_execution_as_canceled_and_cancels_the_workflow(session):
    wf = _start(session, PolicyStepCancel)

    _run_failing(wf)

    assert history(session, wf) == [("first", "failed", "canceled")]
    [execution] = executions(session, wf)
    assert execution.error_message == "nope"
    assert reload(session, wf).state == "canceled"


def test_a_skip_policy_skips_the_step_without_error_columns_and_moves_on(session):
    wf = _start(session, PolicyStepSkip)

    _run_failing(wf)

    assert history(session, wf) == [("first", "skipped", "skipped"), ("second", "scheduled", None)]
    assert executions(session, wf)[0].error_message is None
    assert reload(session, wf).state == "ready"


def test_a_reattempt_policy_reschedules_the_step_after_its_wait(session, clock):
    wf = _start(session, PolicyStepReattemptWait)

    _run_failing(wf)

    assert history(session, wf) == [
        ("first", "completed", "reattempted"),
        ("first", "scheduled", None),
    ]
    assert current(session, wf).scheduled_for == clock.now() + timedelta(seconds=45)
    assert wf.state == "ready"


def test_a_policy_reattempt_records_its_reason_and_exception_but_no_error_columns(session):
    wf = _start(session, PolicyStepReattemptWait)

    _run_failing(wf)

    first = executions(session, wf)[0]
    assert first.reattempt_reason == "exception_policy"
    assert first.exception_info["message"] == "try later"
    assert first.error_message is None
    assert first.error_class_name is None


# -- reattempt limits ----------------------------------------------------------------------


def test_max_reattempts_n_reattempts_n_times_then_applies_the_terminal_pause(session):
    wf = _start(session, PolicyReattemptTwiceThenPause)

    speedrun(wf, raise_errors=False)  # on through the reattempts

    assert history(session, wf) == [
        ("first", "completed", "reattempted"),
        ("first", "completed", "reattempted"),
        ("first", "failed", "failed"),
    ]
    assert reload(session, wf).state == "paused"


def test_a_terminal_cancel_fails_the_last_attempt_as_canceled(session):
    wf = _start(session, PolicyReattemptThenCancel)

    speedrun(wf, raise_errors=False)  # on through the reattempts

    assert history(session, wf) == [
        ("first", "completed", "reattempted"),
        ("first", "failed", "canceled"),
    ]
    assert reload(session, wf).state == "canceled"


def test_a_terminal_skip_skips_the_last_attempt_and_moves_on(session):
    wf = _start(session, PolicyReattemptThenSkip)

    _run_failing(wf)
    _run_failing(wf)

    assert history(session, wf) == [
        ("first", "completed", "reattempted"),
        ("first", "skipped", "skipped"),
        ("second", "scheduled", None),
    ]


def test_the_smallest_max_reattempts_in_the_whole_stack_caps_the_step(session):
    wf = _start(session, PolicyGlobalCap)

    speedrun(wf, raise_errors=False)  # on through the reattempts

    assert history(session, wf) == [
        ("first", "completed", "reattempted"),
        ("first", "failed", "canceled"),  # the step's own terminal action
    ]


def test_flow_control_reattempts_do_not_count_towards_max_reattempts(session):
    wf = _start(session, PolicyFlowReattemptsDoNotCount)

    speedrun(wf, raise_errors=False)  # on through the reattempts

    assert [outcome for _, _, outcome in history(session, wf)] == [
        "reattempted",  # flow control
        "reattempted",  # flow control
        "reattempted",  # flow control
        "reattempted",  # the one exception reattempt allowed
        "failed",
    ]


def test_a_skipped_execution_does_not_reset_the_reattempt_count(session):
    wf = _start(session, PolicyCountByStatus, status="fail")
    _run_failing(wf)  # fails: reattempt 1 of 1
    reload(session, wf)
    wf.skip()  # an operator skips the reattempt
    session.commit()

    with pytest.raises(PolicyBoom):  # fails again: the limit is already used up
        perform_step_inline(wf, "first")

    assert history(session, wf) == [
        ("first", "completed", "reattempted"),
        ("first", "skipped", "skipped"),
        ("second", "canceled", "canceled"),  # swept by perform_step_inline
        ("first", "failed", "failed"),
    ]
    assert reload(session, wf).state == "paused"


def test_a_clean_completion_resets_the_reattempt_count(session):
    wf = _start(session, PolicyCountByStatus, status="fail")
    _run_failing(wf)  # fails: reattempt 1 of 1
    order = session.get(Order, int(wf.hero_id))
    order.status = "ok"
    session.commit()
    perform_next_step(wf)  # completes cleanly
    order.status = "fail"
    session.commit()

    with pytest.raises(PolicyBoom):  # fails: the count starts again at 0
        perform_step_inline(wf, "first")

    assert history(session, wf)[-2][1:] == ("completed", "reattempted")
    assert reload(session, wf).state == "ready"


# -- class-level policies -----------------------------------------------------------------


def test_a_class_policy_matches_by_exception_class(session):
    wf = _start(session, PolicyClassByType)

    _run_failing(wf)

    assert history(session, wf) == [("first", "failed", "canceled")]


def test_a_class_policy_matches_by_dotted_class_name(session):
    wf = _start(session, PolicyClassByDottedName)

    _run_failing(wf)

    assert history(session, wf)[0] == ("first", "skipped", "skipped")


def test_a_class_policy_that_does_not_match_falls_back_to_pause(session):
    wf = _start(session, PolicyClassNoMatch)

    _run_failing(wf)

    assert history(session, wf) == [("first", "failed", "failed")]
    assert reload(session, wf).state == "paused"


def test_a_specific_class_policy_wins_over_a_newer_blanket_one(session):
    wf = _start(session, PolicySpecificBeatsBlanket)

    _run_failing(wf)

    assert history(session, wf)[0] == ("first", "skipped", "skipped")


def test_the_newest_matching_class_policy_wins(session):
    wf = _start(session, PolicyNewestSpecificWins)

    _run_failing(wf)

    assert history(session, wf) == [("first", "failed", "canceled")]


def test_a_subclass_policy_is_newer_than_the_inherited_one(session):
    wf = _start(session, PolicyChild)

    _run_failing(wf)

    assert history(session, wf) == [("first", "failed", "canceled")]


def test_a_subclass_inherits_its_parents_policies(session):
    wf = _start(session, PolicyChildInheritsOnly)

    _run_failing(wf)

    assert history(session, wf)[0] == ("first", "skipped", "skipped")


def test_a_step_policy_wins_over_a_matching_class_policy(session):
    wf = _start(session, PolicyStepBeatsClass)

    _run_failing(wf)

    assert history(session, wf) == [("first", "skipped", "skipped")]


# -- step-level lists ----------------------------------------------------------------------


def test_a_step_policy_list_takes_the_first_member_that_matches(session):
    wf = _start(session, PolicyStepListOrder, status="boom")

    _run_failing(wf)

    assert history(session, wf)[0] == ("first", "skipped", "skipped")


def test_a_step_policy_list_uses_its_blanket_member_for_other_errors(session):
    wf = _start(session, PolicyStepListOrder, status="other")

    _run_failing(wf, PolicyOther)

    assert history(session, wf) == [("first", "failed", "canceled")]


def test_a_step_policy_list_without_a_match_falls_through_to_class_policies(session):
    wf = _start(session, PolicyStepListFallsThrough)

    _run_failing(wf)

    assert history(session, wf) == [("first", "failed", "canceled")]


# -- imperative handlers -------------------------------------------------------------------


def test_a_handler_that_reattempts_reschedules_with_its_wait(session, clock):
    wf = _start(session, PolicyHandlerReattempt)

    _run_failing(wf)

    assert history(session, wf)[0] == ("first", "completed", "reattempted")
    assert current(session, wf).scheduled_for == clock.now() + timedelta(seconds=30)


def test_a_handler_that_skips_moves_to_the_next_step(session):
    wf = _start(session, PolicyHandlerSkip)

    _run_failing(wf)

    assert history(session, wf) == [("first", "skipped", "skipped"), ("second", "scheduled", None)]


def test_a_handler_that_finishes_finishes_the_workflow(session, clock):
    wf = _start(session, PolicyHandlerFinish)
    clock.advance(seconds=2)

    _run_failing(wf)

    assert history(session, wf) == [("first", "completed", "success")]
    reload(session, wf)
    assert wf.state == "finished"
    assert wf.transitioned_at == clock.now()


def test_a_handler_that_returns_normally_pauses(session):
    wf = _start(session, PolicyHandlerReturns)

    _run_failing(wf)

    assert history(session, wf) == [("first", "failed", "failed")]
    assert reload(session, wf).state == "paused"


# -- reporting -----------------------------------------------------------------------------


def test_the_default_policy_reports_the_error_with_context(session):
    wf = _start(session, PolicyDefaultPause)
    execution_id = current(session, wf).id
    reporter = Reporter()

    with configured(error_reporter=reporter):
        _run_failing(wf)

    [(error, context)] = reporter.calls
    assert isinstance(error, PolicyBoom)
    assert context["workflow_id"] == wf.id
    assert context["workflow_class"] == "PolicyDefaultPause"
    assert context["step_execution_id"] == execution_id
    assert context["step_name"] == "first"
    assert context["hero_type"] == "Order"


def test_report_never_does_not_report(session):
    wf = _start(session, PolicyReportNever)
    reporter = Reporter()

    with configured(error_reporter=reporter):
        _run_failing(wf)

    assert reporter.calls == []
    assert history(session, wf) == [("first", "failed", "failed")]


def test_report_terminal_only_reports_only_when_the_limit_is_exceeded(session):
    wf = _start(session, PolicyReportTerminalOnly)
    reporter = Reporter()

    with configured(error_reporter=reporter):
        _run_failing(wf)
        assert reporter.calls == []
        _run_failing(wf)

    assert len(reporter.calls) == 1
    assert reporter.calls[0][1]["terminal"] is True
    assert history(session, wf)[-1] == ("first", "failed", "canceled")


def test_a_failing_error_reporter_does_not_change_the_outcome(session):
    wf = _start(session, PolicyDefaultPause)

    def broken(error, context):
        raise RuntimeError("reporter down")

    with configured(error_reporter=broken):
        _run_failing(wf)

    assert history(session, wf) == [("first", "failed", "failed")]

"""Preconditions checked before a step runs: cancel_if, skip_if, the hero."""

from __future__ import annotations

import pytest

from geneva_drive import Workflow, step
from geneva_drive.engine.executor import run_execution
from geneva_drive.testing import perform_next_step
from tests.engine._support import current, executions, history, reload
from tests.support.app import Order

BODY_RUNS: list[str] = []


class PreconditionError(Exception):
    pass


class PreParentCancel(Workflow):
    def cancel_if(self) -> bool:
        return self.hero.canceled

    @step
    def first(self) -> None:
        BODY_RUNS.append("PreParentCancel")


class PreChildCancel(PreParentCancel):
    def cancel_if(self) -> bool:
        return self.hero.status == "blocked"


class PreSkipCallable(Workflow):
    @step(skip_if=lambda wf: wf.hero.status == "digital")
    def ship(self) -> None:
        BODY_RUNS.append("PreSkipCallable")

    @step(wait=120)
    def notify(self) -> None:
        pass


class PreSkipMethodName(Workflow):
    @step(skip_if="is_digital")
    def ship(self) -> None:
        BODY_RUNS.append("PreSkipMethodName")

    @step
    def notify(self) -> None:
        pass

    def is_digital(self) -> bool:
        return self.hero.status == "digital"


class PreSkipAttributeName(Workflow):
    skip_shipping = True

    @step(skip_if="skip_shipping")
    def ship(self) -> None:
        BODY_RUNS.append("PreSkipAttributeName")

    @step
    def notify(self) -> None:
        pass


class PreSkipTrue(Workflow):
    @step(skip_if=True)
    def never(self) -> None:
        BODY_RUNS.append("PreSkipTrue")

    @step
    def after(self) -> None:
        pass


class PreSkipFalse(Workflow):
    @step(skip_if=False)
    def always(self) -> None:
        BODY_RUNS.append("PreSkipFalse")


class PreSkipLast(Workflow):
    @step(skip_if=True)
    def only(self) -> None:
        BODY_RUNS.append("PreSkipLast")


class PreCancelBeatsSkip(Workflow):
    def cancel_if(self) -> bool:
        return True

    @step(skip_if=True)
    def first(self) -> None:
        pass


class PreNeedsHero(Workflow):
    @step
    def first(self) -> None:
        BODY_RUNS.append("PreNeedsHero")


class PreWithoutHero(Workflow):
    may_proceed_without_hero = True

    @step
    def first(self) -> None:
        BODY_RUNS.append(f"PreWithoutHero hero={self.hero}")


class PreCancelIfRaises(Workflow):
    def cancel_if(self) -> bool:
        raise PreconditionError("cannot tell")

    @step
    def first(self) -> None:
        BODY_RUNS.append("PreCancelIfRaises")


class PreSkipIfRaisesReattempt(Workflow):
    @step(skip_if=lambda wf: wf.explode(), on_exception="reattempt")
    def first(self) -> None:
        BODY_RUNS.append("PreSkipIfRaisesReattempt")

    def explode(self) -> bool:
        raise PreconditionError("skip_if blew up")


class PreSkipIfRaisesCancel(Workflow):
    @step(skip_if=lambda wf: wf.explode(), on_exception="cancel")
    def first(self) -> None:
        BODY_RUNS.append("PreSkipIfRaisesCancel")

    def explode(self) -> bool:
        raise PreconditionError("skip_if blew up")


def _skip_handler(wf, error):
    wf.skip()


class PreSkipIfRaisesHandler(Workflow):
    @step(skip_if=lambda wf: wf.explode(), on_exception=_skip_handler)
    def first(self) -> None:
        BODY_RUNS.append("PreSkipIfRaisesHandler")

    @step
    def second(self) -> None:
        pass

    def explode(self) -> bool:
        raise PreconditionError("skip_if blew up")


@pytest.fixture(autouse=True)
def _clear_runs():
    BODY_RUNS.clear()


def _start(session, cls, **hero_fields):
    order = Order(**hero_fields)
    session.add(order)
    wf = cls.create(session, hero=order)
    session.commit()
    return wf, order


# -- cancel_if -----------------------------------------------------------------------------


def test_a_true_cancel_if_cancels_the_workflow_before_the_body_runs(session, clock):
    wf, _ = _start(session, PreParentCancel, canceled=True)
    clock.advance(seconds=9)

    perform_next_step(wf)

    assert BODY_RUNS == []
    assert history(session, wf) == [("first", "canceled", "canceled")]
    reload(session, wf)
    assert wf.state == "canceled"
    assert wf.transitioned_at == clock.now()


def test_a_false_cancel_if_lets_the_step_run(session):
    wf, _ = _start(session, PreParentCancel)

    perform_next_step(wf)

    assert BODY_RUNS == ["PreParentCancel"]
    assert reload(session, wf).state == "finished"


def test_a_subclass_cancel_if_adds_to_its_parents_condition(session):
    wf, _ = _start(session, PreChildCancel, status="blocked")

    perform_next_step(wf)

    assert history(session, wf) == [("first", "canceled", "canceled")]


def test_a_parents_cancel_if_still_applies_to_a_subclass_that_overrides_it(session):
    wf, _ = _start(session, PreChildCancel, canceled=True)

    perform_next_step(wf)

    assert BODY_RUNS == []
    assert reload(session, wf).state == "canceled"


def test_cancel_if_is_checked_before_skip_if(session):
    wf, _ = _start(session, PreCancelBeatsSkip)

    perform_next_step(wf)

    assert history(session, wf) == [("first", "canceled", "canceled")]


# -- skip_if -------------------------------------------------------------------------------


def test_a_callable_skip_if_skips_the_step_and_schedules_the_next_with_its_wait(session, clock):
    wf, _ = _start(session, PreSkipCallable, status="digital")

    perform_next_step(wf)

    assert BODY_RUNS == []
    assert history(session, wf) == [("ship", "skipped", "skipped"), ("notify", "scheduled", None)]
    assert current(session, wf).scheduled_for.timestamp() == clock.now().timestamp() + 120
    assert wf.state == "ready"


def test_a_skipped_execution_is_stamped_skipped_and_finished(session, clock):
    wf, _ = _start(session, PreSkipCallable, status="digital")

    perform_next_step(wf)

    skipped = executions(session, wf)[0]
    assert skipped.skipped_at == clock.now()
    assert skipped.finished_at == clock.now()


def test_a_false_callable_skip_if_runs_the_step(session):
    wf, _ = _start(session, PreSkipCallable, status="physical")

    perform_next_step(wf)

    assert BODY_RUNS == ["PreSkipCallable"]


def test_skip_if_can_name_a_method(session):
    wf, _ = _start(session, PreSkipMethodName, status="digital")

    perform_next_step(wf)

    assert BODY_RUNS == []
    assert history(session, wf)[0] == ("ship", "skipped", "skipped")


def test_skip_if_can_name_an_attribute(session):
    wf, _ = _start(session, PreSkipAttributeName)

    perform_next_step(wf)

    assert BODY_RUNS == []
    assert history(session, wf)[0] == ("ship", "skipped", "skipped")


def test_skip_if_true_always_skips(session):
    wf, _ = _start(session, PreSkipTrue)

    perform_next_step(wf)

    assert BODY_RUNS == []
    assert history(session, wf) == [("never", "skipped", "skipped"), ("after", "scheduled", None)]


def test_skip_if_false_never_skips(session):
    wf, _ = _start(session, PreSkipFalse)

    perform_next_step(wf)

    assert BODY_RUNS == ["PreSkipFalse"]


def test_skipping_the_last_step_by_skip_if_finishes_the_workflow(session):
    wf, _ = _start(session, PreSkipLast)

    perform_next_step(wf)

    assert reload(session, wf).state == "finished"


# -- the hero ------------------------------------------------------------------------------


def test_a_deleted_hero_cancels_the_workflow(session, clock):
    wf, order = _start(session, PreNeedsHero)
    session.delete(order)
    session.commit()
    clock.advance(seconds=4)

    perform_next_step(wf)

    assert BODY_RUNS == []
    assert history(session, wf) == [("first", "canceled", "canceled")]
    reload(session, wf)
    assert wf.state == "canceled"
    assert wf.transitioned_at == clock.now()


def test_a_workflow_that_may_proceed_without_hero_runs_its_step_when_the_hero_is_gone(session):
    wf, order = _start(session, PreWithoutHero)
    session.delete(order)
    session.commit()

    perform_next_step(wf)

    assert BODY_RUNS == ["PreWithoutHero hero=None"]
    assert reload(session, wf).state == "finished"


# -- preconditions that raise --------------------------------------------------------------


def test_a_raising_cancel_if_pauses_with_the_error_recorded_and_the_body_not_run(session):
    wf, _ = _start(session, PreCancelIfRaises)

    with pytest.raises(PreconditionError, match="cannot tell"):
        perform_next_step(wf)

    assert BODY_RUNS == []
    assert history(session, wf) == [("first", "failed", "failed")]
    [execution] = executions(session, wf)
    assert execution.error_message == "cannot tell"
    assert reload(session, wf).state == "paused"


def test_a_raising_precondition_reraises_the_original_error(session):
    wf, _ = _start(session, PreCancelIfRaises)
    execution_id = current(session, wf).id

    with pytest.raises(PreconditionError, match="cannot tell"):
        run_execution(execution_id, reraise=True)

    assert history(session, wf) == [("first", "failed", "failed")]


def test_a_raising_skip_if_follows_the_steps_reattempt_policy_with_reason_precondition(session):
    wf, _ = _start(session, PreSkipIfRaisesReattempt)

    with pytest.raises(PreconditionError, match="skip_if blew up"):
        perform_next_step(wf)

    assert BODY_RUNS == []
    assert history(session, wf) == [
        ("first", "completed", "reattempted"),
        ("first", "scheduled", None),
    ]
    assert executions(session, wf)[0].reattempt_reason == "precondition"
    assert reload(session, wf).state == "ready"


def test_a_raising_skip_if_follows_the_steps_cancel_policy(session):
    wf, _ = _start(session, PreSkipIfRaisesCancel)

    with pytest.raises(PreconditionError, match="skip_if blew up"):
        perform_next_step(wf)

    assert BODY_RUNS == []
    assert history(session, wf) == [("first", "failed", "canceled")]
    assert reload(session, wf).state == "canceled"


def test_a_handler_for_a_raising_precondition_acts_as_flow_control_not_as_an_operator(session):
    wf, _ = _start(session, PreSkipIfRaisesHandler)

    with pytest.raises(PreconditionError, match="skip_if blew up"):
        perform_next_step(wf)

    assert BODY_RUNS == []
    assert history(session, wf) == [("first", "skipped", "skipped"), ("second", "scheduled", None)]
    assert reload(session, wf).state == "ready"

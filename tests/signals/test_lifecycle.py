"""The gate, matchers, counters and consumption, and how signals compose with everything else."""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

import pytest

from geneva_drive import ExceptionPolicy, Workflow, resumable_step, step
from geneva_drive.definition.steps import SignalMatcher
from geneva_drive.engine.writer import fully_resolved
from geneva_drive.testing import (
    assert_signal_state,
    assert_waiting_for_signal,
    perform_next_step,
    speedrun,
)
from tests.engine._support import current, history
from tests.signals._support import drive, notes, reload, signal_row, signals_of, start
from tests.support.app import AuditEntry, Order


def _note(workflow: Workflow, text: str) -> None:
    workflow.session.add(AuditEntry(order_id=workflow.hero.id, note=text))


# -- matchers -------------------------------------------------------------------------------

SEEN: list[tuple[int, object, str]] = []


def _big_enough(workflow, payload):
    # The live workflow: the in-memory marker set by the test is visible here.
    SEEN.append((id(workflow), payload, getattr(workflow, "marker", None)))
    return payload["amount"] >= workflow.hero.counter


class SigLifeNarrowed(Workflow):
    @step(wait_for=SignalMatcher("paid", _big_enough))
    def capture(self) -> None:
        _note(self, f"captured {self.received_signal.payload['amount']}")


class _EitherOf:
    """A matcher object that owns the whole predicate (two names)."""

    name = "approved"

    def matches(self, signal) -> bool:
        return signal.name in ("approved", "auto_approved")


class SigLifeEither(Workflow):
    @step(wait_for=_EitherOf())
    def decide(self) -> None:
        _note(self, f"decided by {self.received_signal.name}")


def test_a_matcher_predicate_sees_the_senders_live_workflow_and_the_payload(session):
    SEEN.clear()
    wf = start(session, SigLifeNarrowed, counter=100)
    perform_next_step(wf)
    wf.marker = "live"  # not a column: only the very instance carries it

    wf.signal("paid", payload={"amount": 50})
    session.commit()
    assert current(session, wf).state == "waiting"
    wf.marker = "live"
    wf.signal("paid", payload={"amount": 150})
    session.commit()

    assert [(p, m) for (i, p, m) in SEEN] == [({"amount": 50}, "live"), ({"amount": 150}, "live")]
    assert {i for (i, p, m) in SEEN} == {id(wf)}
    drive(wf)
    assert notes(session, wf) == ["captured 150"]
    assert [s.state for s in signals_of(session, wf)] == ["pending", "consumed"]


def test_the_gate_applies_the_matcher_to_buffered_signals_oldest_first(session):
    wf = start(session, SigLifeNarrowed, counter=100)
    wf.signal("paid", payload={"amount": 10})
    wf.signal("paid", payload={"amount": 200})
    wf.signal("paid", payload={"amount": 300})
    session.commit()

    drive(wf)

    assert notes(session, wf) == ["captured 200"]


def test_an_object_with_matches_owns_the_whole_predicate(session):
    wf = start(session, SigLifeEither)
    perform_next_step(wf)
    wf.signal("rejected")
    session.commit()
    assert current(session, wf).state == "waiting"

    wf.signal("auto_approved")
    session.commit()
    drive(wf)

    assert notes(session, wf) == ["decided by auto_approved"]


def test_a_signal_matcher_needs_a_name():
    with pytest.raises(ValueError, match="non-blank signal name"):
        SignalMatcher("  ")
    assert repr(SignalMatcher("x", _big_enough)) == "x (narrowed by payload)"
    assert repr(SignalMatcher("x")) == "x"


# -- counters and consumption ---------------------------------------------------------------


class SigLifeTwoWaits(Workflow):
    @step(wait_for="tick")
    def first(self) -> None:
        _note(self, f"first {self.received_signal.payload}")

    @step(wait_for="tick")
    def second(self) -> None:
        _note(self, f"second {self.received_signal.payload}")


class SigLifeFlaky(Workflow):
    # In memory (cleared by each test): a failing step's writes roll back, and it may not
    # commit them early.
    tries: ClassVar[list[str]] = []

    @step(
        wait_for="go",
        on_exception=ExceptionPolicy("reattempt", matching=ConnectionError, max_reattempts=5),
    )
    def call(self) -> None:
        SigLifeFlaky.tries.append(f"try {self.received_signal.payload}")
        if len(SigLifeFlaky.tries) < 3:
            raise ConnectionError("flaky")


class SigLifeAsksAgain(Workflow):
    @step(wait_for="go")
    def call(self) -> None:
        _note(self, f"saw {self.received_signal.id}")
        if self.hero.status != "again":
            self.hero.status = "again"
            self.reattempt()


def test_the_first_step_may_wait_and_the_workflow_parks_right_after_its_first_job(session):
    wf = start(session, SigLifeTwoWaits)

    perform_next_step(wf)

    assert reload(session, wf).state == "ready"
    assert_waiting_for_signal(wf, "tick")
    parked = current(session, wf)
    assert parked.step_name == "first" and parked.waiting_since is not None
    with pytest.raises(AssertionError, match="parked waiting for"):
        speedrun(wf)


def test_two_sequential_steps_waiting_for_one_name_need_two_signals(session):
    wf = start(session, SigLifeTwoWaits)
    wf.signal("tick", payload=1)
    session.commit()
    drive(wf)

    assert_waiting_for_signal(wf, "tick")
    assert current(session, wf).step_name == "second"
    wf.signal("tick", payload=2)
    session.commit()
    drive(wf)

    assert notes(session, wf) == ["first 1", "second 2"]
    assert [(s.state, s.claimed, s.consumed) for s in signals_of(session, wf)] == [
        ("consumed", 1, 1),
        ("consumed", 1, 1),
    ]
    assert reload(session, wf).state == "finished"


def test_a_second_signal_arriving_while_one_is_claimed_stays_pending(session):
    wf = start(session, SigLifeTwoWaits)
    perform_next_step(wf)
    wf.signal("tick", payload=1)
    session.commit()  # woken, claimed, not yet run

    wf.signal("tick", payload=2)
    session.commit()

    assert [(s.payload, s.state) for s in signals_of(session, wf)] == [
        (1, "claimed"),
        (2, "pending"),
    ]
    drive(wf)
    assert notes(session, wf) == ["first 1", "second 2"]


def test_each_reattempt_claims_the_same_signal_again_and_one_success_consumes_it(session):
    SigLifeFlaky.tries.clear()
    wf = start(session, SigLifeFlaky)
    wf.signal("go", payload="p")
    session.commit()

    drive(wf, raise_errors=False)  # on through the two ConnectionErrors

    assert SigLifeFlaky.tries == ["try p", "try p", "try p"]
    assert signal_row(session, wf, "go") == ("consumed", 3, 1)
    (row,) = signals_of(session, wf)
    assert row.claimed_at is not None and row.consumed_at is not None


def test_a_flow_control_reattempt_rereads_the_same_claimed_signal(session):
    wf = start(session, SigLifeAsksAgain)
    signal = wf.signal("go")
    session.commit()

    drive(wf)

    assert notes(session, wf) == [f"saw {signal.id}", f"saw {signal.id}"]
    assert signal_row(session, wf, "go") == ("consumed", 2, 1)


def test_fully_resolved_needs_every_steps_newest_attached_execution_to_end_cleanly(session):
    SigLifeFlaky.tries.clear()
    wf = start(session, SigLifeFlaky)
    signal = wf.signal("go")
    session.commit()
    with pytest.raises(ConnectionError):  # a reattempted row, a new scheduled one (unattached)
        perform_next_step(wf)
    with pytest.raises(ConnectionError):  # attaches again, fails again
        perform_next_step(wf)

    session.refresh(signal)
    assert fully_resolved(session, signal) is False  # newest attached row is "reattempted"
    assert fully_resolved(session, signal, ["call"]) is True  # resolved by a skip decision
    drive(wf)
    session.refresh(signal)
    assert fully_resolved(session, signal) is True


def test_a_signal_nothing_attached_to_is_vacuously_resolved(session):
    wf = start(session, SigLifeTwoWaits)
    signal = wf.signal("unrelated", allow_unknown=True)  # no step waits for it
    session.commit()

    assert fully_resolved(session, signal) is True
    assert_signal_state(wf, "unrelated", "pending")


# -- composition ----------------------------------------------------------------------------


class SigLifeDelayed(Workflow):
    @step(wait=timedelta(days=2), wait_for="ready")
    def later(self) -> None:
        _note(self, f"later {self.received_signal.payload}")


class SigLifeSkippable(Workflow):
    @step(wait_for="go", skip_if=lambda wf: wf.hero.status == "skip")
    def maybe(self) -> None:
        _note(self, "ran")

    @step
    def after(self) -> None:
        _note(self, "after")


class SigLifeCancelable(Workflow):
    def cancel_if(self) -> bool:
        return bool(self.hero.canceled)

    @step(wait_for="go")
    def guarded(self) -> None:
        _note(self, "ran")


class SigLifeResumable(Workflow):
    @resumable_step(wait_for="batch", max_iterations=2)
    def process(self, it) -> None:
        for item in it.iterate_over(self.received_signal.payload["items"]):
            _note(self, f"item {item} via {self.received_signal.id}")


def test_a_delayed_waiting_step_attaches_signals_that_arrived_during_the_delay(session, clock):
    wf = start(session, SigLifeDelayed)
    assert current(session, wf).scheduled_for == clock.now() + timedelta(days=2)
    wf.signal("ready", payload="buffered")
    session.commit()
    assert signal_row(session, wf, "ready") == ("pending", 0, 0)

    clock.advance(timedelta(days=2))
    drive(wf)

    assert notes(session, wf) == ["later buffered"]
    assert history(session, wf) == [("later", "completed", "success")]


def test_skip_if_before_the_gate_never_parks_and_leaves_buffered_signals_pending(session):
    wf = start(session, SigLifeSkippable, status="skip")
    wf.signal("go")
    session.commit()

    drive(wf)

    assert history(session, wf) == [
        ("maybe", "skipped", "skipped"),
        ("after", "completed", "success"),
    ]
    assert signal_row(session, wf, "go") == ("pending", 0, 0)


def test_skip_if_at_wake_skips_the_step_and_settles_the_signal(session):
    wf = start(session, SigLifeSkippable)
    perform_next_step(wf)
    session.get(Order, int(wf.hero_id)).status = "skip"
    wf.signal("go")
    session.commit()

    drive(wf)

    assert notes(session, wf) == ["after"]
    assert history(session, wf)[0] == ("maybe", "skipped", "skipped")
    assert signal_row(session, wf, "go") == ("consumed", 1, 1)


def test_cancel_if_runs_again_at_wake_and_the_signal_stays_claimed(session):
    wf = start(session, SigLifeCancelable)
    perform_next_step(wf)
    session.get(Order, int(wf.hero_id)).canceled = True
    wf.signal("go")
    session.commit()

    drive(wf)

    assert reload(session, wf).state == "canceled"
    assert notes(session, wf) == []
    assert signal_row(session, wf, "go") == ("claimed", 1, 0)


def test_a_resumable_waiting_step_gates_once_and_its_successors_carry_the_pin(session):
    wf = start(session, SigLifeResumable)
    signal = wf.signal("batch", payload={"items": [1, 2, 3, 4, 5]})
    session.commit()

    drive(wf)

    assert notes(session, wf) == [f"item {n} via {signal.id}" for n in (1, 2, 3, 4, 5)]
    assert signal_row(session, wf, "batch") == ("consumed", 1, 1)
    assert [e[1:] for e in history(session, wf)] == [
        ("completed", "continued"),
        ("completed", "continued"),
        ("completed", "success"),
    ]


# -- settle on skip -------------------------------------------------------------------------


class SigLifeSkipsItself(Workflow):
    @step(wait_for="go")
    def maybe(self) -> None:
        self.skip()

    @step(wait_for="go")
    def next_one(self) -> None:
        _note(self, f"next got {self.received_signal.payload}")


class SigLifeSkipPolicy(Workflow):
    @step(wait_for="go", on_exception="skip")
    def fails(self) -> None:
        raise ValueError("nope")

    @step
    def after(self) -> None:
        pass


class SigLifePausesOnFailure(Workflow):
    @step(wait_for="go")
    def fails(self) -> None:
        raise ValueError("nope")

    @step
    def after(self) -> None:
        _note(self, "after")


def test_an_in_step_skip_consumes_the_signal_so_the_next_waiter_needs_a_new_one(session):
    wf = start(session, SigLifeSkipsItself)
    wf.signal("go", payload=1)
    session.commit()

    drive(wf)

    assert_waiting_for_signal(wf, "go")
    assert signal_row(session, wf, "go") == ("consumed", 1, 1)


def test_a_skip_policy_consumes_the_signal(session):
    wf = start(session, SigLifeSkipPolicy)
    wf.signal("go")
    session.commit()

    drive(wf, raise_errors=False)  # on past the skipped step's ValueError

    assert reload(session, wf).state == "finished"
    assert signal_row(session, wf, "go") == ("consumed", 1, 1)


def test_a_failure_that_pauses_leaves_the_signal_claimed_for_the_resume(session):
    wf = start(session, SigLifePausesOnFailure)
    wf.signal("go")
    session.commit()

    with pytest.raises(ValueError, match="nope"):
        drive(wf)

    assert reload(session, wf).state == "paused"
    assert signal_row(session, wf, "go") == ("claimed", 1, 0)


def test_an_operator_skip_on_a_paused_workflow_settles_the_signal_of_the_failed_step(session):
    wf = start(session, SigLifePausesOnFailure)
    wf.signal("go")
    session.commit()
    with pytest.raises(ValueError, match="nope"):
        drive(wf)

    wf.skip()
    session.commit()
    drive(wf)

    assert signal_row(session, wf, "go") == ("consumed", 1, 1)
    assert notes(session, wf) == ["after"]
    assert reload(session, wf).state == "finished"


def test_an_operator_skip_of_a_woken_but_not_yet_run_step_settles_its_signal(session):
    wf = start(session, SigLifePausesOnFailure)
    perform_next_step(wf)
    wf.signal("go")
    session.commit()
    woken = current(session, wf)
    assert woken.state == "scheduled" and woken.signal_id is not None

    wf.skip()
    session.commit()

    assert signal_row(session, wf, "go") == ("consumed", 1, 1)
    assert history(session, wf)[0] == ("fails", "skipped", "skipped")
    drive(wf)
    assert notes(session, wf) == ["after"]


def test_an_operator_skip_of_a_parked_step_moves_on_and_leaves_later_signals_alone(session):
    wf = start(session, SigLifePausesOnFailure)
    perform_next_step(wf)

    wf.skip()
    session.commit()

    assert history(session, wf)[0] == ("fails", "skipped", "skipped")
    drive(wf)
    assert notes(session, wf) == ["after"]


def test_an_operator_skip_on_a_paused_parked_workflow_schedules_the_next_step(session):
    wf = start(session, SigLifePausesOnFailure)
    perform_next_step(wf)
    wf.pause()
    session.commit()

    wf.skip()
    session.commit()
    drive(wf)

    assert notes(session, wf) == ["after"]
    assert all(e.state != "waiting" for e in [current(session, wf)] if e is not None)


# -- pause, cancel, sweep -------------------------------------------------------------------


def test_pause_leaves_a_parked_execution_intact(session):
    wf = start(session, SigLifeTwoWaits)
    perform_next_step(wf)
    parked = current(session, wf)

    wf.pause()
    session.commit()

    again = current(session, wf)
    assert (again.id, again.state, again.waiting_since) == (
        parked.id,
        "waiting",
        parked.waiting_since,
    )


def test_cancel_cancels_a_parked_execution_and_attached_signals_stay_claimed(session):
    wf = start(session, SigLifeTwoWaits)
    perform_next_step(wf)
    wf.signal("tick")
    session.commit()  # woken and claimed
    wf.signal("tick")
    session.commit()

    wf.cancel()
    session.commit()

    assert history(session, wf) == [("first", "canceled", "canceled")]
    assert [s.state for s in signals_of(session, wf)] == ["claimed", "pending"]


def test_creating_a_new_execution_past_a_parked_one_sweeps_it(session):
    from geneva_drive import settings as gd_settings
    from geneva_drive.engine import scheduling

    wf = start(session, SigLifeTwoWaits)
    perform_next_step(wf)
    reload(session, wf)

    step_def = wf.steps.named("first")
    scheduling.create_step_execution(session, wf, step_def, gd_settings().clock.now())
    session.commit()

    assert history(session, wf) == [
        ("first", "canceled", "canceled"),
        ("first", "scheduled", None),
    ]


def test_a_signal_to_a_workflow_whose_class_is_gone_is_recorded_and_wakes_nothing(session):
    from sqlalchemy import update

    wf = start(session, SigLifeTwoWaits)
    perform_next_step(wf)
    session.execute(
        update(Workflow).where(Workflow.id == wf.id).values(type="SigLifeVanishedClass")
    )
    session.commit()
    session.expunge_all()
    orphan = session.get(Workflow, wf.id)
    assert type(orphan) is Workflow

    orphan.signal("tick")
    session.commit()

    assert signal_row(session, orphan, "tick") == ("pending", 0, 0)
    assert current(session, orphan).state == "waiting"

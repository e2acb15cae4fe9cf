"""Operator verbs outside a step: pause, resume, skip, cancel — also while a step runs."""

from __future__ import annotations

import pytest

from geneva_drive import InvalidStateError, Workflow, step
from geneva_drive.engine.executor import run_execution
from geneva_drive.testing import perform_next_step, speedrun
from tests.engine._support import (
    current,
    executions,
    history,
    load_elsewhere,
    other_session,
    reload,
)
from tests.support.app import AuditEntry, Order


class VerbThreeSteps(Workflow):
    @step
    def first(self) -> None:
        pass

    @step(wait=60)
    def second(self) -> None:
        pass

    @step
    def third(self) -> None:
        pass


class VerbFailsOnce(Workflow):
    @step
    def first(self) -> None:
        if self.hero.status != "fixed":
            raise RuntimeError("not yet")

    @step
    def second(self) -> None:
        pass


def _operator(workflow_id: int, verbs: list[str]) -> None:
    """What an operator does from another process while the step runs."""
    with other_session() as s:
        wf = load_elsewhere(s, workflow_id)
        for verb in verbs:
            getattr(wf, verb)()
        s.commit()


class VerbPausedWhileRunning(Workflow):
    @step
    def first(self) -> None:
        _operator(self.id, ["pause"])
        self.session.add(AuditEntry(order_id=self.hero.id, note="first done"))

    @step
    def second(self) -> None:
        pass


class VerbPausedWhileRunningLast(Workflow):
    @step
    def only(self) -> None:
        _operator(self.id, ["pause"])


class VerbCanceledWhileRunning(Workflow):
    @step
    def first(self) -> None:
        _operator(self.id, ["cancel"])
        self.session.add(AuditEntry(order_id=self.hero.id, note="first done"))

    @step
    def second(self) -> None:
        pass


class VerbCanceledWhileFailing(Workflow):
    @step
    def first(self) -> None:
        _operator(self.id, ["cancel"])
        raise RuntimeError("failed after the cancel")


class VerbPausedAndResumedWhileRunning(Workflow):
    @step
    def first(self) -> None:
        _operator(self.id, ["pause", "resume"])

    @step
    def second(self) -> None:
        pass


class VerbSkipWhileRunning(Workflow):
    @step
    def first(self) -> None:
        with other_session() as s:
            wf = load_elsewhere(s, self.id)
            try:
                wf.skip()
            except InvalidStateError as error:
                note = str(error)[:200]
        # After the operator's session ended: on SQLite it holds the write lock until then.
        self.session.add(AuditEntry(order_id=self.hero.id, note=note))

    @step
    def second(self) -> None:
        pass


def _start(session, cls=VerbThreeSteps, **hero_fields):
    order = Order(**hero_fields)
    session.add(order)
    wf = cls.create(session, hero=order)
    session.commit()
    return wf


def _snapshot(session, wf):
    reload(session, wf)
    return (
        wf.state,
        wf.transitioned_at,
        wf.next_step_name,
        [(e.id, e.step_name, e.state, e.outcome) for e in executions(session, wf)],
    )


# -- pause and resume ----------------------------------------------------------------------


def test_pause_on_a_ready_workflow_pauses_it_and_keeps_the_scheduled_execution(session, clock):
    wf = _start(session)
    execution_id = current(session, wf).id

    wf.pause()
    session.commit()

    reload(session, wf)
    assert wf.state == "paused"
    assert wf.transitioned_at == clock.now()
    assert current(session, wf).id == execution_id
    assert current(session, wf).state == "scheduled"


def test_pause_and_resume_cycles_reuse_the_same_scheduled_execution(session):
    wf = _start(session)
    execution_id = current(session, wf).id

    for _ in range(3):
        wf.pause()
        session.commit()
        resumed = wf.resume()
        session.commit()
        assert resumed.id == execution_id

    reload(session, wf)
    assert wf.state == "ready"
    assert wf.transitioned_at is None
    assert [e.id for e in executions(session, wf)] == [execution_id]


def test_resume_keeps_a_delayed_execution_at_its_original_time(session, clock):
    wf = _start(session)
    perform_next_step(wf)  # first done; second scheduled in 60 s
    due = current(session, wf).scheduled_for
    wf.pause()
    session.commit()
    clock.advance(seconds=10)

    resumed = wf.resume()
    session.commit()

    assert resumed.step_name == "second"
    assert resumed.scheduled_for == due


def test_resume_after_a_failure_retries_the_same_step(session):
    wf = _start(session, VerbFailsOnce)
    with pytest.raises(RuntimeError, match="not yet"):
        perform_next_step(wf)
    order = session.get(Order, int(wf.hero_id))
    order.status = "fixed"
    session.commit()

    resumed = wf.resume()
    session.commit()
    speedrun(wf)

    assert resumed.step_name == "first"
    assert history(session, wf) == [
        ("first", "failed", "failed"),
        ("first", "completed", "success"),
        ("second", "completed", "success"),
    ]
    assert reload(session, wf).state == "finished"


# -- skip ----------------------------------------------------------------------------------


def test_skip_on_a_ready_workflow_skips_the_current_execution_and_schedules_the_next(
    session, clock
):
    wf = _start(session)

    wf.skip()
    session.commit()

    assert history(session, wf) == [("first", "skipped", "skipped"), ("second", "scheduled", None)]
    assert executions(session, wf)[0].skipped_at == clock.now()
    assert current(session, wf).scheduled_for.timestamp() == clock.now().timestamp() + 60
    assert wf.state == "ready"


def test_skip_on_a_paused_workflow_leaves_the_failed_execution_and_schedules_the_next(session):
    wf = _start(session, VerbFailsOnce)
    perform_next_step(wf, raise_errors=False)
    reload(session, wf)

    wf.skip()
    session.commit()

    assert history(session, wf) == [("first", "failed", "failed"), ("second", "scheduled", None)]
    reload(session, wf)
    assert wf.state == "ready"
    assert wf.transitioned_at is None


def test_skip_on_the_last_step_finishes_the_workflow(session):
    wf = _start(session)
    perform_next_step(wf)
    perform_next_step(wf)

    wf.skip()
    session.commit()

    assert history(session, wf)[-1] == ("third", "skipped", "skipped")
    assert reload(session, wf).state == "finished"


def test_skip_on_a_workflow_paused_before_its_step_ran_replaces_the_kept_execution(session):
    wf = _start(session)
    wf.pause()
    session.commit()

    wf.skip()
    session.commit()

    assert history(session, wf) == [
        ("first", "skipped", "skipped"),  # the operator's decision, not a stray
        ("second", "scheduled", None),
    ]
    assert reload(session, wf).state == "ready"


# -- cancel --------------------------------------------------------------------------------


def test_cancel_on_a_ready_workflow_cancels_it_and_its_scheduled_execution(session, clock):
    wf = _start(session)

    wf.cancel()
    session.commit()

    assert history(session, wf) == [("first", "canceled", "canceled")]
    assert executions(session, wf)[0].canceled_at == clock.now()
    reload(session, wf)
    assert wf.state == "canceled"
    assert wf.transitioned_at == clock.now()


def test_cancel_on_a_paused_workflow_cancels_its_kept_execution(session):
    wf = _start(session)
    wf.pause()
    session.commit()

    wf.cancel()
    session.commit()

    assert history(session, wf) == [("first", "canceled", "canceled")]
    assert reload(session, wf).state == "canceled"


# -- refusals ------------------------------------------------------------------------------


def _finished(session):
    wf = _start(session)
    speedrun(wf)
    return wf


def _canceled(session):
    wf = _start(session)
    wf.cancel()
    session.commit()
    return wf


def _paused(session):
    wf = _start(session)
    wf.pause()
    session.commit()
    return wf


@pytest.mark.parametrize(
    ("make", "verb", "message"),
    [
        (_start, "resume", "cannot resume a ready workflow"),
        (_paused, "pause", "cannot pause a paused workflow"),
        (_finished, "pause", "cannot pause a finished workflow"),
        (_finished, "resume", "cannot resume a finished workflow"),
        (_finished, "skip", "cannot skip a finished workflow"),
        (_finished, "cancel", "cannot cancel a finished workflow"),
        (_canceled, "cancel", "cannot cancel a canceled workflow"),
        (_canceled, "skip", "cannot skip a canceled workflow"),
        (_canceled, "resume", "cannot resume a canceled workflow"),
    ],
)
def test_a_verb_in_the_wrong_state_raises_and_leaves_the_database_unchanged(
    session, clock, make, verb, message
):
    wf = make(session)
    before = _snapshot(session, wf)
    clock.advance(seconds=30)

    with pytest.raises(InvalidStateError, match=message):
        getattr(wf, verb)()
    session.commit()  # nothing half-done may be waiting to be committed

    assert _snapshot(session, wf) == before


# -- while a step runs ---------------------------------------------------------------------


def test_pausing_a_performing_workflow_keeps_the_running_steps_result(session):
    wf = _start(session, VerbPausedWhileRunning)

    perform_next_step(wf)

    assert history(session, wf) == [
        ("first", "completed", "success"),
        ("second", "scheduled", None),
    ]
    session.commit()
    assert [a.note for a in session.query(AuditEntry)] == ["first done"]


def test_pausing_a_performing_workflow_leaves_it_paused_with_the_next_execution_kept(
    session, clock
):
    wf = _start(session, VerbPausedWhileRunning)
    paused_at = clock.now()

    perform_next_step(wf)

    reload(session, wf)
    assert wf.state == "paused"
    assert wf.transitioned_at == paused_at
    assert wf.current_step_name is None
    speedrun(wf)  # a paused workflow does not move
    assert history(session, wf)[-1] == ("second", "scheduled", None)


def test_resuming_after_a_pause_during_a_step_runs_the_kept_next_execution(session):
    wf = _start(session, VerbPausedWhileRunning)
    perform_next_step(wf)
    kept = current(session, wf).id

    resumed = wf.resume()
    session.commit()
    speedrun(wf)

    assert resumed.id == kept
    assert history(session, wf) == [
        ("first", "completed", "success"),
        ("second", "completed", "success"),
    ]
    assert reload(session, wf).state == "finished"


def test_pausing_a_performing_workflow_on_its_last_step_lets_it_finish(session):
    wf = _start(session, VerbPausedWhileRunningLast)

    perform_next_step(wf)

    assert history(session, wf) == [("only", "completed", "success")]
    assert reload(session, wf).state == "finished"


def test_canceling_a_performing_workflow_keeps_the_running_steps_result_and_stops(session):
    wf = _start(session, VerbCanceledWhileRunning)

    perform_next_step(wf)

    assert history(session, wf) == [("first", "completed", "success")]
    session.commit()
    assert [a.note for a in session.query(AuditEntry)] == ["first done"]
    assert reload(session, wf).state == "canceled"


def test_canceling_a_performing_workflow_whose_step_then_fails_records_the_failure(session):
    wf = _start(session, VerbCanceledWhileFailing)
    execution_id = current(session, wf).id

    with pytest.raises(RuntimeError, match="failed after the cancel"):
        run_execution(execution_id, reraise=True)

    assert history(session, wf) == [("first", "failed", "canceled")]
    assert executions(session, wf)[0].error_message == "failed after the cancel"
    assert reload(session, wf).state == "canceled"


def test_pausing_and_resuming_during_a_step_lets_the_workflow_continue(session):
    wf = _start(session, VerbPausedAndResumedWhileRunning)

    perform_next_step(wf)

    assert history(session, wf) == [
        ("first", "completed", "success"),
        ("second", "scheduled", None),
    ]
    reload(session, wf)
    assert wf.state == "ready"
    assert wf.transitioned_at is None


def test_skip_is_refused_on_a_performing_workflow(session):
    wf = _start(session, VerbSkipWhileRunning)

    perform_next_step(wf)

    session.commit()
    [note] = [a.note for a in session.query(AuditEntry)]
    assert "cannot skip a performing workflow" in note
    assert history(session, wf) == [
        ("first", "completed", "success"),
        ("second", "scheduled", None),
    ]

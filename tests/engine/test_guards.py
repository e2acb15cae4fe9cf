"""Guards that stop an execution before its body: duplicates, missing steps, workflow state."""

from __future__ import annotations

import pytest

from geneva_drive import StepNotDefinedError, Workflow, step
from geneva_drive.engine.executor import run_execution
from tests.engine._support import current, executions, history, reload
from tests.support.app import AuditEntry, Order


class GuardCountsRuns(Workflow):
    @step
    def first(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="ran"))

    @step
    def second(self) -> None:
        pass


def _start(session, cls=GuardCountsRuns):
    order = Order()
    session.add(order)
    wf = cls.create(session, hero=order)
    session.commit()
    return wf


def _audit_count(session) -> int:
    session.commit()
    return session.query(AuditEntry).count()


def test_running_the_same_execution_twice_runs_the_body_once(session):
    wf = _start(session)
    execution_id = current(session, wf).id

    run_execution(execution_id)
    second = run_execution(execution_id)

    assert second is None
    assert _audit_count(session) == 1
    assert history(session, wf) == [
        ("first", "completed", "success"),
        ("second", "scheduled", None),
    ]


def test_a_duplicate_run_does_not_touch_the_execution_row(session):
    wf = _start(session)
    execution_id = current(session, wf).id
    run_execution(execution_id)
    before = executions(session, wf)[0].updated_at

    run_execution(execution_id)

    assert executions(session, wf)[0].updated_at == before


def test_running_an_unknown_execution_id_does_nothing(session):
    assert run_execution(987654) is None


def test_an_execution_whose_step_is_not_defined_fails_and_pauses_the_workflow(session, clock):
    wf = _start(session)
    execution = current(session, wf)
    execution.step_name = "vanished"
    session.commit()
    clock.advance(seconds=6)

    with pytest.raises(StepNotDefinedError) as raised:
        run_execution(execution.id, reraise=True)

    assert "Step 'vanished' is not defined in GuardCountsRuns" in str(raised.value)
    assert raised.value.step_execution.id == execution.id
    assert raised.value.workflow.id == wf.id
    assert history(session, wf) == [("vanished", "failed", "failed")]
    [row] = executions(session, wf)
    assert row.error_message == "Step 'vanished' is not defined in GuardCountsRuns"
    assert row.failed_at == clock.now()
    reload(session, wf)
    assert wf.state == "paused"
    assert wf.transitioned_at == clock.now()


def test_a_missing_step_definition_does_not_raise_without_reraise(session):
    wf = _start(session)
    execution = current(session, wf)
    execution.step_name = "vanished"
    session.commit()

    assert run_execution(execution.id, reraise=False) is None
    assert reload(session, wf).state == "paused"


def test_a_paused_workflows_scheduled_execution_is_kept_when_it_is_run(session):
    wf = _start(session)
    execution_id = current(session, wf).id
    wf.pause()
    session.commit()

    assert run_execution(execution_id) is None

    assert _audit_count(session) == 0
    assert history(session, wf) == [("first", "scheduled", None)]
    assert reload(session, wf).state == "paused"


def test_the_kept_execution_runs_after_resume(session):
    wf = _start(session)
    execution_id = current(session, wf).id
    wf.pause()
    session.commit()
    run_execution(execution_id)
    reload(session, wf)

    resumed = wf.resume()
    session.commit()
    run_execution(execution_id)

    assert resumed.id == execution_id
    assert _audit_count(session) == 1
    assert history(session, wf)[0] == ("first", "completed", "success")


@pytest.mark.parametrize("state", ["finished", "canceled"])
def test_an_execution_of_a_terminal_workflow_is_canceled_without_running(session, clock, state):
    wf = _start(session)
    execution_id = current(session, wf).id
    wf.state = state  # as if an out-of-band edit ended the workflow but left the row
    session.commit()
    clock.advance(seconds=8)

    run_execution(execution_id)

    assert _audit_count(session) == 0
    assert history(session, wf) == [("first", "canceled", "canceled")]
    [row] = executions(session, wf)
    assert row.canceled_at == clock.now()
    assert row.finished_at == clock.now()
    assert reload(session, wf).state == state

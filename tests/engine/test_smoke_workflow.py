"""The shortest path through the engine: create, run every step, finish."""

from __future__ import annotations

from geneva_drive import Workflow, step
from geneva_drive.testing import assert_workflow_state, speedrun
from tests.support.app import Order


class SmokeTwoSteps(Workflow):
    @step
    def first(self) -> None:
        self.hero.counter += 1

    @step(wait=60)
    def second(self) -> None:
        self.hero.counter += 10


def test_a_two_step_workflow_runs_to_finished_and_commits_each_steps_writes(session):
    order = Order()
    session.add(order)
    wf = SmokeTwoSteps.create(session, hero=order)
    session.commit()

    speedrun(wf)

    assert_workflow_state(wf, "finished")
    session.refresh(order)
    assert order.counter == 11
    assert [(e.step_name, e.state, e.outcome) for e in wf.execution_history] == [
        ("first", "completed", "success"),
        ("second", "completed", "success"),
    ]

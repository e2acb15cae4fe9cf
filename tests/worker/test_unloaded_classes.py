"""A worker claims only rows of the classes it has loaded, and says what it leaves alone.

A row of a workflow class the worker has not imported would load as the base ``Workflow``: a
hero-less one was canceled (final), one with a hero paused. Those rows are for a worker that
has the code; this one must leave them exactly as they are.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from sqlalchemy import text

from geneva_drive import Workflow, step
from geneva_drive.runtime import loaded
from geneva_drive.runtime.loaded import NoWorkflowsLoaded, claim_scope
from geneva_drive.runtime.worker import Worker
from geneva_drive.storage.db import session_factory
from geneva_drive.storage.queries import next_claimable_due_time
from tests.support.app import Order
from tests.worker._support import finished, trail, wait_until_true
from tests.worker.apps import WorkerScaleThreeSteps


class UnloadedHeroStep(Workflow):
    @step
    def only(self) -> None:
        pass


def _retype(session: Any, workflow: Workflow, column: str, value: str) -> None:
    """Make a row look as if written by code this process does not have."""
    session.execute(
        text(f"UPDATE geneva_drive_workflows SET {column} = :value WHERE id = :id"),
        {"value": value, "id": workflow.id},
    )
    session.commit()
    session.expunge(workflow)  # it no longer loads as its class; keep the instance's id


def _state(session: Any, workflow: Workflow) -> str:
    # By id in plain SQL: the retyped row no longer loads as its old class.
    query = text("SELECT state FROM geneva_drive_workflows WHERE id = :id")
    return str(session.execute(query, {"id": workflow.id}).scalar_one())


def _run_until_idle(gd: Any) -> Worker:
    worker = Worker(config=gd, concurrency=1, poll_interval=0.05)
    worker.run(until=lambda: True, install_signals=False)
    return worker


def _warnings(caplog: Any) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "geneva_drive.worker" and r.levelno == logging.WARNING
    ]


def test_a_worker_leaves_a_hero_less_row_of_an_unloaded_class_scheduled_and_says_so(
    gd, session, caplog
):
    gone = WorkerScaleThreeSteps.create(session)
    session.commit()
    _retype(session, gone, "type", "VanishedInvoicing")
    mine = WorkerScaleThreeSteps.create(session)
    session.commit()

    with caplog.at_level(logging.WARNING, logger="geneva_drive.worker"):
        worker = _run_until_idle(gd)

    assert worker.steps_run == 3  # its own workflow ran through
    assert finished(gd, mine.id)()
    # Untouched: not canceled (what a base-class load of a hero-less row did), still due.
    assert trail(session, gone) == [("one", "scheduled", None)]
    assert _state(session, gone) == "ready"
    (warning,) = [w for w in _warnings(caplog) if "VanishedInvoicing" in w]
    assert "leaving 1 scheduled step(s) of workflow_type 'VanishedInvoicing' alone" in warning
    assert "--app" in warning
    assert "workflow_type = 'VanishedInvoicing'" in warning


def test_a_worker_leaves_a_row_whose_hero_class_it_has_not_loaded_scheduled(gd, session, caplog):
    order = Order()
    session.add(order)
    session.flush()
    wf = UnloadedHeroStep.create(session, hero=order)
    session.commit()
    _retype(session, wf, "hero_type", "UnloadedOrder")

    with caplog.at_level(logging.WARNING, logger="geneva_drive.worker"):
        worker = _run_until_idle(gd)

    assert worker.steps_run == 0
    assert trail(session, wf) == [("only", "scheduled", None)]  # not paused
    assert _state(session, wf) == "ready"
    (warning,) = [w for w in _warnings(caplog) if "UnloadedOrder" in w]
    assert "workflow_type 'UnloadedHeroStep'" in warning
    assert "hero_type 'UnloadedOrder' names no mapped class" in warning
    assert "--app" in warning


def test_a_row_of_a_renamed_class_names_workflow_type_and_the_likely_new_name(gd, session, caplog):
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()
    _retype(session, wf, "type", "WorkerScaleThreeStep")  # the class's name before a rename

    with caplog.at_level(logging.WARNING, logger="geneva_drive.worker"):
        _run_until_idle(gd)

    (warning,) = [w for w in _warnings(caplog) if "'WorkerScaleThreeStep'" in w]
    assert "set workflow_type = 'WorkerScaleThreeStep' on it" in warning
    assert "(renamed to WorkerScaleThreeSteps?)" in warning


def test_each_unloaded_class_is_reported_once_however_often_the_worker_looks(gd, session, caplog):
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()
    _retype(session, wf, "type", "VanishedTwice")
    worker = Worker(config=gd, concurrency=1)

    with caplog.at_level(logging.WARNING, logger="geneva_drive.worker"):
        worker._survey(force=True)
        worker._survey(force=True)

    assert len([w for w in _warnings(caplog) if "VanishedTwice" in w]) == 1


def test_the_idle_timer_ignores_due_rows_the_worker_will_not_claim(gd, session, clock):
    # Otherwise an idle worker times its sleep on a row that is due now and spins.
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()
    _retype(session, wf, "type", "VanishedTimer")

    with session_factory(gd)() as s, s.begin():
        assert next_claimable_due_time(s) == clock.now()  # every class: it is due
        assert next_claimable_due_time(s, claim_scope(None)) is None


def test_a_worker_refuses_to_start_when_no_workflow_class_is_loaded(gd, monkeypatch):
    monkeypatch.setattr(loaded, "loaded_workflow_types", lambda: [])
    worker = Worker(config=gd, concurrency=1)

    with pytest.raises(NoWorkflowsLoaded, match=r"^no workflows loaded; pass --app"):
        worker.run(until=lambda: True, install_signals=False)

    assert worker.steps_run == 0


def _define_workflow_class(name: str) -> type[Workflow]:
    def only(self: Workflow) -> None:
        pass

    namespace = {"may_proceed_without_hero": True, "only": step(only), "__module__": __name__}
    return type(name, (Workflow,), namespace)


def test_a_workflow_class_defined_after_the_worker_started_is_claimed(gd, session, db_backend):
    worker = Worker(config=gd, concurrency=1, poll_interval=0.05)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    name = f"DefinedLater{db_backend.capitalize()}"  # one class per backend: no redefinition
    try:
        wait_until_true(lambda: worker.idle_waits > 0, "the worker to go idle")
        assert name not in worker.scope.workflow_types

        wf = _define_workflow_class(name).create(session)
        session.commit()
        wait_until_true(finished(gd, wf.id), "the late class's workflow to finish")
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert name in worker.scope.workflow_types

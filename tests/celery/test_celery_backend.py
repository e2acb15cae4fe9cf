"""The Celery backend in this process: what is sent to the broker, when, and what the dispatcher
sends later. Messages are read back from the real Redis server; no worker runs here, and the
clock is frozen. Runs on every database backend (the dispatcher's queries are in
queries/dispatch.py).
"""

from __future__ import annotations

import base64
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, ClassVar

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive import StepConfigurationError, StepExecution, Workflow, step
from tests.celery.support import REPO
from tests.support.app import AuditEntry, Order

ROUTED_QUEUE = "gd-celery-routed"


class CeleryRoutedOnce(Workflow):
    job_options = {"queue": ROUTED_QUEUE, "priority": 3}

    @step(job_options={"expires": 600})
    def only(self) -> None:
        pass


class CeleryGatedStep(Workflow):
    """Blocks in its body until the test opens the gate."""

    gate: ClassVar[threading.Event] = threading.Event()
    entered: ClassVar[threading.Event] = threading.Event()

    @step
    def held(self) -> None:
        type(self).entered.set()
        assert type(self).gate.wait(60), "the test never opened the gate"


class CeleryDiesMidStep(Workflow):
    """Its first run dies in the body, like a SIGKILLed worker process (phase 1 committed)."""

    @step
    def fragile(self) -> None:
        if len(self.execution_history) == 1:
            raise CeleryProcessDied


class CeleryProcessDied(BaseException):
    pass


class CeleryRefusingBackend:
    """A backend whose broker is down: every send raises."""

    def __init__(self) -> None:
        self.refused: list[int] = []

    def enqueue(self, step: Any) -> None:
        self.refused.append(step.execution_id)
        raise ConnectionError("broker unreachable")


def messages(redis_server: Any, queue: str) -> list[dict[str, Any]]:
    """Messages waiting in ``queue`` (all its priority lists), oldest first, decoded."""
    found = []
    with redis_server.client() as client:
        for key in sorted(client.keys(queue.encode() + b"*")):
            if client.type(key) != b"list":
                continue
            for raw in reversed(client.lrange(key, 0, -1)):  # LPUSHed: newest first
                message = json.loads(raw)
                message["args"] = json.loads(base64.b64decode(message["body"]))[0]
                found.append(message)
    return found


def executions(session: Session, workflow: Workflow) -> list[StepExecution]:
    session.commit()  # end the read transaction: SQLite would keep showing its snapshot
    session.expire_all()
    return list(
        session.scalars(
            select(StepExecution)
            .where(StepExecution.workflow_id == workflow.id)
            .order_by(StepExecution.id)
        )
    )


def create(session: Session, cls: type[Workflow]) -> Workflow:
    order = Order()
    session.add(order)
    session.flush()
    workflow = cls.create(session, hero=order)
    session.commit()
    return workflow


@pytest.fixture
def session(celery_gd: Any) -> Any:
    with Session(celery_gd.engine, expire_on_commit=False) as s:
        yield s


@pytest.fixture
def app(celery_app_module: Any) -> Any:
    return celery_app_module


# -- sending --------------------------------------------------------------------------------


def test_a_step_due_now_is_sent_after_commit_and_its_task_id_recorded(session, broker, app):
    order = Order()
    session.add(order)
    session.flush()
    workflow = app.CeleryOnce.create(session, hero=order)
    assert messages(broker, app.DEFAULT_QUEUE) == []  # not before the commit
    session.commit()

    [message] = messages(broker, app.DEFAULT_QUEUE)
    [execution] = executions(session, workflow)
    assert message["headers"]["task"] == "geneva_drive.perform_step"
    assert message["args"] == [execution.id]
    assert message["headers"]["eta"] is None
    assert execution.job_id == message["headers"]["id"]


def test_a_rolled_back_workflow_sends_nothing(session, broker, app):
    order = Order()
    session.add(order)
    session.flush()
    app.CeleryOnce.create(session, hero=order)
    session.rollback()

    assert messages(broker, app.DEFAULT_QUEUE) == []


def test_a_wait_within_the_horizon_rides_on_an_eta_message(session, broker, app):
    workflow = create(session, app.CeleryTrip)

    [message] = messages(broker, app.DEFAULT_QUEUE)
    [execution] = executions(session, workflow)
    assert datetime.fromisoformat(message["headers"]["eta"]) == execution.scheduled_for
    assert execution.job_id == message["headers"]["id"]


def test_job_options_set_the_queue_the_priority_and_other_celery_options(session, broker, app):
    workflow = create(session, CeleryRoutedOnce)

    [message] = messages(broker, ROUTED_QUEUE)
    [execution] = executions(session, workflow)
    assert message["args"] == [execution.id]
    assert message["properties"]["priority"] == 3
    assert message["headers"]["expires"] is not None
    assert messages(broker, app.DEFAULT_QUEUE) == []


def test_a_wait_beyond_the_horizon_is_sent_by_the_dispatcher_once_it_comes_within(
    session, broker, app, clock
):
    from geneva_drive.contrib.celery import dispatch

    workflow = create(session, app.CeleryLongNap)
    [execution] = executions(session, workflow)
    assert messages(broker, app.DEFAULT_QUEUE) == []
    assert execution.job_id is None
    assert dispatch() == 0  # still beyond the horizon

    clock.advance(app.LONG_WAIT - app.ETA_HORIZON)
    assert dispatch() == 1
    [message] = messages(broker, app.DEFAULT_QUEUE)
    assert datetime.fromisoformat(message["headers"]["eta"]) == execution.scheduled_for
    assert executions(session, workflow)[0].job_id == message["headers"]["id"]
    assert dispatch() == 0  # sent: not sent again on the next pass


def test_a_lost_message_is_sent_again_once_resend_after_has_passed_and_not_before(
    session, broker, app, clock
):
    from geneva_drive.contrib.celery import dispatch

    workflow = create(session, app.CeleryOnce)
    first_id = executions(session, workflow)[0].job_id

    clock.advance(app.backend.resend_after - timedelta(seconds=1))
    assert dispatch() == 0
    clock.advance(seconds=1)
    assert dispatch() == 1
    assert dispatch() == 0

    sent = messages(broker, app.DEFAULT_QUEUE)
    [execution] = executions(session, workflow)
    assert [m["headers"]["id"] for m in sent] == [first_id, execution.job_id]
    assert execution.job_id != first_id


def test_a_message_that_stays_overdue_is_sent_again_after_backing_off(session, broker, app, clock):
    from geneva_drive.contrib.celery import dispatch

    workflow = create(session, app.CeleryOnce)  # sent now, and no worker ever runs it
    resend_after = app.backend.resend_after
    passes = []
    for _ in range(16):  # a pass every resend_after / 2, for 8 × resend_after
        clock.advance(resend_after / 2)
        passes.append(dispatch())

    # Sent again after 1, 2, 4 and 8 × resend_after overdue, not on every resend_after.
    assert [i for i, sent in enumerate(passes, start=1) if sent] == [2, 4, 8, 16]
    assert len(messages(broker, app.DEFAULT_QUEUE)) == 5
    [execution] = executions(session, workflow)
    assert execution.job_id == messages(broker, app.DEFAULT_QUEUE)[-1]["headers"]["id"]


def test_the_resend_interval_stops_growing_at_an_hour(app):
    from geneva_drive.contrib.celery import MAX_RESEND_INTERVAL

    due = datetime(2026, 1, 1)
    assert app.backend.next_resend_at(due, due + timedelta(days=2)) == (
        due + timedelta(days=2) + MAX_RESEND_INTERVAL
    )


def test_a_failed_send_leaves_the_row_unsent_and_the_next_dispatch_sends_it(
    celery_gd, session, broker, app
):
    from geneva_drive.contrib.celery import dispatch
    from geneva_drive.runtime.configure import configured

    refusing = CeleryRefusingBackend()
    with configured(backend=refusing):
        workflow = create(session, app.CeleryOnce)
    [execution] = executions(session, workflow)
    assert refusing.refused == [execution.id]
    assert execution.job_id is None

    assert dispatch() == 1
    [message] = messages(broker, app.DEFAULT_QUEUE)
    assert message["args"] == [execution.id]


def test_the_dispatcher_leaves_a_paused_workflow_alone_and_resume_sends_it(
    session, broker, app, clock
):
    from geneva_drive.contrib.celery import dispatch

    workflow = create(session, app.CeleryLongNap)
    workflow.pause()
    session.commit()
    clock.advance(app.LONG_WAIT)
    assert dispatch() == 0
    assert messages(broker, app.DEFAULT_QUEUE) == []

    workflow.resume()
    session.commit()
    [message] = messages(broker, app.DEFAULT_QUEUE)
    assert message["args"] == [executions(session, workflow)[0].id]


def test_dispatch_sends_in_batches_until_nothing_is_left(celery_gd, session, broker, app):
    from geneva_drive.contrib.celery import dispatch
    from geneva_drive.runtime.configure import configured

    with configured(backend=CeleryRefusingBackend()):
        workflows = [create(session, app.CeleryOnce) for _ in range(5)]
    assert dispatch(replace(celery_gd, housekeeping_batch_size=2)) == 5
    sent = sorted(m["args"][0] for m in messages(broker, app.DEFAULT_QUEUE))
    assert sent == sorted(executions(session, w)[0].id for w in workflows)


def test_dispatch_without_a_celery_backend_says_how_to_configure_one(celery_gd):
    from geneva_drive import DatabaseBackend
    from geneva_drive.contrib.celery import dispatch

    with pytest.raises(StepConfigurationError, match=r"not a CeleryBackend; configure\(backend="):
        dispatch(replace(celery_gd, backend=DatabaseBackend()))


def test_the_backend_rejects_what_is_not_a_celery_app_or_a_positive_horizon(app):
    from geneva_drive.contrib.celery import CeleryBackend

    with pytest.raises(StepConfigurationError, match=r"expected a celery\.Celery application"):
        CeleryBackend("shop")
    with pytest.raises(StepConfigurationError, match=r"eta_horizon=.*positive timedelta"):
        CeleryBackend(app.app, eta_horizon=timedelta(0))
    with pytest.raises(StepConfigurationError, match=r"lease=.*positive timedelta"):
        CeleryBackend(app.app, lease=timedelta(seconds=-1))


# -- receiving (the task's body, called here directly) ----------------------------------------


def test_perform_step_runs_a_due_execution_once_and_then_reports_it_not_scheduled(
    session, broker, app
):
    from geneva_drive.contrib.celery import perform_step

    workflow = create(session, app.CeleryOnce)
    [execution] = executions(session, workflow)

    assert perform_step(execution.id) == "performed"
    assert perform_step(execution.id) == "not scheduled"
    session.commit()
    notes = session.scalars(select(AuditEntry.note)).all()
    assert notes == [f"{workflow.id}:only"]


def test_a_message_for_an_execution_that_no_longer_exists_is_logged_and_dropped(celery_gd, caplog):
    from geneva_drive.contrib.celery import perform_step

    with caplog.at_level(logging.WARNING, logger="geneva_drive.celery"):
        assert perform_step(987654) == "missing"
    assert "perform_step(987654): no such step execution" in caplog.text


def test_an_early_message_does_not_run_the_step_and_leaves_it_to_the_dispatcher(
    session, broker, app, clock
):
    from geneva_drive.contrib.celery import dispatch, perform_step

    workflow = create(session, app.CeleryLongNap)
    [execution] = executions(session, workflow)

    assert perform_step(execution.id) == "early"
    [execution] = executions(session, workflow)
    assert (execution.state, execution.job_id) == ("scheduled", None)
    clock.advance(app.LONG_WAIT)
    assert dispatch() == 1


def test_a_message_less_than_a_second_early_does_not_run_the_step_and_is_sent_again_with_its_eta(
    session, broker, app
):
    from geneva_drive.contrib.celery import perform_step

    workflow = create(session, app.CeleryTrip)  # `pack` waits 300 ms: an ETA message
    [execution] = executions(session, workflow)
    first = execution.job_id

    assert perform_step(execution.id) == "early"  # delivered 300 ms before its time

    [execution] = executions(session, workflow)
    assert execution.state == "scheduled"
    [_, again] = messages(broker, app.DEFAULT_QUEUE)
    assert datetime.fromisoformat(again["headers"]["eta"]) == execution.scheduled_for
    assert execution.job_id == again["headers"]["id"] != first
    session.commit()
    assert session.scalars(select(AuditEntry.note)).all() == []


# -- leases: a Celery worker process heartbeats the steps its tasks run -----------------------


@contextmanager
def performing_gated_step(session: Session) -> Iterator[Workflow]:
    """The Celery task runs a step on a thread; it blocks until the block is left."""
    from geneva_drive.contrib.celery import perform_step

    gate = CeleryGatedStep.gate = threading.Event()
    entered = CeleryGatedStep.entered = threading.Event()
    workflow = create(session, CeleryGatedStep)
    [execution] = executions(session, workflow)
    thread = threading.Thread(target=perform_step, args=(execution.id,))
    thread.start()
    try:
        assert entered.wait(60)
        yield workflow
    finally:
        gate.set()
        thread.join(60)


def test_a_step_run_by_the_celery_task_holds_a_lease_its_process_heartbeat_renews(
    celery_gd, session, broker, app, clock
):
    process = app.backend.process_leases(celery_gd)

    with performing_gated_step(session) as workflow:
        [running] = executions(session, workflow)
        assert running.state == "in_progress"
        assert running.lease_owner == process.owner
        assert running.lease_expires_at == clock.now() + app.backend.lease
        clock.advance(app.backend.lease / 2)
        assert process.heartbeat() == 1
        [running] = executions(session, workflow)
        assert running.lease_expires_at == clock.now() + app.backend.lease

    assert [(e.state, e.lease_owner) for e in executions(session, workflow)] == [
        ("completed", None)
    ]
    assert process.heartbeat() == 0  # nothing running any more


def test_a_row_the_celery_process_no_longer_runs_expires_and_a_dispatch_pass_recovers_it(
    celery_gd, session, broker, app, clock
):
    from geneva_drive.contrib.celery import dispatch, perform_step

    process = app.backend.process_leases(celery_gd)
    workflow = create(session, CeleryDiesMidStep)
    [died] = executions(session, workflow)
    with pytest.raises(CeleryProcessDied):
        perform_step(died.id)  # the step dies; its row stays in progress under our lease
    assert executions(session, workflow)[0].state == "in_progress"

    with performing_gated_step(session):  # the process lives on and runs other steps
        clock.advance(app.backend.lease / 2)
        assert process.heartbeat() == 1  # the gated step's lease, not the dead one's
        assert dispatch() == 0
        assert executions(session, workflow)[0].state == "in_progress"
        clock.advance(app.backend.lease / 2 + timedelta(microseconds=1))
        dispatch()

    assert [(e.state, e.outcome) for e in executions(session, workflow)] == [
        ("completed", "recovered"),
        ("scheduled", None),
    ]
    retry = executions(session, workflow)[1]
    assert [m["args"] for m in messages(broker, app.DEFAULT_QUEUE)][-1] == [retry.id]


def test_importing_the_celery_backend_without_celery_names_the_extra_to_install():
    code = (
        "import sys; sys.modules['celery'] = None\n"  # what Python does for a missing package
        "import geneva_drive.contrib.celery\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "pip install 'geneva-drive[celery]'" in result.stderr

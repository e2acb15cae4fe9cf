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
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

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


def test_a_failed_send_leaves_the_row_unsent_and_the_next_dispatch_sends_it(
    celery_gd, session, broker, app
):
    from geneva_drive.config import configured
    from geneva_drive.contrib.celery import dispatch

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
    from geneva_drive.config import configured
    from geneva_drive.contrib.celery import dispatch

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

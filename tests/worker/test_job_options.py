"""Job options (gem-spec B.5): the database worker honours queue and priority; every other
key is handed to the backend untouched, for external backends such as Celery."""

from __future__ import annotations

import pytest

from geneva_drive import StepConfigurationError, Workflow, step
from geneva_drive.engine.executor import claim_and_run
from geneva_drive.runtime.configure import configured
from geneva_drive.runtime.worker import Worker
from geneva_drive.storage.queries.claims import ClaimScope
from tests.engine._support import RecordingBackend
from tests.worker._support import trail


class JobOptionsPassThrough(Workflow):
    may_proceed_without_hero = True
    job_options = {"queue": "reports", "expires": 600}

    @step(job_options={"priority": 3, "time_limit": 30})
    def build(self) -> None:
        pass


def test_keys_other_than_queue_and_priority_reach_the_backend_unchanged(gd, session):
    backend = RecordingBackend()
    with configured(backend=backend):
        JobOptionsPassThrough.create(session, step_job_options={"routing_key": "r.1"})
        session.commit()

    (enqueued,) = backend.enqueued
    assert enqueued.job_options == {
        "queue": "reports",
        "expires": 600,
        "routing_key": "r.1",
        "priority": 3,
        "time_limit": 30,
    }


class JobOptionsRouted(Workflow):
    may_proceed_without_hero = True
    job_options = {"queue": "reports"}

    @step(job_options={"priority": 3})
    def build(self) -> None:
        pass


def test_the_database_worker_refuses_keys_it_would_ignore(gd, session):
    # Before: accepted and silently ignored (issue 14 item 15).
    with pytest.raises(
        StepConfigurationError,
        match=r"JobOptionsPassThrough\.job_options: job option 'expires' is not understood by "
        r"the configured backend DatabaseBackend, which accepts: priority, queue",
    ):
        JobOptionsPassThrough.create(session)


def test_the_database_worker_routes_by_queue_and_priority(gd, session):
    wf = JobOptionsRouted.create(session)
    session.commit()
    execution = wf.current_execution
    assert (execution.queue, execution.priority) == ("reports", 3)

    assert claim_and_run(ClaimScope.on_queues(["default"]), Worker(config=gd).options, gd) is False
    assert claim_and_run(ClaimScope.on_queues(["reports"]), Worker(config=gd).options, gd) is True
    assert trail(session, wf) == [("build", "completed", "success")]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"wait": 5},
            r"cannot set wait; geneva-drive schedules steps itself — use the step's wait=",
        ),
        ({"wait_until": 5}, r"cannot set wait_until"),
        ({"queue": ""}, r"queue= must be a non-empty str, got ''"),
        ({"priority": True}, r"priority= must be an int, got True"),
        ({1: "x"}, r"keys must be str, got 1"),
    ],
)
def test_invalid_job_options_are_refused_naming_the_step(options, message):
    with pytest.raises(StepConfigurationError, match=rf"JobOptionsRefused\.step 'go'.*{message}"):

        class JobOptionsRefused(Workflow):
            @step(job_options=options)
            def go(self) -> None:
                pass

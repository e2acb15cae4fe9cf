"""Workflows run by real Celery worker processes over a real Redis broker, on PostgreSQL.

Each test starts its own ``celery worker`` (prefork, two pool processes) on a fresh database;
time is real here, so the waits are fractions of a second and the test waits for conditions
in the database (or for a line of the worker's output) with a deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive import StepExecution, Workflow
from tests.celery.support import REPO, wait_until
from tests.support.app import AuditEntry, Order

pytestmark = pytest.mark.postgres


class CeleryBlackHoleOnce:
    """Sends the first wake-up to a queue no worker reads: a message the broker lost."""

    def __init__(self, inner: Any, queue: str) -> None:
        self.inner = inner
        self.queue = queue
        self.dropped: list[int] = []

    def enqueue(self, step: Any) -> None:
        if not self.dropped:
            self.dropped.append(step.execution_id)
            step = replace(step, job_options={**step.job_options, "queue": self.queue})
        self.inner.enqueue(step)


class CeleryTwice:
    """Sends every wake-up twice: a duplicated message."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def enqueue(self, step: Any) -> None:
        self.inner.enqueue(step)
        self.inner.enqueue(step)


class CeleryNeverSends:
    def enqueue(self, step: Any) -> None:
        pass


@pytest.fixture
def session(pg_celery_gd: Any) -> Any:
    with Session(pg_celery_gd.engine, expire_on_commit=False) as s:
        yield s


@pytest.fixture
def app(celery_app_module: Any) -> Any:
    return celery_app_module


def create(session: Session, cls: type[Workflow]) -> Workflow:
    order = Order()
    session.add(order)
    session.flush()
    workflow = cls.create(session, hero=order)
    session.commit()
    return workflow


def states(session: Session, workflows: list[Workflow]) -> dict[int, str]:
    session.commit()
    session.expire_all()
    return {w.id: session.get(Workflow, w.id).state for w in workflows}


def all_finished(session: Session, workflows: list[Workflow]) -> bool:
    return set(states(session, workflows).values()) == {"finished"}


def notes(session: Session) -> Counter[str]:
    session.commit()
    return Counter(session.scalars(select(AuditEntry.note)))


def executions(session: Session, workflow: Workflow) -> list[StepExecution]:
    session.commit()
    session.expire_all()
    return list(
        session.scalars(
            select(StepExecution)
            .where(StepExecution.workflow_id == workflow.id)
            .order_by(StepExecution.id)
        )
    )


def test_many_workflows_with_waits_reattempts_a_signal_and_a_resumable_step_all_finish(
    session, app, start_worker
):
    from geneva_drive.contrib.celery import dispatch

    worker = start_worker()
    trips = [create(session, app.CeleryTrip) for _ in range(6)]
    approvals = [create(session, app.CeleryApproval) for _ in range(3)]
    batches = [create(session, app.CeleryBatch) for _ in range(2)]
    naps = [create(session, app.CeleryLongNap) for _ in range(2)]
    everything = trips + approvals + batches + naps

    def parked(workflow: Workflow) -> bool:
        return [e.state for e in executions(session, workflow)] == ["waiting"]

    wait_until(lambda: all(parked(w) for w in approvals), describe=worker.output.text)
    for approval in approvals:
        session.get(Workflow, approval.id).signal("approved", payload={"by": "alice"})
    session.commit()
    # The naps' wait is beyond the ETA horizon: they reach the worker through the dispatcher.
    wait_until(
        lambda: all_finished(session, everything),
        on_poll=dispatch,
        describe=lambda: f"{states(session, everything)}\n{worker.output.text()[-3000:]}",
    )

    expected: Counter[str] = Counter()
    for trip in trips:
        expected.update(f"{trip.id}:{n}" for n in ("pack", "book", "notify"))
    expected.update(f"{a.id}:approve:alice" for a in approvals)
    expected.update(f"{b.id}:walk:{i}" for b in batches for i in range(5))
    expected.update(f"{n.id}:wake" for n in naps)
    assert notes(session) == expected  # every step body's work landed exactly once
    for trip in trips:
        book = [(e.state, e.outcome) for e in executions(session, trip) if e.step_name == "book"]
        assert book == [("completed", "reattempted"), ("completed", "success")]
    for batch in batches:
        walks = [e.outcome for e in executions(session, batch)]
        assert walks == ["continued", "continued", "success"]
    ran = [e for w in everything for e in executions(session, w)]
    assert all(e.job_id and e.job_id.startswith("geneva-drive-") for e in ran)


def test_a_duplicated_message_runs_the_step_once(session, app, start_worker, pg_celery_gd):
    from geneva_drive.runtime.configure import configured

    worker = start_worker()
    with configured(backend=CeleryTwice(app.backend)):
        workflow = create(session, app.CeleryOnce)

    worker.output.wait_for("nothing to run", "skipping duplicate")
    wait_until(lambda: all_finished(session, [workflow]), describe=worker.output.text)
    assert notes(session) == Counter({f"{workflow.id}:only": 1})
    assert [(e.step_name, e.outcome) for e in executions(session, workflow)] == [
        ("only", "success")
    ]


def test_duplicated_messages_for_many_workflows_never_cost_a_step_its_outcome(
    session, app, start_worker, pg_celery_gd
):
    # Both copies of a message often reach the two pool processes at once. The copy that
    # loses must skip the step without waiting for the execution's row: the winner's
    # completion holds it FOR SHARE while it waits for the workflow row the loser holds,
    # and the deadlock that closed rolled the outcome back (2 or 3 steps in 40 ran twice).
    from geneva_drive.runtime.configure import configured

    worker = start_worker()
    with configured(backend=CeleryTwice(app.backend)):
        workflows = [create(session, app.CeleryOnce) for _ in range(40)]

    wait_until(lambda: all_finished(session, workflows), describe=worker.output.text)
    assert notes(session) == Counter({f"{w.id}:only": 1 for w in workflows})
    outcomes = Counter(e.outcome for w in workflows for e in executions(session, w))
    assert outcomes == Counter({"success": 40})


def test_a_dropped_message_is_sent_again_by_the_dispatcher(
    session, app, start_worker, pg_celery_gd, broker
):
    from geneva_drive import FrozenClock
    from geneva_drive.contrib.celery import dispatch
    from geneva_drive.runtime.configure import configured

    worker = start_worker()
    black_hole = CeleryBlackHoleOnce(app.backend, app.BLACK_HOLE_QUEUE)
    with configured(backend=black_hole):
        workflow = create(session, app.CeleryOnce)
    with broker.client() as client:
        assert client.llen(app.BLACK_HOLE_QUEUE) == 1  # sent, and nobody will ever read it
    assert dispatch() == 0  # sent just now: not re-sent on every pass

    later = pg_celery_gd.clock.now() + app.backend.resend_after
    assert dispatch(replace(pg_celery_gd, clock=FrozenClock(later))) == 1
    wait_until(lambda: all_finished(session, [workflow]), describe=worker.output.text)
    assert notes(session) == Counter({f"{workflow.id}:only": 1})


def test_a_message_for_an_execution_that_no_longer_exists_is_logged_and_dropped(
    session, app, start_worker
):
    worker = start_worker()
    app.backend.task.apply_async(args=(987654,))
    line = worker.output.wait_for("perform_step(987654)")
    assert "no such step execution" in line

    workflow = create(session, app.CeleryOnce)  # the worker carries on
    wait_until(lambda: all_finished(session, [workflow]), describe=worker.output.text)
    assert "Traceback" not in worker.output.text()


def test_geneva_drive_dispatch_sends_what_was_never_sent(
    session, app, start_worker, pg_celery_url, broker
):
    from geneva_drive.runtime.configure import configured

    worker = start_worker()
    with configured(backend=CeleryNeverSends()):
        workflow = create(session, app.CeleryOnce)

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "geneva_drive.cli",
            "dispatch",
            "--database-url",
            pg_celery_url,
            "--app",
            "tests.celery.app_module:app",
            "--once",
        ],
        cwd=REPO,
        env={**os.environ, app.BROKER_ENV: broker.url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "dispatched 1"
    wait_until(lambda: all_finished(session, [workflow]), describe=worker.output.text)


def _pid_in(line: str) -> int:
    return int(line.rsplit("pid ", 1)[1].split()[0])


def test_a_killed_pool_process_s_step_is_recovered_within_lease_and_heartbeat(
    session, app, start_worker, pg_celery_gd
):
    from geneva_drive.contrib.celery import dispatch

    worker = start_worker()
    workflow = create(session, app.CeleryHangs)
    line = worker.output.wait_for("celery-hang: execution of workflow")
    os.kill(_pid_in(line), signal.SIGKILL)  # the pool child dies; Celery starts another one
    [hung] = executions(session, workflow)
    assert (hung.state, hung.lease_owner.startswith("celery:")) == ("in_progress", True)

    # Its lease runs out (no heartbeat from a dead process) and the dispatcher's pass
    # recovers it: within lease + one heartbeat interval, not stuck_in_progress_threshold.
    lease = app.LEASE.total_seconds()
    wait_until(
        lambda: executions(session, workflow)[0].state == "completed",
        on_poll=dispatch,
        timeout=lease + lease / 3 + 15,  # + slack for a loaded machine
        describe=worker.output.text,
    )
    wait_until(lambda: all_finished(session, [workflow]), describe=worker.output.text)
    assert [(e.state, e.outcome) for e in executions(session, workflow)] == [
        ("completed", "recovered"),
        ("completed", "success"),
    ]
    assert notes(session) == Counter({f"{workflow.id}:hang": 1})


def test_a_whole_worker_killed_mid_step_is_recovered_once_its_lease_runs_out(
    session, app, start_worker, pg_celery_gd
):
    from geneva_drive.contrib.celery import dispatch

    worker = start_worker()
    workflow = create(session, app.CeleryHangs)
    worker.output.wait_for("celery-hang: execution of workflow")
    worker.kill()  # main process and pool children: a machine dying

    lease = app.LEASE.total_seconds()
    wait_until(
        lambda: executions(session, workflow)[0].state == "completed",
        on_poll=dispatch,
        timeout=lease + lease / 3 + 15,
    )
    replacement = start_worker()
    wait_until(lambda: all_finished(session, [workflow]), describe=replacement.output.text)
    assert [(e.state, e.outcome) for e in executions(session, workflow)] == [
        ("completed", "recovered"),
        ("completed", "success"),
    ]
    assert notes(session) == Counter({f"{workflow.id}:hang": 1})


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_warm_shutdown_stops_a_resumable_step_at_its_next_checkpoint(
    session, app, start_worker, pool
):
    worker = start_worker(pool=pool)
    workflow = create(session, app.CeleryLongWalk)
    worker.output.wait_for("celery-walk: workflow")

    assert worker.warm_shutdown() == 0

    # A successor whose message the stopping worker still took stops at its first checkpoint.
    *walked, successor = executions(session, workflow)
    assert [(e.state, e.outcome) for e in walked] == [("completed", "continued")] * len(walked)
    cursor = walked[-1].cursor_value
    assert 2 <= cursor < app.WALK_ITEMS
    assert (successor.state, successor.cursor_value) == ("scheduled", cursor)
    assert successor.job_id is not None  # its message is out for the next worker
    assert notes(session) == Counter(f"{workflow.id}:walk:{i}" for i in range(cursor))
    print(f"{pool}: {len(walked)} execution(s) before the shutdown completed")

    replacement = start_worker(pool=pool)
    wait_until(lambda: all_finished(session, [workflow]), describe=replacement.output.text)
    assert notes(session) == Counter(f"{workflow.id}:walk:{i}" for i in range(app.WALK_ITEMS))


@pytest.mark.parametrize(("concurrency", "too_small"), [(16, True), (2, False)])
def test_a_threads_pool_larger_than_the_engine_s_pool_is_reported_at_its_first_task(
    session, app, start_worker, concurrency, too_small
):
    # The app module's engine keeps SQLAlchemy's default pool (5 + 10 overflow = 15): enough
    # for 2 task threads and the heartbeat, not for 16 of them.
    worker = start_worker(pool="threads", concurrency=concurrency)
    workflow = create(session, app.CeleryOnce)
    wait_until(lambda: all_finished(session, [workflow]), describe=worker.output.text)

    report = f"runs {concurrency} task(s) at once: the engine's pool hands out at most 15"
    assert (report in worker.output.text()) is too_small, worker.output.text()
    if too_small:
        assert "needs 18" in worker.output.text()
        assert "create_engine(url, pool_size=18)" in worker.output.text()


def test_an_async_step_runs_to_completion_inside_the_celery_task(session, app, start_worker):
    worker = start_worker()
    workflows = [create(session, app.CeleryAwaits) for _ in range(3)]

    wait_until(lambda: all_finished(session, workflows), describe=worker.output.text)

    expected = Counter(f"{w.id}:{n}" for w in workflows for n in ("call", "after"))
    assert notes(session) == expected  # the awaited body's writes committed with its outcome
    for workflow in workflows:
        assert [(e.step_name, e.outcome) for e in executions(session, workflow)] == [
            ("call", "success"),
            ("after", "success"),
        ]

"""Housekeeping (gem-spec F and our deltas): cleanup, recovery of lost steps, gauges."""

from __future__ import annotations

import gc
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, func, insert, select, update

from geneva_drive import Signal, StepExecution, Workflow, step
from geneva_drive.engine import recovery
from geneva_drive.runtime import housekeeping
from geneva_drive.runtime.configure import configured
from geneva_drive.testing import perform_next_step, speedrun
from tests.engine._support import RecordingBackend, executions
from tests.worker._support import crash_current_step, state_of, table_of, trail
from tests.worker.apps import (
    WorkerCrashable,
    WorkerCrashableResumable,
    WorkerWaitsForApproval,
)


class HousekeepingTwoSteps(Workflow):
    may_proceed_without_hero = True

    @step
    def first(self) -> None:
        pass

    @step
    def second(self) -> None:
        pass


class HousekeepingOtherClass(Workflow):
    may_proceed_without_hero = True

    @step
    def only(self) -> None:
        pass


@pytest.fixture(autouse=True)
def _reset_crashes():
    WorkerCrashable.crashes = 0
    WorkerCrashableResumable.crashes = 0
    WorkerCrashableResumable.seen = []
    yield


def _run(gd: Any, **kwargs: Any) -> dict[str, int]:
    return housekeeping.run(gd, **kwargs)


def _finished(session, cls=HousekeepingTwoSteps, signals: int = 0) -> Workflow:
    wf = cls.create(session, allow_multiple=True)
    session.commit()
    for n in range(signals):
        wf.signal("ping", idempotency_key=str(n), allow_unknown=True)  # rows to clean up
    session.commit()
    speedrun(wf)
    assert state_of(session, wf) == "finished"
    return wf


def _count(session, model, *where) -> int:
    session.commit()
    return session.execute(select(func.count()).select_from(model).where(*where)).scalar_one()


# -- F.1 cleanup ---------------------------------------------------------------------------


def test_cleanup_deletes_old_finished_and_canceled_workflows_with_their_executions_and_signals(
    gd, session, clock
):
    finished = _finished(session, signals=2)
    canceled = HousekeepingTwoSteps.create(session, allow_multiple=True)
    session.commit()
    canceled.cancel()
    session.commit()
    clock.advance(timedelta(days=31))

    result = _run(gd)

    assert result["workflows_cleaned_up"] == 2
    assert result["step_executions_cleaned_up"] == 3  # two of `finished`, one of `canceled`
    assert result["signals_cleaned_up"] == 2
    ids = (finished.id, canceled.id)
    assert _count(session, Workflow, Workflow.id.in_(ids)) == 0
    assert _count(session, StepExecution, StepExecution.workflow_id.in_(ids)) == 0
    assert _count(session, Signal, Signal.workflow_id.in_(ids)) == 0


def test_cleanup_keeps_ongoing_recent_and_never_transitioned_workflows_whatever_their_age(
    gd, session, clock
):
    paused = HousekeepingTwoSteps.create(session, allow_multiple=True)
    ready = HousekeepingTwoSteps.create(session, allow_multiple=True)
    session.commit()
    paused.pause()
    session.commit()
    undated = _finished(session)
    session.execute(update(Workflow).where(Workflow.id == undated.id).values(transitioned_at=None))
    clock.advance(timedelta(days=31))
    recent = _finished(session)

    result = _run(gd)

    assert result["workflows_cleaned_up"] == 0
    left = {paused.id, ready.id, undated.id, recent.id}
    assert _count(session, Workflow, Workflow.id.in_(left)) == 4


def test_cleanup_is_skipped_when_the_retention_is_none(gd, session, clock):
    _finished(session)
    clock.advance(timedelta(days=365))

    result = _run(replace(gd, delete_completed_workflows_after=None))

    assert result["workflows_cleaned_up"] == 0
    assert _count(session, Workflow) == 1


def test_cleanup_deletes_in_batches_until_a_short_batch(gd, session, clock):
    wf = _finished(session, signals=4)
    clock.advance(timedelta(days=31))

    result = _run(replace(gd, housekeeping_batch_size=2))

    assert result["signals_cleaned_up"] == 4
    assert result["step_executions_cleaned_up"] == 2
    assert _count(session, Workflow, Workflow.id == wf.id) == 0


def test_cleanup_of_tens_of_thousands_of_rows_completes_in_batches(gd, session, clock):
    now = clock.now()
    old = now - timedelta(days=40)
    workflows = 12_000
    table = table_of(Workflow)
    first_id = 1_000_000
    session.execute(
        insert(table),
        [
            {
                "id": first_id + n,
                "type": "HousekeepingTwoSteps",
                "state": "finished" if n % 3 else "canceled",
                "allow_multiple": True,
                "transitioned_at": old,
                "created_at": old,
                "updated_at": old,
            }
            for n in range(workflows)
        ],
    )
    session.execute(
        insert(table_of(StepExecution)),
        [
            {
                "workflow_id": first_id + n,
                "step_name": name,
                "state": "completed",
                "outcome": "success",
                "scheduled_for": old,
                "queue": "default",
                "priority": 0,
                "created_at": old,
                "updated_at": old,
            }
            for n in range(workflows)
            for name in ("first", "second")
        ],
    )
    session.execute(
        insert(table_of(Signal)),
        [
            {
                "workflow_id": first_id + n,
                "name": "ping",
                "state": "consumed",
                "claimed": 0,
                "consumed": 0,
                "created_at": old,
                "updated_at": old,
            }
            for n in range(0, workflows, 2)
        ],
    )
    keeper = HousekeepingTwoSteps.create(session, allow_multiple=True)  # ready: must survive
    session.commit()
    deletes: list[str] = []

    def count_deletes(_conn, _cursor, statement, *_args):
        if statement.lstrip().upper().startswith("DELETE"):
            deletes.append(statement)

    engine = gd.engine
    event.listen(engine, "before_cursor_execute", count_deletes)
    try:
        result = _run(replace(gd, housekeeping_batch_size=5000))
    finally:
        event.remove(engine, "before_cursor_execute", count_deletes)

    assert result["workflows_cleaned_up"] == workflows
    assert result["step_executions_cleaned_up"] == 2 * workflows
    assert result["signals_cleaned_up"] == workflows // 2
    # 24k executions in 5 batches (the last one short), 6k signals in 2, 12k workflows in 3.
    assert len(deletes) == 5 + 2 + 3
    assert _count(session, Workflow) == 1
    assert _count(session, StepExecution) == 1
    assert state_of(session, keeper) == "ready"


# -- F.2 / F.4 stuck in-progress recovery ----------------------------------------------------


def test_a_stuck_in_progress_step_is_recovered_and_runs_again(gd, session, clock):
    WorkerCrashable.crashes = 1
    wf = WorkerCrashable.create(session)
    crash_current_step(session, wf)  # an external backend's worker died: no lease
    clock.advance(timedelta(hours=1, seconds=1))

    result = _run(gd)

    assert result["stuck_in_progress_recovered"] == 1
    assert state_of(session, wf) == "ready"
    assert trail(session, wf) == [
        ("fragile", "completed", "recovered"),
        ("fragile", "scheduled", None),
    ]
    recovered = executions(session, wf)[0]
    assert recovered.completed_at == clock.now()
    assert recovered.finished_at == clock.now()
    assert recovered.read_metadata("recovery")["reason"] == "stuck_in_progress"
    speedrun(wf)
    assert state_of(session, wf) == "finished"


def test_an_in_progress_step_younger_than_the_threshold_is_left_alone(gd, session, clock):
    WorkerCrashable.crashes = 1
    wf = WorkerCrashable.create(session)
    crash_current_step(session, wf)
    clock.advance(timedelta(minutes=59))

    result = _run(gd)

    assert result["stuck_in_progress_recovered"] == 0
    assert trail(session, wf) == [("fragile", "in_progress", None)]


def test_a_step_under_a_live_lease_is_not_stuck_however_long_it_runs(gd, session, clock):
    WorkerCrashable.crashes = 1
    wf = WorkerCrashable.create(session)
    execution = crash_current_step(session, wf, worker_id="busy-worker")
    clock.advance(timedelta(hours=3))
    # The worker is alive and heartbeating: its lease reaches into the future.
    session.execute(
        update(StepExecution)
        .where(StepExecution.id == execution.id)
        .values(lease_expires_at=clock.now() + timedelta(seconds=20))
    )
    session.commit()

    result = _run(gd)

    assert result["stuck_in_progress_recovered"] == 0
    assert result["expired_leases_recovered"] == 0
    assert trail(session, wf) == [("fragile", "in_progress", None)]


def test_an_expired_lease_is_recovered_without_waiting_for_the_stuck_threshold(gd, session, clock):
    WorkerCrashable.crashes = 1
    wf = WorkerCrashable.create(session)
    crash_current_step(session, wf, worker_id="dead-worker", lease=30)
    clock.advance(timedelta(seconds=31))

    result = _run(gd)

    assert result["expired_leases_recovered"] == 1
    assert result["stuck_in_progress_recovered"] == 0
    assert trail(session, wf) == [
        ("fragile", "completed", "recovered"),
        ("fragile", "scheduled", None),
    ]
    recovery = executions(session, wf)[0].read_metadata("recovery")
    assert recovery["reason"] == "lease_expired"
    assert recovery["lease_owner"] == "dead-worker"


def test_a_stuck_resumable_step_continues_in_a_successor_from_its_cursor(gd, session, clock):
    WorkerCrashableResumable.crashes = 1
    wf = WorkerCrashableResumable.create(session)
    crashed = crash_current_step(session, wf)
    assert crashed.cursor_value == 3  # items 0..2 were checkpointed before the crash
    clock.advance(timedelta(hours=2))

    _run(gd)

    history = executions(session, wf)
    assert [(e.state, e.outcome) for e in history] == [
        ("completed", "recovered"),
        ("scheduled", None),
    ]
    assert history[1].continues_from_id == crashed.id
    assert history[1].cursor_value == 3
    WorkerCrashableResumable.seen = []
    speedrun(wf)
    assert WorkerCrashableResumable.seen == [3, 4, 5]


def test_the_cancel_action_cancels_the_execution_and_the_workflow(gd, session, clock):
    WorkerCrashable.crashes = 1
    wf = WorkerCrashable.create(session)
    crash_current_step(session, wf)
    clock.advance(timedelta(hours=2))

    result = _run(replace(gd, stuck_recovery_action="cancel"))

    assert result["stuck_in_progress_recovered"] == 1
    assert trail(session, wf) == [("fragile", "canceled", "recovered")]
    assert state_of(session, wf) == "canceled"
    assert wf.transitioned_at == clock.now()
    assert executions(session, wf)[0].canceled_at == clock.now()


def test_recover_execution_refuses_an_unknown_action_naming_the_choices(gd, session):
    wf = WorkerCrashable.create(session)
    session.commit()
    with pytest.raises(ValueError, match=r"action='retry'.*'reattempt', 'cancel'"):
        recovery.recover_execution(session, wf.current_execution.id, "retry")


# -- paused workflows (H-12) ----------------------------------------------------------------


@pytest.mark.parametrize("action", ["reattempt", "cancel"])
def test_a_paused_workflows_overdue_scheduled_step_is_never_touched(gd, session, clock, action):
    wf = HousekeepingTwoSteps.create(session)
    session.commit()
    wf.pause()
    session.commit()
    clock.advance(timedelta(days=2))

    with configured(backend=RecordingBackend()) as config:
        result = _run(replace(config, stuck_recovery_action=action))

    assert result["stuck_scheduled_recovered"] == 0
    assert state_of(session, wf) == "paused"
    assert trail(session, wf) == [("first", "scheduled", None)]


@pytest.mark.parametrize("action", ["reattempt", "cancel"])
def test_a_paused_workflows_dead_step_is_closed_and_resume_runs_it_again(
    gd, session, clock, action
):
    WorkerCrashable.crashes = 1
    wf = WorkerCrashable.create(session)
    crash_current_step(session, wf)
    wf.pause()  # an operator paused it while the step was (apparently) running
    session.commit()
    clock.advance(timedelta(hours=2))

    result = _run(replace(gd, stuck_recovery_action=action))

    assert result["stuck_in_progress_recovered"] == 1
    assert state_of(session, wf) == "paused"
    assert trail(session, wf) == [("fragile", "completed", "recovered")]
    wf.resume()
    session.commit()
    speedrun(wf)
    assert state_of(session, wf) == "finished"
    assert trail(session, wf)[1:] == [
        ("fragile", "completed", "success"),
        ("after", "completed", "success"),
    ]


def test_a_paused_workflows_dead_resumable_step_resumes_from_its_cursor(gd, session, clock):
    WorkerCrashableResumable.crashes = 1
    wf = WorkerCrashableResumable.create(session)
    crash_current_step(session, wf)
    wf.pause()
    session.commit()
    clock.advance(timedelta(hours=2))

    _run(gd)

    assert trail(session, wf) == [("walk", "completed", "workflow_paused")]
    wf.resume()
    session.commit()
    WorkerCrashableResumable.seen = []
    speedrun(wf)
    assert state_of(session, wf) == "finished"
    assert WorkerCrashableResumable.seen == [3, 4, 5]


# -- F.3 stuck scheduled ---------------------------------------------------------------------


def test_an_overdue_scheduled_step_is_recovered_for_an_external_backend(gd, session, clock):
    wf = HousekeepingTwoSteps.create(session)
    session.commit()
    clock.advance(timedelta(minutes=16))
    backend = RecordingBackend()

    with configured(backend=backend) as config:
        result = _run(config)

    assert result["stuck_scheduled_recovered"] == 1
    assert trail(session, wf) == [
        ("first", "completed", "recovered"),
        ("first", "scheduled", None),
    ]
    assert backend.execution_ids == [executions(session, wf)[1].id]  # re-delivered


def test_a_scheduled_step_overdue_less_than_the_threshold_is_left_alone(gd, session, clock):
    wf = HousekeepingTwoSteps.create(session)
    session.commit()
    clock.advance(timedelta(minutes=14))

    result = _run(gd, recover_scheduled=True)

    assert result["stuck_scheduled_recovered"] == 0
    assert trail(session, wf) == [("first", "scheduled", None)]


def test_overdue_scheduled_steps_are_left_in_place_with_the_database_backend(gd, session, clock):
    # With the database worker the row is the delivery; an overdue row is a backlog, and
    # recovering it would only move it to the back of the queue.
    wf = HousekeepingTwoSteps.create(session)
    session.commit()
    clock.advance(timedelta(hours=1))

    result = _run(gd)

    assert result["stuck_scheduled_recovered"] == 0
    assert trail(session, wf) == [("first", "scheduled", None)]


def test_waiting_executions_are_never_recovered(gd, session, clock):
    wf = WorkerWaitsForApproval.create(session)
    session.commit()
    perform_next_step(wf)  # parks at the gate
    assert trail(session, wf) == [("approve", "waiting", None)]
    clock.advance(timedelta(days=30))

    result = _run(gd, recover_scheduled=True)

    assert result["stuck_scheduled_recovered"] == 0
    assert trail(session, wf) == [("approve", "waiting", None)]


# -- H-20: a row that cannot be recovered ---------------------------------------------------


def test_a_row_whose_recovery_fails_is_reported_once_and_the_run_goes_on(gd, session, clock):
    WorkerCrashable.crashes = 2
    wf = WorkerCrashable.create(session, allow_multiple=True)
    crash_current_step(session, wf)
    wf_id = wf.id
    healthy = WorkerCrashable.create(session, allow_multiple=True)
    crash_current_step(session, healthy)
    # The class of `wf` was removed from the code: no step can be rescheduled for it.
    session.execute(update(Workflow).where(Workflow.id == wf_id).values(type="GoneAway"))
    session.commit()
    clock.advance(timedelta(hours=2))
    reports: list[dict[str, Any]] = []

    result = _run(
        replace(gd, error_reporter=lambda error, context: reports.append(context)),
        recover_scheduled=True,
    )

    assert result["stuck_in_progress_recovered"] == 1  # the healthy one, after the failure
    assert result["recovery_failures"] == 1
    assert len(reports) == 1
    assert reports[0]["recovery"] == "stuck_in_progress"
    session.commit()
    session.expunge_all()
    states = session.scalars(
        select(StepExecution.state).where(StepExecution.workflow_id == wf_id)
    ).all()
    assert states == ["in_progress"]  # its recovery rolled back: untouched


# -- gauges (F.5, H-13) ----------------------------------------------------------------------


def _gauges(
    events_seen: list[dict[str, Any]],
) -> dict[tuple[str, tuple[tuple[str, str], ...]], Any]:
    return {(e["name"], tuple(sorted(e["tags"].items()))): e["value"] for e in events_seen}


@pytest.fixture
def gauge_events():
    from geneva_drive import subscribe

    seen: list[dict[str, Any]] = []
    unsubscribe = subscribe("gauge", lambda _name, payload: seen.append(payload))
    yield seen
    unsubscribe()


def test_gauges_count_workflows_per_state_and_per_class_with_paused_ratios(
    gd, session, clock, gauge_events
):
    for _ in range(3):
        HousekeepingTwoSteps.create(session, allow_multiple=True)
    paused = HousekeepingTwoSteps.create(session, allow_multiple=True)
    HousekeepingOtherClass.create(session, allow_multiple=True)
    session.commit()
    paused.pause()
    session.commit()

    _run(gd)

    g = _gauges(gauge_events)
    assert g[("geneva_drive.ready", ())] == 4
    assert g[("geneva_drive.paused", ())] == 1
    assert g[("geneva_drive.ready", (("workflow", "HousekeepingTwoSteps"),))] == 3
    assert g[("geneva_drive.ready", (("workflow", "HousekeepingOtherClass"),))] == 1
    assert g[("geneva_drive.paused", (("workflow", "HousekeepingTwoSteps"),))] == 1
    assert g[("geneva_drive.paused_ratio", (("workflow", "HousekeepingTwoSteps"),))] == 0.25
    assert g[("geneva_drive.paused_ratio", (("workflow", "HousekeepingOtherClass"),))] == 0.0
    assert ("geneva_drive.finished", ()) not in g  # only states that are present


def test_finished_and_canceled_workflows_are_gauged_over_the_last_hour_only(
    gd, session, clock, gauge_events
):
    # Counting every terminal row kept until cleanup was a full scan of the table per pass;
    # the last hour's is an index range. Old ones are not counted, and the gem's names
    # (geneva_drive.finished / .canceled) are not reused for the narrower quantity.
    _finished(session)
    old_canceled = HousekeepingOtherClass.create(session, allow_multiple=True)
    session.commit()
    old_canceled.cancel()
    session.commit()
    clock.advance(timedelta(minutes=61))
    _finished(session)
    _finished(session, cls=HousekeepingOtherClass)
    canceled = HousekeepingOtherClass.create(session, allow_multiple=True)
    session.commit()
    canceled.cancel()
    session.commit()
    clock.advance(timedelta(minutes=59))

    _run(gd)

    g = _gauges(gauge_events)
    two, other = (("workflow", "HousekeepingTwoSteps"),), (("workflow", "HousekeepingOtherClass"),)
    assert g[("geneva_drive.finished_last_hour", ())] == 2
    assert g[("geneva_drive.finished_last_hour", two)] == 1
    assert g[("geneva_drive.finished_last_hour", other)] == 1
    assert g[("geneva_drive.canceled_last_hour", ())] == 1
    assert g[("geneva_drive.canceled_last_hour", other)] == 1
    assert not [key for key in g if key[0] in ("geneva_drive.finished", "geneva_drive.canceled")]


def test_the_paused_ratio_divides_by_the_ongoing_workflows_of_the_class(
    gd, session, clock, gauge_events
):
    paused = HousekeepingTwoSteps.create(session, allow_multiple=True)
    HousekeepingTwoSteps.create(session, allow_multiple=True)
    session.commit()
    paused.pause()
    session.commit()
    for _ in range(2):
        _finished(session)  # finished a moment ago: counted above, not in the ratio
    HousekeepingOtherClass.create(session, allow_multiple=True)
    session.commit()
    _finished(session, cls=HousekeepingOtherClass)

    _run(gd)

    g = _gauges(gauge_events)
    two, other = (("workflow", "HousekeepingTwoSteps"),), (("workflow", "HousekeepingOtherClass"),)
    assert g[("geneva_drive.finished_last_hour", two)] == 2
    assert g[("geneva_drive.paused_ratio", two)] == 0.5  # 1 of 2 ongoing, not 1 of 4 rows
    assert g[("geneva_drive.paused_ratio", other)] == 0.0


def test_a_class_with_only_finished_workflows_gets_no_paused_ratio(
    gd, session, clock, gauge_events
):
    _finished(session, cls=HousekeepingOtherClass)

    _run(gd)

    g = _gauges(gauge_events)
    other = (("workflow", "HousekeepingOtherClass"),)
    assert g[("geneva_drive.finished_last_hour", other)] == 1
    assert ("geneva_drive.paused_ratio", other) not in g  # 0 ongoing: no ratio to report


def test_waiting_gauges_count_parked_steps_and_the_overdue_ones(gd, session, clock, gauge_events):
    early = WorkerWaitsForApproval.create(session, allow_multiple=True)
    session.commit()
    perform_next_step(early)
    clock.advance(timedelta(days=8))
    late = WorkerWaitsForApproval.create(session, allow_multiple=True)
    session.commit()
    perform_next_step(late)

    _run(gd)

    g = _gauges(gauge_events)
    tag = (("workflow", "WorkerWaitsForApproval"),)
    assert g[("geneva_drive.waiting_step_executions", ())] == 2
    assert g[("geneva_drive.waiting_step_executions", tag)] == 2
    assert g[("geneva_drive.waiting_overdue", ())] == 1
    assert g[("geneva_drive.waiting_overdue", tag)] == 1


def test_waiting_totals_are_published_as_zero_and_no_class_gauge_without_rows(
    gd, session, gauge_events
):
    HousekeepingTwoSteps.create(session)
    session.commit()

    _run(gd)

    g = _gauges(gauge_events)
    assert g[("geneva_drive.waiting_step_executions", ())] == 0
    assert g[("geneva_drive.waiting_overdue", ())] == 0
    assert not [k for k in g if k[0].startswith("geneva_drive.waiting") and k[1]]


def test_the_overdue_gauge_is_off_without_a_visibility_threshold(gd, session, gauge_events):
    _run(replace(gd, waiting_visibility_threshold=None))

    assert not [e for e in gauge_events if e["name"] == "geneva_drive.waiting_overdue"]
    assert [e for e in gauge_events if e["name"] == "geneva_drive.waiting_step_executions"]


def test_gauges_are_set_as_prometheus_metrics_and_stale_classes_disappear(gd, session):
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    wf = HousekeepingOtherClass.create(session)
    session.commit()

    _run(gd, registry=registry)
    labels = {"workflow": "HousekeepingOtherClass"}
    assert registry.get_sample_value("geneva_drive_ready", labels) == 1
    assert registry.get_sample_value("geneva_drive_paused_ratio", labels) == 0.0

    wf.cancel()
    session.commit()
    _run(gd, registry=registry)
    assert registry.get_sample_value("geneva_drive_ready", labels) is None
    assert registry.get_sample_value("geneva_drive_canceled_last_hour", labels) == 1
    assert registry.get_sample_value("geneva_drive_canceled", labels) is None  # renamed


def test_registries_that_come_and_go_each_get_their_own_gauges(gd, session):
    # The gauges were kept per id(registry): a registry created where a collected one had
    # been was handed the dead one's gauges, and its own stayed empty (seen as a flaky
    # failure of the test above, whose registries come and go).
    prometheus_client = pytest.importorskip("prometheus_client")
    HousekeepingOtherClass.create(session)
    session.commit()
    labels = {"workflow": "HousekeepingOtherClass"}
    addresses: set[int] = set()
    reused = False
    # CPython gives freed memory to the next object of its size, so a registry is soon made
    # where a collected one had been — the case this test is about. How soon depends on what
    # else the process allocated meanwhile: go on until it has happened (a bounded number).
    for _ in range(200):
        registry = prometheus_client.CollectorRegistry()
        reused = reused or id(registry) in addresses
        addresses.add(id(registry))
        _run(gd, registry=registry)
        assert registry.get_sample_value("geneva_drive_ready", labels) == 1
        del registry
        gc.collect()
        if reused and len(addresses) >= 5:
            break
    assert reused


def test_a_housekeeping_event_carries_the_counters(gd, session):
    from geneva_drive import subscribe

    seen: list[dict[str, Any]] = []
    unsubscribe = subscribe("housekeeping", lambda _n, payload: seen.append(payload))
    try:
        result = _run(gd)
    finally:
        unsubscribe()
    assert seen == [result]
    assert set(result) == set(housekeeping.RESULT_KEYS)


# -- one at a time ---------------------------------------------------------------------------


def test_only_one_process_at_a_time_runs_housekeeping_on_a_shared_server(gd, db_backend):
    with housekeeping.exclusive(gd) as first:
        assert first is True
        second = housekeeping.run_exclusive(gd)
    if db_backend == "sqlite":
        assert second is not None  # one node, one file: nothing to coordinate
    else:
        assert second is None  # the other holder has the database lock
    assert housekeeping.run_exclusive(gd) is not None  # released after the block

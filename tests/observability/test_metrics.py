"""Prometheus metrics: the collectors on an application's own registry, and a running
`geneva-drive worker --metrics-port` scraped over HTTP."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session

from geneva_drive import Workflow, step
from geneva_drive.core import events
from geneva_drive.runtime import metrics
from geneva_drive.testing import perform_next_step, speedrun
from tests.signals._support import run_due
from tests.support.app import Order
from tests.worker.apps import WorkerScaleThreeSteps
from tests.worker.test_worker_processes import (  # noqa: F401
    REPO,
    Workers,
    db,
    wait_until,
    workers,
    workflow_states,
)


class MetricTwoSteps(Workflow):
    @step
    def first(self) -> None:
        pass

    @step
    def second(self) -> None:
        pass


class MetricWaits(Workflow):
    @step(wait_for="approved", timeout=60, on_timeout="skip")
    def approve(self) -> None:
        pass


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    own = CollectorRegistry()
    uninstall = metrics.install(own)
    yield own
    uninstall()


def _start(session, cls):
    order = Order()
    session.add(order)
    wf = cls.create(session, hero=order)
    session.commit()
    return wf


def test_nothing_listens_until_metrics_are_installed():
    assert not any(events.active(name) for name in ("step", "claim", "recovery", "signal"))


def test_step_outcomes_durations_and_queue_lag_are_counted_by_class_and_step(
    session, registry, clock
):
    wf = _start(session, MetricTwoSteps)
    clock.advance(timedelta(seconds=90))  # the first step is 90 s late

    speedrun(wf)

    value = registry.get_sample_value
    for name in ("first", "second"):
        labels = {"workflow": "MetricTwoSteps", "step": name, "outcome": "completed"}
        assert value("geneva_drive_steps_total", labels) == 1
        assert (
            value(
                "geneva_drive_step_duration_seconds_count",
                {"workflow": "MetricTwoSteps", "step": name},
            )
            == 1
        )
    lag = {"workflow": "MetricTwoSteps", "queue": "default"}
    assert value("geneva_drive_queue_lag_seconds_count", lag) == 2
    assert value("geneva_drive_queue_lag_seconds_sum", lag) == pytest.approx(90)


def test_signal_deliveries_are_counted_new_or_duplicate_and_timeouts_by_action(
    session, registry, clock
):
    waits = _start(session, MetricWaits)
    perform_next_step(waits)  # parks
    waits.signal("approved", idempotency_key="evt_1")
    waits.signal("approved", idempotency_key="evt_1")
    session.commit()
    times_out = _start(session, MetricWaits)
    perform_next_step(times_out)
    clock.advance(timedelta(minutes=2))
    run_due(session)

    value = registry.get_sample_value
    kind = {"workflow": "MetricWaits"}
    assert value("geneva_drive_signal_deliveries_total", {**kind, "delivery": "new"}) == 1
    assert value("geneva_drive_signal_deliveries_total", {**kind, "delivery": "duplicate"}) == 1
    timeout = {**kind, "step": "approve", "on_timeout": "skip"}
    assert value("geneva_drive_timeouts_total", timeout) == 1


def test_a_signal_is_counted_once_its_transaction_commits_and_never_if_it_rolls_back(
    session, registry
):
    waits = _start(session, MetricWaits)
    perform_next_step(waits)  # parks
    new = {"workflow": "MetricWaits", "delivery": "new"}
    value = registry.get_sample_value

    waits.signal("approved", idempotency_key="evt_1")
    assert value("geneva_drive_signal_deliveries_total", new) is None  # not committed yet
    session.rollback()
    assert value("geneva_drive_signal_deliveries_total", new) is None

    waits.signal("approved", idempotency_key="evt_1")
    session.commit()
    assert value("geneva_drive_signal_deliveries_total", new) == 1


def test_a_timeout_is_counted_once_its_transaction_commits_and_never_if_it_rolls_back(
    session, registry, clock
):
    from geneva_drive.engine.signals import fire_timeout
    from tests.signals._support import timer_of

    waits = _start(session, MetricWaits)
    perform_next_step(waits)  # parks, with its timer
    clock.advance(timedelta(minutes=2))
    labels = {"workflow": "MetricWaits", "step": "approve", "on_timeout": "skip"}
    value = registry.get_sample_value

    fire_timeout(session, waits, timer_of(session, waits), clock.now())
    assert value("geneva_drive_timeouts_total", labels) is None  # not committed yet
    session.rollback()
    assert value("geneva_drive_timeouts_total", labels) is None

    fire_timeout(session, waits, timer_of(session, waits), clock.now())
    session.commit()
    assert value("geneva_drive_timeouts_total", labels) == 1


def test_a_lease_recovery_is_counted_by_reason(session, registry, clock, gd):
    from geneva_drive.engine.recovery import recover_expired_leases
    from geneva_drive.testing import crash_next_step

    wf = _start(session, MetricTwoSteps)
    crash_next_step(wf, worker_id="gone", lease=timedelta(seconds=30))
    clock.advance(timedelta(minutes=1))

    assert recover_expired_leases(gd) == 1

    labels = {"workflow": "MetricTwoSteps", "reason": "lease_expired"}
    assert registry.get_sample_value("geneva_drive_recoveries_total", labels) == 1


def test_a_rolled_back_recovery_is_neither_counted_nor_logged(session, registry, clock, gd, caplog):
    from geneva_drive.engine.recovery import recover_execution
    from geneva_drive.storage.db import session_factory
    from geneva_drive.testing import crash_next_step

    wf = _start(session, MetricTwoSteps)
    execution_id = crash_next_step(wf, worker_id="gone", lease=timedelta(seconds=30)).id
    clock.advance(timedelta(minutes=1))

    with caplog.at_level(logging.INFO, logger="geneva_drive"), session_factory(gd)() as other:
        assert recover_execution(other, execution_id, reason="lease_expired")
        other.rollback()

    labels = {"workflow": "MetricTwoSteps", "reason": "lease_expired"}
    assert registry.get_sample_value("geneva_drive_recoveries_total", labels) is None
    assert not [r for r in caplog.records if "recovering" in r.getMessage()]


def test_the_housekeeping_gauges_reach_the_registry_install_was_given(session, registry, gd):
    from geneva_drive.runtime import housekeeping

    _start(session, MetricTwoSteps)
    _start(session, MetricTwoSteps)

    housekeeping.run(gd)  # no registry= of its own

    assert registry.get_sample_value("geneva_drive_ready", {"workflow": "MetricTwoSteps"}) == 2


def test_the_overview_and_the_gauges_read_one_query(session, gd, monkeypatch):
    from geneva_drive import admin
    from geneva_drive.runtime import housekeeping
    from geneva_drive.storage.queries import admin as admin_queries

    rows = [("Shop", "ready", 7), ("Shop", "paused", 3), ("Shop", "finished", 11)]
    monkeypatch.setattr(admin_queries, "workflow_counts", lambda _session, _since: rows)

    stats = admin.stats(session)
    gauges = {(name, tags.get("workflow")): v for name, v, tags in housekeeping.gauges(gd)}

    assert stats.by_class_state == (("Shop", "paused", 3), ("Shop", "ready", 7))
    assert stats.finished_last_hour == 11
    assert gauges[("geneva_drive.ready", "Shop")] == 7
    assert gauges[("geneva_drive.paused", "Shop")] == 3
    assert gauges[("geneva_drive.finished_last_hour", "Shop")] == 11


# -- a running worker ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        body = response.read().decode()
    return {
        f"{sample.name}{sorted(sample.labels.items())}": sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def _steps(scraped: dict[str, float]) -> float:
    return sum(v for k, v in scraped.items() if k.startswith("geneva_drive_steps_total["))


def test_a_running_worker_serves_its_metrics_over_http(workers, db):  # noqa: F811
    port = _free_port()
    with Session(db) as session:
        ids = [WorkerScaleThreeSteps.create(session).id for _ in range(3)]
        session.commit()

    workers.start("--metrics-port", str(port), "--housekeeping-interval", "0.5")
    wait_until(lambda: workflow_states(db, ids)["finished"] == 3, "the workflows", workers)
    wait_until(lambda: _steps(_scrape(port)) == 9, "nine steps in the metrics", workers)
    scraped = _scrape(port)

    one = [("outcome", "completed"), ("step", "one"), ("workflow", "WorkerScaleThreeSteps")]
    assert scraped[f"geneva_drive_steps_total{one}"] == 3
    assert scraped["geneva_drive_claims_total[]"] >= 1
    assert "geneva_drive_steps_in_flight[]" in scraped
    assert any(k.startswith("geneva_drive_queue_lag_seconds_count[") for k in scraped)
    wait_until(
        lambda: any(k.startswith("geneva_drive_finished_last_hour[") for k in _scrape(port)),
        "the housekeeping gauges",
        workers,
    )


def test_a_metrics_port_in_use_is_a_usage_error_naming_the_option(installed_database_url):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "geneva_drive.cli",
                "worker",
                "--app",
                "tests.worker.apps",
                "--database-url",
                installed_database_url,
                "--metrics-port",
                str(port),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    assert done.returncode == 2
    assert "--metrics-port" in done.stderr
    assert str(port) in done.stderr


def test_the_metric_names_list_names_every_collector(registry):
    families = {f.name for f in registry.collect()}
    counters = {name.removesuffix("_total") for name in metrics.METRIC_NAMES}
    assert counters == families

"""The per-step metrics' own counting (``runtime.step_tally``): per-thread tallies, added up
by a scrape, with prometheus-client's meaning of a histogram bucket."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.registry import Collector

from geneva_drive.runtime import metrics
from geneva_drive.runtime.step_tally import DURATION_BUCKETS, LAG_BUCKETS, StepCollector


def _registry(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def _step(collector: StepCollector, seconds: float, lag: float | None = None) -> None:
    collector.tally().step(("Wf", "one", "completed"), ("Wf", "one"), ("Wf", "q"), seconds, lag)


@pytest.mark.parametrize("value", [0.0, 0.005, 0.0051, 0.1, 900, 900.5, 1e9])
def test_a_duration_lands_in_the_buckets_prometheus_client_puts_it_in(value):
    ours, theirs = StepCollector(), CollectorRegistry()
    reference = Histogram(
        "geneva_drive_step_duration_seconds",
        "x",
        ["workflow", "step"],
        buckets=DURATION_BUCKETS,
        registry=theirs,
    )
    _step(ours, value)
    reference.labels("Wf", "one").observe(value)

    def buckets(registry: CollectorRegistry) -> dict[str, float]:
        (family,) = [
            f for f in registry.collect() if f.name == "geneva_drive_step_duration_seconds"
        ]
        return {
            s.name + str(sorted(s.labels.items())): s.value
            for s in family.samples
            if not s.name.endswith("_created")
        }

    assert buckets(_registry(ours)) == buckets(theirs)


def test_lag_is_counted_only_when_known_and_count_always_equals_the_inf_bucket():
    collector = StepCollector()
    _step(collector, 0.01, lag=90.0)
    _step(collector, 0.01, lag=None)  # a step with no due time: no lag observed
    _step(collector, 0.01, lag=LAG_BUCKETS[-1] + 1)
    registry = _registry(collector)
    value = registry.get_sample_value
    lag = {"workflow": "Wf", "queue": "q"}

    assert (
        value("geneva_drive_steps_total", {"workflow": "Wf", "step": "one", "outcome": "completed"})
        == 3
    )
    assert value("geneva_drive_queue_lag_seconds_count", lag) == 2
    assert value("geneva_drive_queue_lag_seconds_bucket", {**lag, "le": "+Inf"}) == 2
    assert value("geneva_drive_queue_lag_seconds_bucket", {**lag, "le": "60.0"}) == 0
    assert value("geneva_drive_queue_lag_seconds_bucket", {**lag, "le": "300.0"}) == 1
    assert value("geneva_drive_queue_lag_seconds_sum", lag) == pytest.approx(
        90 + LAG_BUCKETS[-1] + 1
    )


def test_every_threads_counts_are_added_up_and_outlive_their_thread():
    collector, registry = StepCollector(), CollectorRegistry()
    registry.register(collector)
    start, per_thread, threads = threading.Barrier(8), 5000, 8

    def count() -> None:
        start.wait()
        for _ in range(per_thread):
            _step(collector, 0.001)
            collector.tally().claims += 1

    running = [threading.Thread(target=count) for _ in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
    labels = {"workflow": "Wf", "step": "one", "outcome": "completed"}

    # Every thread has ended: the first scrape folds their tallies, the second reads the fold.
    for _ in range(2):
        assert registry.get_sample_value("geneva_drive_steps_total", labels) == 8 * 5000
        assert registry.get_sample_value("geneva_drive_claims_total") == 8 * 5000
        assert (
            registry.get_sample_value(
                "geneva_drive_step_duration_seconds_count", {"workflow": "Wf", "step": "one"}
            )
            == 8 * 5000
        )
    assert collector._live == []  # ended threads' tallies are folded, not kept one by one


def test_a_scrape_while_threads_count_sees_counts_that_only_grow():
    collector, registry = StepCollector(), CollectorRegistry()
    registry.register(collector)
    stop = threading.Event()

    def count() -> None:
        while not stop.is_set():
            _step(collector, 0.2, lag=1.0)

    running = [threading.Thread(target=count) for _ in range(3)]
    for thread in running:
        thread.start()
    try:
        seen = []
        for _ in range(200):
            (lags,) = [f for f in registry.collect() if f.name == "geneva_drive_queue_lag_seconds"]
            one_scrape = {s.name + s.labels.get("le", ""): s.value for s in lags.samples}
            # In one scrape, _count is the +Inf bucket (the sum of the buckets read).
            assert one_scrape.get("geneva_drive_queue_lag_seconds_count") == one_scrape.get(
                "geneva_drive_queue_lag_seconds_bucket+Inf"
            )
            seen.append(one_scrape.get("geneva_drive_queue_lag_seconds_count", 0))
    finally:
        stop.set()
        for thread in running:
            thread.join()
    assert seen == sorted(seen) and seen[-1] > 0


def test_a_second_install_on_one_registry_is_refused_by_the_registry():
    registry = CollectorRegistry()
    uninstall = metrics.install(registry)
    try:
        with pytest.raises(ValueError, match="geneva_drive_steps"):
            metrics.install(registry)
    finally:
        uninstall()

"""Prometheus metrics (extra ``metrics``: prometheus-client), fed by the engine's events.

:func:`install` creates the collectors on a registry (prometheus-client's global one by
default, or the application's own) and subscribes them to the events of ``core.events``;
``geneva-drive worker --metrics-port N`` also serves them on ``/metrics`` (:func:`serve`).
Until it is called nothing is subscribed, so an event costs what it did without metrics.

Labels are bounded by the code, never by the data: workflow class, step, outcome, queue,
recovery reason, signal delivery kind — no ids, no hero values. The housekeeping gauges
(``geneva_drive_ready{workflow=…}`` and the rest) are set by each housekeeping pass in this
process on every registry :func:`install` was given (its ``gauges`` event), and on the one
``housekeeping.run(registry=…)`` is given (the global one by default).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from geneva_drive.core import events
from geneva_drive.engine.leases import RunningExecutions
from geneva_drive.runtime.housekeeping import set_prometheus_gauges

# Step bodies run from milliseconds to minutes; queue lag from milliseconds to hours.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
LAG_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)

# Every metric name install() creates (the docs' table and the Grafana test read it).
METRIC_NAMES = (
    "geneva_drive_steps_total",
    "geneva_drive_step_duration_seconds",
    "geneva_drive_queue_lag_seconds",
    "geneva_drive_claims_total",
    "geneva_drive_recoveries_total",
    "geneva_drive_signal_deliveries_total",
    "geneva_drive_timeouts_total",
    "geneva_drive_steps_in_flight",
)


class Metrics:
    """The collectors on one registry, and the event subscriber that updates them."""

    def __init__(self, registry: CollectorRegistry, running: RunningExecutions | None) -> None:
        self.registry = registry
        self.steps = Counter(
            "geneva_drive_steps",
            "Step executions run, by workflow class, step and outcome",
            ["workflow", "step", "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "geneva_drive_step_duration_seconds",
            "Time a step's body took (hooks included), by workflow class and step",
            ["workflow", "step"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.lag = Histogram(
            "geneva_drive_queue_lag_seconds",
            "Time from a step execution's due time to its start, by workflow class and queue",
            ["workflow", "queue"],
            buckets=LAG_BUCKETS,
            registry=registry,
        )
        self.claims = Counter(
            "geneva_drive_claims", "Step executions claimed by this process", registry=registry
        )
        self.recoveries = Counter(
            "geneva_drive_recoveries",
            "Step executions recovered after their run was lost, by class and reason "
            "(lease_expired, stuck_in_progress, stuck_scheduled, other)",
            ["workflow", "reason"],
            registry=registry,
        )
        self.signals = Counter(
            "geneva_drive_signal_deliveries",
            "Signals delivered by this process, by class and delivery (new or duplicate)",
            ["workflow", "delivery"],
            registry=registry,
        )
        self.timeouts = Counter(
            "geneva_drive_timeouts",
            "Signal waits that timed out, by class, step and on_timeout action",
            ["workflow", "step", "on_timeout"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "geneva_drive_steps_in_flight",
            "Step executions this worker process is running now",
            registry=registry,
        )
        if running is not None:
            self.in_flight.set_function(lambda: len(running.ids()))
        # Each step's children by label values: labels() takes a lock and checks its arguments,
        # most of what a step's metrics cost; the label sets are few (bounded by the code).
        self._children: dict[tuple[str, ...], tuple[Any, Any, Any]] = {}

    def __call__(self, name: str, payload: dict[str, Any]) -> None:
        handler = self._handlers.get(name)
        if handler is not None:
            handler(self, payload)

    def _step(self, payload: dict[str, Any]) -> None:
        key = (
            payload["workflow_class"],
            payload["step_name"],
            payload.get("outcome", "unknown"),
            payload.get("queue") or "default",
        )
        children = self._children.get(key)
        if children is None:
            workflow, step, outcome, queue = key
            children = self._children[key] = (
                self.steps.labels(workflow, step, outcome),
                self.duration.labels(workflow, step),
                self.lag.labels(workflow, queue),
            )
        steps, duration, lag = children
        steps.inc()
        duration.observe(payload["duration"])
        due, started = payload.get("due_at"), payload.get("started_at")
        if isinstance(due, datetime) and isinstance(started, datetime):
            lag.observe(max(0.0, (started - due).total_seconds()))

    def _claim(self, _payload: dict[str, Any]) -> None:
        self.claims.inc()

    def _recovery(self, payload: dict[str, Any]) -> None:
        self.recoveries.labels(payload["workflow_class"], payload["reason"]).inc()

    def _signal(self, payload: dict[str, Any]) -> None:
        delivery = "duplicate" if payload["duplicate"] else "new"
        self.signals.labels(payload["workflow_class"], delivery).inc()

    def _timeout(self, payload: dict[str, Any]) -> None:
        self.timeouts.labels(
            payload["workflow_class"], payload["step_name"], payload["on_timeout"]
        ).inc()

    def _gauges(self, payload: dict[str, Any]) -> None:
        set_prometheus_gauges(payload["values"], self.registry)

    _handlers: dict[str, Callable[[Metrics, dict[str, Any]], None]] = {
        "gauges": _gauges,
        "step": _step,
        "claim": _claim,
        "recovery": _recovery,
        "signal": _signal,
        "timeout": _timeout,
    }


def install(
    registry: CollectorRegistry | None = None, *, running: RunningExecutions | None = None
) -> Callable[[], None]:
    """Create the collectors on ``registry`` and start updating them; returns a function that
    stops the updates (the collectors stay registered).

    ``running``: a worker's running executions (``Worker.running``), for the in-flight gauge.
    """
    metrics = Metrics(registry or prometheus_client.REGISTRY, running)
    stops = [events.subscribe(name, metrics) for name in Metrics._handlers]

    def uninstall() -> None:
        for stop in stops:
            stop()

    return uninstall


def serve(port: int, addr: str = "127.0.0.1", registry: CollectorRegistry | None = None) -> Any:
    """Serve ``registry`` on ``http://addr:port/metrics`` from a daemon thread; returns the
    server. A port in use raises ``OSError``."""
    served = prometheus_client.start_http_server(
        port, addr=addr, registry=registry or prometheus_client.REGISTRY
    )
    return served[0] if isinstance(served, tuple) else served

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
from prometheus_client import CollectorRegistry, Counter, Gauge

from geneva_drive.core import events
from geneva_drive.engine.leases import RunningExecutions
from geneva_drive.runtime.housekeeping import set_prometheus_gauges
from geneva_drive.runtime.step_tally import StepCollector

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
    """The collectors on one registry, and the event subscribers that update them.

    The per-step families (steps, durations, queue lag, claims) are counted by
    ``runtime.step_tally``, without a lock on the step's path; the rarer ones are
    prometheus-client's own collectors."""

    def __init__(self, registry: CollectorRegistry, running: RunningExecutions | None) -> None:
        self.registry = registry
        self.per_step = StepCollector()
        registry.register(self.per_step)
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

    def subscribers(self) -> dict[str, events.Subscriber]:
        """Each event's subscriber: a bound method each, called straight by ``events.emit``."""
        return {
            "gauges": self.on_gauges,
            "step": self.on_step,
            "claim": self.on_claim,
            "recovery": self.on_recovery,
            "signal": self.on_signal,
            "timeout": self.on_timeout,
        }

    def on_step(self, _name: str, payload: dict[str, Any]) -> None:
        workflow, step = payload["workflow_class"], payload["step_name"]
        due, started = payload.get("due_at"), payload.get("started_at")
        lag = None
        if isinstance(due, datetime) and isinstance(started, datetime):
            lag = max(0.0, (started - due).total_seconds())
        self.per_step.tally().step(
            (workflow, step, payload.get("outcome", "unknown")),
            (workflow, step),
            (workflow, payload.get("queue") or "default"),
            payload["duration"],
            lag,
        )

    def on_claim(self, _name: str, _payload: dict[str, Any]) -> None:
        self.per_step.tally().claims += 1

    def on_recovery(self, _name: str, payload: dict[str, Any]) -> None:
        self.recoveries.labels(payload["workflow_class"], payload["reason"]).inc()

    def on_signal(self, _name: str, payload: dict[str, Any]) -> None:
        delivery = "duplicate" if payload["duplicate"] else "new"
        self.signals.labels(payload["workflow_class"], delivery).inc()

    def on_timeout(self, _name: str, payload: dict[str, Any]) -> None:
        self.timeouts.labels(
            payload["workflow_class"], payload["step_name"], payload["on_timeout"]
        ).inc()

    def on_gauges(self, _name: str, payload: dict[str, Any]) -> None:
        set_prometheus_gauges(payload["values"], self.registry)


def install(
    registry: CollectorRegistry | None = None, *, running: RunningExecutions | None = None
) -> Callable[[], None]:
    """Create the collectors on ``registry`` and start updating them; returns a function that
    stops the updates (the collectors stay registered).

    ``running``: a worker's running executions (``Worker.running``), for the in-flight gauge.
    """
    metrics = Metrics(registry or prometheus_client.REGISTRY, running)
    stops = [events.subscribe(name, fn) for name, fn in metrics.subscribers().items()]

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

"""What each instrumentation point costs by itself, in µs per step: no database, no noise
from it — the complement of ``observability.py``, whose end-to-end rounds on a shared host
move by more than these costs.

    .venv/bin/python benchmarks/observability_points.py

Times, per step: the ``step`` event with nothing subscribed and with the Prometheus
collectors installed (``runtime.metrics``); the step's span off (``configure(tracing=False)``),
with tracing on but no provider configured (the default without an SDK), and with an SDK
provider whose processor drops every span; and the trace context ``create()`` reads.
"""

from __future__ import annotations

import datetime
import sys
import timeit
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit, machine
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from prometheus_client import CollectorRegistry

from geneva_drive.core import events
from geneva_drive.core.settings import Settings
from geneva_drive.engine import tracing
from geneva_drive.runtime import metrics

N = 50_000


def per_call_us(fn: Any) -> float:
    return round(min(timeit.repeat(fn, number=N, repeat=5)) / N * 1e6, 2)


def main() -> None:
    now = datetime.datetime.now(datetime.UTC)
    payload = {
        "workflow_class": "BenchThreeSteps",
        "step_name": "one",
        "execution_id": 1,
        "workflow_id": 1,
        "queue": "default",
        "due_at": now,
        "started_at": now,
        "outcome": "completed",
        "duration": 0.001,
    }
    results = {"step event, nothing subscribed": per_call_us(lambda: events.emit("step", payload))}
    uninstall = metrics.install(CollectorRegistry())
    results["step event, metrics installed"] = per_call_us(lambda: events.emit("step", payload))
    uninstall()

    provider = TracerProvider()
    provider.add_span_processor(SpanProcessor())  # drops every span
    traced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    prepared = SimpleNamespace(
        workflow=SimpleNamespace(trace_context=traced, hero_type="Order", hero_id="1"),
        execution=SimpleNamespace(signal_id=None),
        signal=None,
        identity=payload,
    )
    for name, config in (
        ("step span, tracing=False", Settings(tracing=False)),
        ("step span, no provider configured", Settings()),
        ("step span, SDK provider", Settings(tracing=provider)),
    ):

        def span(config: Settings = config) -> None:
            with tracing.step_span(prepared, config, payload):  # type: ignore[arg-type]
                pass

        results[name] = per_call_us(span)
    default = Settings()
    results["create()'s trace context, no provider"] = per_call_us(
        lambda: tracing.current_traceparent(default)
    )
    emit(bench="machine", **machine())
    for point, us in results.items():
        emit(bench="observability-points", point=point, us_per_step=us)


if __name__ == "__main__":
    main()

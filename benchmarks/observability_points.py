"""What each instrumentation point costs by itself, in µs per step: no database, no noise
from it — the complement of ``observability.py``, whose end-to-end rounds on a shared host
move by more than these costs.

    .venv/bin/python benchmarks/observability_points.py

Times, per step: the ``step`` event with nothing subscribed and with the Prometheus
collectors installed (``runtime.metrics``); the step's span off (``configure(tracing=False)``),
with tracing on but no provider configured (the default without an SDK), and with an SDK
provider whose processor drops every span, and with a batch processor and an exporter that
sends nowhere (as an application configures it, less the network); the attempt number a span
reads from the database (SQLite, a real row); and the trace context ``create()`` reads.
"""

from __future__ import annotations

import datetime
import sys
import tempfile
import timeit
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _gd
import gd_app
from _common import emit, machine
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from prometheus_client import CollectorRegistry
from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive import StepExecution
from geneva_drive.core import events
from geneva_drive.core.settings import Settings
from geneva_drive.engine import tracing
from geneva_drive.runtime import metrics
from geneva_drive.storage import queries

N = 50_000


def per_call_us(fn: Any, number: int = N) -> float:
    return round(min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6, 2)


class _Nowhere(SpanExporter):
    """An exporter that sends nowhere: what remains is the SDK's and ours."""

    def export(self, spans: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS


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
    batch = TracerProvider()  # as a user configures it: a batch processor, an exporter
    batch.add_span_processor(BatchSpanProcessor(_Nowhere()))
    # A real execution row on SQLite: the span reads the step's attempt number from it.
    engine, config = _gd.prepare(_gd.sqlite_url(Path(tempfile.mkdtemp(prefix="gd-points-"))))
    _gd.seed(config, gd_app.BenchThreeSteps, 10)
    session = Session(engine)
    execution = session.scalars(select(StepExecution).limit(1)).one()
    prepared = SimpleNamespace(
        workflow=SimpleNamespace(trace_context=traced, hero_type="Order", hero_id="1"),
        execution=execution,
        signal=None,
        identity=payload,
    )
    results["the attempt number read (SQLite)"] = per_call_us(
        lambda: queries.attempt_number(session, execution), number=2_000
    )
    for name, config in (
        ("step span, tracing=False", Settings(tracing=False)),
        ("step span, no provider configured", Settings()),
        ("step span, SDK provider, spans dropped", Settings(tracing=provider)),
        ("step span, SDK provider, batch processor", Settings(tracing=batch)),
    ):

        def span(config: Settings = config) -> None:
            with tracing.step_span(session, prepared, config, payload):  # type: ignore[arg-type]
                pass

        results[name] = per_call_us(span, number=2_000)
    session.close()
    batch.shutdown()
    default = Settings()
    results["create()'s trace context, no provider"] = per_call_us(
        lambda: tracing.current_traceparent(default)
    )
    emit(bench="machine", **machine())
    for point, us in results.items():
        emit(bench="observability-points", point=point, us_per_step=us)


if __name__ == "__main__":
    main()

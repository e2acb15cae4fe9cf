"""Workflows for the tracing and log tests; run by `geneva-drive worker --app
tests.observability.traced_app`, where (with GD_TEST_SPANS set) it sets up the OpenTelemetry
SDK with an exporter writing each finished span as a JSON line to that file."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from geneva_drive import Workflow, step


class TracedOrder(Workflow):
    may_proceed_without_hero = True

    @step
    def charge(self) -> None:
        pass

    @step(wait_for="shipped")
    def notify(self) -> None:
        pass


class LoggedFailure(Workflow):
    """Fails at once: the exception policy pauses it (the JSON log test)."""

    may_proceed_without_hero = True

    @step
    def charge(self) -> None:
        raise RuntimeError("card declined")


def span_line(span) -> dict:
    """What the tests read of a finished SDK span."""
    context, parent = span.context, span.parent
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
        "links": [
            {"trace_id": f"{ln.context.trace_id:032x}", "span_id": f"{ln.context.span_id:016x}"}
            for ln in span.links
        ],
        "attributes": dict(span.attributes or {}),
    }


def _install_file_exporter(path: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class FileExporter(SpanExporter):
        def export(self, spans: Sequence) -> SpanExportResult:
            with open(path, "a") as out:
                for span in spans:
                    out.write(json.dumps(span_line(span)) + "\n")
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
    trace.set_tracer_provider(provider)


if os.environ.get("GD_TEST_SPANS"):
    _install_file_exporter(os.environ["GD_TEST_SPANS"])

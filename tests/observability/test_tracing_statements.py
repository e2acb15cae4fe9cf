"""A traced step sends no statement an untraced one does not: its span reads the attempt from
the execution row the worker already holds (on PostgreSQL, a no-op step's completion and the
next claim then stay one statement)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from geneva_drive import Workflow, step
from geneva_drive.engine.executor import claim_and_run
from geneva_drive.engine.run_options import RunOptions
from geneva_drive.runtime.configure import configured
from tests.support.statements import first_words

WORKFLOWS = 3


class CostTraced(Workflow):
    may_proceed_without_hero = True

    @step
    def a(self) -> None:
        pass

    @step
    def b(self) -> None:
        pass

    @step
    def c(self) -> None:
        pass


def _statements(gd: Any, session: Any) -> list[str]:
    """The first words of every statement a worker sends to run WORKFLOWS new workflows."""
    for _ in range(WORKFLOWS):
        CostTraced.create(session)
    session.commit()
    options = RunOptions(worker_id="w", lease=timedelta(seconds=30), chain=lambda queue: True)
    with first_words(gd.engine) as seen:
        while claim_and_run(None, options, gd):
            pass
    return seen


def test_tracing_adds_no_statement_to_a_step(gd, session):
    untraced = _statements(gd, session)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with configured(tracing=provider) as traced_settings:
        traced = _statements(traced_settings, session)

    spans = [s for s in exporter.get_finished_spans() if s.name.startswith("geneva_drive.step")]
    assert len(spans) == 3 * WORKFLOWS
    assert {dict(s.attributes)["geneva_drive.attempt"] for s in spans} == {1}
    assert traced == untraced

"""A traced step sends no statement an untraced one does not: its span reads the attempt from
the execution row the worker already holds (on PostgreSQL, a no-op step's completion and the
next claim then stay one statement). Rows without a stored attempt (written before migration
0017) are counted, as before."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import select, update

from geneva_drive import ExceptionPolicy, StepExecution, Workflow, step
from geneva_drive.engine.executor import claim_and_run
from geneva_drive.engine.run_options import RunOptions
from geneva_drive.runtime.configure import configured
from geneva_drive.storage.dialects import dialect_of
from geneva_drive.testing import perform_next_step
from tests.engine._support import reload
from tests.support.statements import first_words

WORKFLOWS = 3
RUNS: list[int] = []


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


class CostTracedFlaky(Workflow):
    """``charge`` raises on its first two runs and is reattempted."""

    may_proceed_without_hero = True

    @step(on_exception=ExceptionPolicy("reattempt", wait=0, max_reattempts=5))
    def charge(self) -> None:
        RUNS.append(1)
        if len(RUNS) <= 2:
            raise ConnectionError("gateway busy")


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _attempts(exporter: InMemorySpanExporter) -> list[Any]:
    return [
        dict(s.attributes)["geneva_drive.attempt"]
        for s in exporter.get_finished_spans()
        if s.name.startswith("geneva_drive.step")
    ]


def _set_attempts(session: Any, workflow_id: int, attempt: int | None) -> None:
    of_workflow = StepExecution.workflow_id == workflow_id
    session.execute(update(StepExecution).where(of_workflow).values(attempt=attempt))
    session.commit()


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
    provider, exporter = _provider()
    with configured(tracing=provider) as traced_settings:
        traced = _statements(traced_settings, session)

    spans = [s for s in exporter.get_finished_spans() if s.name.startswith("geneva_drive.step")]
    assert len(spans) == 3 * WORKFLOWS
    assert {dict(s.attributes)["geneva_drive.attempt"] for s in spans} == {1}
    if dialect_of(gd.engine).counts_attempt_on_insert:
        assert traced == untraced
    else:
        # MySQL/MariaDB store no attempt on the steps a completion inserts (see the dialect):
        # each of those spans counts it, one read — a first step's, inserted by create(), is 1.
        added = Counter(traced)
        added.subtract(Counter(untraced))
        assert +added == Counter({"SELECT": 2 * WORKFLOWS})


def test_the_spans_attempt_is_the_one_stored_on_the_execution(gd, session):
    wf = CostTraced.create(session)
    session.commit()
    _set_attempts(session, wf.id, 7)  # not what a count would give: read from the row
    provider, exporter = _provider()
    with configured(tracing=provider):
        perform_next_step(wf)

    assert _attempts(exporter) == [7]


def test_rows_from_before_the_attempt_was_stored_are_counted(gd, session):
    RUNS.clear()
    wf = CostTracedFlaky.create(session)
    session.commit()
    perform_next_step(wf, raise_errors=False)  # raised: reattempted
    _set_attempts(session, wf.id, None)  # as rows written before migration 0017
    provider, exporter = _provider()
    with configured(tracing=provider):
        perform_next_step(reload(session, wf), raise_errors=False)  # raised again
        perform_next_step(reload(session, wf))

    assert _attempts(exporter) == [2, 3]
    stored = session.execute(
        select(StepExecution.attempt)
        .where(StepExecution.workflow_id == wf.id)
        .order_by(StepExecution.created_at, StepExecution.id)
    ).scalars()
    assert list(stored) == [None, None, None]  # a later run of such a step: unknown too

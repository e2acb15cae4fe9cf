"""OpenTelemetry: each step execution is a span, continuing the trace its workflow was created
in (days later, in another process) and linked to the span that sent the signal it woke on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from sqlalchemy.orm import Session

from geneva_drive import Workflow, admin, immediate_transactions, step
from geneva_drive.runtime.configure import configure, configured
from geneva_drive.testing import perform_next_step, speedrun
from tests.observability.traced_app import TracedOrder
from tests.signals._support import run_due
from tests.support.app import Order
from tests.worker.test_worker_processes import Workers, db, wait_until, workers, workflow_states  # noqa: F401


class TracedFails(Workflow):
    may_proceed_without_hero = True

    @step
    def charge(self) -> None:
        raise ValueError("card declined")


class TracedMaybeHero(Workflow):
    may_proceed_without_hero = True

    @step
    def one(self) -> None:
        pass


class TracedFlaky(Workflow):
    """``charge`` raises on its first two runs and is reattempted."""

    may_proceed_without_hero = True
    runs = 0

    @step(on_exception="reattempt")
    def charge(self) -> None:
        TracedFlaky.runs += 1
        if TracedFlaky.runs <= 2:
            raise ConnectionError("gateway busy")


@pytest.fixture
def spans(gd) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with configured(tracing=provider):
        exporter.provider = provider  # type: ignore[attr-defined]
        yield exporter


def _request(spans: InMemorySpanExporter, name: str):
    return spans.provider.get_tracer("app").start_as_current_span(name)  # type: ignore[attr-defined]


def _steps(spans: InMemorySpanExporter) -> list:
    return [s for s in spans.get_finished_spans() if s.name.startswith("geneva_drive.step")]


def test_each_step_is_a_span_in_the_trace_of_the_request_that_created_the_workflow(session, spans):
    with _request(spans, "POST /orders") as request:
        wf = TracedOrder.create(session)
        session.commit()
    perform_next_step(wf)

    [charge] = _steps(spans)
    assert charge.name == "geneva_drive.step TracedOrder.charge"
    assert charge.context.trace_id == request.get_span_context().trace_id
    assert charge.parent.span_id == request.get_span_context().span_id
    attributes = dict(charge.attributes)
    assert attributes["geneva_drive.workflow.class"] == "TracedOrder"
    assert attributes["geneva_drive.workflow.id"] == wf.id
    assert attributes["geneva_drive.step"] == "charge"
    assert attributes["geneva_drive.outcome"] == "completed"
    assert attributes["geneva_drive.queue"] == "default"
    assert isinstance(attributes["geneva_drive.execution.id"], int)


def test_a_steps_span_names_its_hero_and_leaves_the_hero_out_when_there_is_none(session, spans):
    order = Order()
    session.add(order)
    session.flush()
    with_hero, without = (
        TracedMaybeHero.create(session, hero=order),
        TracedMaybeHero.create(session),
    )
    session.commit()
    perform_next_step(with_hero)
    perform_next_step(without)

    first, second = (dict(s.attributes) for s in _steps(spans))
    assert (first["geneva_drive.hero.type"], first["geneva_drive.hero.id"]) == (
        "Order",
        str(order.id),
    )
    assert first["geneva_drive.workflow.id"] == with_hero.id
    assert second["geneva_drive.workflow.id"] == without.id
    assert not any(key.startswith("geneva_drive.hero") for key in second)


def test_the_step_a_signal_wakes_links_to_the_senders_span(session, spans):
    wf = TracedOrder.create(session)
    session.commit()
    perform_next_step(wf)  # charge; notify parks
    with _request(spans, "POST /webhooks/shipped") as webhook:
        wf.signal("shipped")
        session.commit()
    speedrun(wf)

    notify = next(s for s in _steps(spans) if s.name.endswith(".notify"))
    [link] = notify.links
    assert link.context.span_id == webhook.get_span_context().span_id
    assert link.context.trace_id == webhook.get_span_context().trace_id


def test_a_failing_step_records_its_exception_on_the_span(session, spans):
    wf = TracedFails.create(session)
    session.commit()

    with pytest.raises(ValueError):
        perform_next_step(wf)

    [charge] = _steps(spans)
    assert charge.status.status_code is StatusCode.ERROR
    [event] = charge.events
    assert event.name == "exception"
    assert event.attributes["exception.message"] == "card declined"
    assert dict(charge.attributes)["geneva_drive.outcome"] == "exception"


def test_tracing_false_makes_no_span_and_stores_no_context(session, spans):
    configure(tracing=False)
    with _request(spans, "POST /orders"):
        wf = TracedOrder.create(session)
        session.commit()
    perform_next_step(wf)

    assert _steps(spans) == []
    session.refresh(wf)
    assert wf.trace_context is None


def test_without_a_configured_provider_nothing_is_stored(session, gd):
    wf = TracedOrder.create(session)
    session.commit()

    session.refresh(wf)
    assert wf.trace_context is None


def test_tracing_must_be_a_bool_or_a_tracer_provider(gd):
    from geneva_drive import StepConfigurationError

    with pytest.raises(StepConfigurationError, match=r"configure\(tracing='yes'\)"):
        configure(tracing="yes")


# -- across processes ------------------------------------------------------------------------


def test_steps_run_by_a_worker_process_continue_the_creating_trace_and_link_the_signal(
    workers,  # noqa: F811
    db,  # noqa: F811
    tmp_path: Path,
    monkeypatch,
):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("web")
    span_file = tmp_path / "worker-spans.jsonl"
    monkeypatch.setenv("GD_TEST_SPANS", str(span_file))

    with configured(tracing=provider):
        with tracer.start_as_current_span("POST /orders"), Session(db) as session:
            wf_id = TracedOrder.create(session).id
            session.commit()
        workers.start("--app", "tests.observability.traced_app")
        wait_until(lambda: bool(_worker_spans(span_file)), "the first step's span", workers)
        # A webhook that reads, then signals, while a worker writes: on SQLite its transaction
        # must begin with the write lock (see geneva_drive.immediate_transactions).
        webhook_db = immediate_transactions(db)
        with tracer.start_as_current_span("POST /webhooks/shipped"), Session(webhook_db) as session:
            session.get(TracedOrder, wf_id).signal("shipped")
            session.commit()
    wait_until(lambda: workflow_states(db, [wf_id])["finished"] == 1, "the workflow", workers)
    wait_until(lambda: len(_worker_spans(span_file)) == 2, "both steps' spans", workers)

    created = {s.name: s for s in exporter.get_finished_spans()}
    request, webhook = created["POST /orders"], created["POST /webhooks/shipped"]
    charge, notify = sorted(_worker_spans(span_file), key=lambda s: s["name"])
    assert charge["name"] == "geneva_drive.step TracedOrder.charge"
    for span in (charge, notify):
        assert span["trace_id"] == f"{request.context.trace_id:032x}"
        assert span["parent_id"] == f"{request.context.span_id:016x}"
        assert span["attributes"]["geneva_drive.workflow.id"] == wf_id
    assert notify["links"] == [
        {
            "trace_id": f"{webhook.context.trace_id:032x}",
            "span_id": f"{webhook.context.span_id:016x}",
        }
    ]


def _worker_spans(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_steps_span_carries_its_attempt_number_as_the_timeline_counts_it(session, spans):
    TracedFlaky.runs = 0
    wf = TracedFlaky.create(session)
    session.commit()
    for _ in range(3):
        perform_next_step(wf, raise_errors=False)

    attempts = [dict(s.attributes)["geneva_drive.attempt"] for s in _steps(spans)]
    timeline = [e.attempt for e in admin.show(session, wf.id).executions]
    assert attempts == [1, 2, 3] == timeline


def test_show_gives_the_trace_id_of_the_request_that_created_the_workflow(session, spans):
    with _request(spans, "POST /orders") as request:
        wf = TracedOrder.create(session)
        session.commit()

    assert admin.show(session, wf.id).trace_id == f"{request.get_span_context().trace_id:032x}"


# -- claim spans (off by default) ------------------------------------------------------------


def _claims(spans: InMemorySpanExporter) -> list:
    return [s for s in spans.get_finished_spans() if s.name == "geneva_drive.claim"]


def test_claims_make_no_span_by_default(session, spans):
    TracedOrder.create(session)
    session.commit()

    run_due(session)

    assert [s.name for s in _steps(spans)] == ["geneva_drive.step TracedOrder.charge"]
    assert _claims(spans) == []


def test_with_trace_claims_each_claim_is_a_span_saying_what_it_claimed(session, spans):
    configure(trace_claims=True)
    wf = TracedOrder.create(session)
    session.commit()
    charge_id = wf.current_execution.id

    run_due(session)  # claims charge, then finds nothing due (notify waits for a signal)

    claims = _claims(spans)
    found, empty = claims[0], claims[-1]
    assert dict(found.attributes) == {
        "geneva_drive.claim.via": "claim",
        "geneva_drive.claim.count": 1,
        "geneva_drive.claim.outcome": "claimed",
        "geneva_drive.execution.id": charge_id,
        "geneva_drive.workflow.id": wf.id,
    }
    assert dict(empty.attributes) == {
        "geneva_drive.claim.via": "claim",
        "geneva_drive.claim.count": 0,
        "geneva_drive.claim.outcome": "empty",
    }
    assert all(claim.parent is None for claim in claims)  # a trace of its own, not the step's
    [charge] = _steps(spans)
    assert charge.context.trace_id != found.context.trace_id


def test_trace_claims_must_be_a_bool(gd):
    from geneva_drive import StepConfigurationError

    with pytest.raises(StepConfigurationError, match=r"configure\(trace_claims='yes'\)"):
        configure(trace_claims="yes")


def test_a_worker_started_with_trace_claims_makes_a_span_per_claim(
    workers,  # noqa: F811
    db,  # noqa: F811
    tmp_path: Path,
    monkeypatch,
):
    span_file = tmp_path / "worker-spans.jsonl"
    monkeypatch.setenv("GD_TEST_SPANS", str(span_file))
    with Session(db) as session:
        wf_id = TracedOrder.create(session).id
        session.commit()

    workers.start("--app", "tests.observability.traced_app", "--trace-claims")

    def claimed() -> list[dict]:
        return [
            s
            for s in _worker_spans(span_file)
            if s["name"] == "geneva_drive.claim"
            and s["attributes"].get("geneva_drive.workflow.id") == wf_id
        ]

    wait_until(lambda: bool(claimed()), "the claim's span", workers)
    assert claimed()[0]["attributes"]["geneva_drive.claim.outcome"] == "claimed"

"""OpenTelemetry spans of step executions, and the trace context kept across days.

With ``opentelemetry-api`` installed (extra ``otel``) and a tracer provider configured by the
application, each step execution is a span ``geneva_drive.step <Class>.<step>``. ``create()``
stores the W3C traceparent active when it runs on the workflow row, ``signal()`` on the signal
row (``storage.models``); a step's span is parented by its workflow's stored context, so the
request that started a workflow and its steps days later are one trace, and links to the
context of the signal that woke it. With ``configure(trace_claims=True)`` each claim is a
span too (:func:`claim_span`), a trace of its own; off by default.

Off — ``configure(tracing=False)``, ``opentelemetry`` not imported by the application, or no
provider configured (the API's default proxy) — every function here returns at its first
check: no span, no context read, nothing stored, and ``opentelemetry`` is never imported.
"""

from __future__ import annotations

import contextlib
import sys
import time
from contextlib import AbstractContextManager
from types import ModuleType
from typing import TYPE_CHECKING, Any

from geneva_drive.core.settings import Settings
from geneva_drive.storage import queries

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from geneva_drive.engine.prepare import Prepared
    from geneva_drive.storage.queries.handover import Handover

TRACER_NAME = "geneva_drive"
_OFF: AbstractContextManager[None] = contextlib.nullcontext()
_api: ModuleType | None = None  # opentelemetry.trace, once the application has imported it
_context_api: Any = None  # opentelemetry.context, with it (an import statement per span costs)
_no_sdk: tuple[type, ...] = ()  # the API's own providers, which make no spans
# The provider last asked and its tracer (None for the API's own providers): the SDK builds a
# new tracer on every get_tracer() (a tenth of a millisecond), and a process has one provider.
_cached: tuple[Any, Any] = (object(), None)


def _trace_api() -> ModuleType | None:
    """``opentelemetry.trace`` if the application has imported it, else None.

    Never imported here: an application that configured a tracer provider has imported it
    (so has ``opentelemetry-instrument``), and one that did not would pay for the import —
    tens of milliseconds — for spans nobody records.
    """
    global _api, _context_api, _no_sdk
    if isinstance(_api, ModuleType):
        return _api
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    _context_api = sys.modules["opentelemetry.context"]  # imported by opentelemetry.trace
    _api, _no_sdk = trace, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    return trace


def _tracer(config: Settings) -> Any:
    """The tracer to use, or None when tracing is off (see the module's docstring)."""
    if config.tracing is False:
        return None
    api = _trace_api()
    if api is None:
        return None
    global _cached
    provider = api.get_tracer_provider() if config.tracing is True else config.tracing
    cached_provider, tracer = _cached
    if provider is cached_provider:
        return tracer
    # The API's own providers make no spans: the application configured no SDK. Checked once
    # per provider: isinstance against their ABC costs a tenth of what the rest of this does.
    tracer = None if isinstance(provider, _no_sdk) else provider.get_tracer(TRACER_NAME)
    _cached = (provider, tracer)
    return tracer


def current_traceparent(config: Settings) -> str | None:
    """The W3C traceparent of the span active now, to store with a workflow or a signal."""
    if _tracer(config) is None:
        return None
    api = _trace_api()
    assert api is not None
    context = api.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _span_context(api: ModuleType, traceparent: str | None) -> Any:
    """The remote span context a stored traceparent stands for, or None if it is malformed."""
    parts = (traceparent or "").split("-")
    if len(parts) != 4:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    context = api.SpanContext(trace_id, span_id, True, api.TraceFlags(flags))
    return context if context.is_valid else None


# The parent context of the last stored traceparent: a workflow's steps, run one after the
# other, share it, and parsing it into a context is a tenth of a span's cost.
_last_parent: tuple[str | None, Any] = (None, None)


def _parent_context(api: ModuleType, traceparent: str | None) -> Any:
    """The context to start a span in as a child of a stored traceparent (None: a root)."""
    global _last_parent
    last, context = _last_parent
    if traceparent == last:
        return context
    parent = _span_context(api, traceparent)
    context = api.set_span_in_context(api.NonRecordingSpan(parent)) if parent else None
    _last_parent = (traceparent, context)
    return context


def step_span(
    session: Session, prepared: Prepared, config: Settings, payload: dict[str, Any]
) -> AbstractContextManager[None]:
    """The span of one step execution's body; ``payload`` (the ``step`` event's) gives its
    outcome and exception when the body ends. A shared no-op when tracing is off.

    ``session``: the step's, to count the attempt of a row that has none stored (a timer, a
    row from before migration 0017): one indexed read, only when tracing."""
    tracer = _tracer(config)
    if tracer is None:
        return _OFF
    return _StepSpan(tracer, session, prepared, payload)


# Span names by (workflow class, step): the same few strings for every step a process runs.
_span_names: dict[tuple[str, str], str] = {}


class _StepSpan:
    __slots__ = ("payload", "prepared", "session", "span", "token", "tracer")

    def __init__(
        self, tracer: Any, session: Session, prepared: Prepared, payload: dict[str, Any]
    ) -> None:
        self.tracer, self.session, self.prepared, self.payload = tracer, session, prepared, payload

    def __enter__(self) -> None:
        api = _api
        assert api is not None  # _tracer() found it
        prepared = self.prepared
        workflow, execution, identity = prepared.workflow, prepared.execution, prepared.identity
        cls, step = identity["workflow_class"], identity["step_name"]
        attributes = {
            "geneva_drive.workflow.class": cls,
            "geneva_drive.workflow.id": identity["workflow_id"],
            "geneva_drive.execution.id": identity["execution_id"],
            "geneva_drive.step": step,
            "geneva_drive.attempt": execution.attempt or self._counted_attempt(),
            "geneva_drive.queue": execution.queue or "default",
        }
        hero_type = workflow.hero_type
        if hero_type is not None:  # left out without a hero, as in the log records
            attributes["geneva_drive.hero.type"] = hero_type
            attributes["geneva_drive.hero.id"] = workflow.hero_id
        if execution.signal_id is not None:
            attributes["geneva_drive.signal.id"] = execution.signal_id
        links = None
        signal = prepared.signal
        if signal is not None:
            linked = _span_context(api, signal.trace_context)
            if linked is not None:
                links = [api.Link(linked, {"geneva_drive.link": "signal"})]
        name = _span_names.get((cls, step))
        if name is None:
            name = _span_names[cls, step] = f"geneva_drive.step {cls}.{step}"
        # start_span and attach rather than start_as_current_span, a generator-based context
        # manager that costs about as much again.
        span = self.span = self.tracer.start_span(
            name,
            context=_parent_context(api, workflow.trace_context),
            links=links,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        )
        self.token = _context_api.attach(api.set_span_in_context(span))

    def _counted_attempt(self) -> int:
        """The attempt of an execution that has none stored: a timer's (its parked run's), or
        a row from before migration 0017 (or of a step that has one). Read on the step's
        connection, without a flush (what a before-step hook changed is flushed with the
        step's end); the one statement a span may add, and only for those rows."""
        return queries.attempt_number(self.session, self.prepared.execution)

    def __exit__(self, *exc: Any) -> None:
        span, payload = self.span, self.payload
        span.set_attribute("geneva_drive.outcome", payload.get("outcome", ""))
        error = payload.get("exception")
        if error is not None:
            api = _api
            assert api is not None
            span.record_exception(error)
            span.set_status(api.Status(api.StatusCode.ERROR, type(error).__name__))
        _context_api.detach(self.token)
        span.end()


# -- claims (``configure(trace_claims=True)``) ---------------------------------------------


class _NoClaimSpan:
    """What :func:`claim_span` gives when claims are not traced: nothing is recorded."""

    def __enter__(self) -> _NoClaimSpan:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def claimed(self, claimed: tuple[int, int] | None) -> None:
        return None

    def handed_over(self, handover: Handover | None) -> None:
        return None


_NO_CLAIM_SPAN = _NoClaimSpan()


def claim_span(config: Settings) -> _NoClaimSpan:
    """A span ``geneva_drive.claim`` around one claim, when ``config.trace_claims`` and tracing
    are on; tell it what was claimed with ``claimed((execution_id, workflow_id) or None)``
    or, for a completion that claims (``queries.handover``), ``handed_over(handover)`` — None,
    nothing was sent: no span. Each claim is a trace of its own: an idle worker's polls
    would otherwise bury its steps' spans. Otherwise the shared no-op (one attribute read)."""
    if not config.trace_claims:
        return _NO_CLAIM_SPAN
    tracer = _tracer(config)
    return _NO_CLAIM_SPAN if tracer is None else _ClaimSpan(tracer)


class _ClaimSpan(_NoClaimSpan):
    """Made once the claim has said what it did, with the time it began: a completion that
    turns out to send no claim makes no span."""

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer
        self.began = 0
        self.span: Any = None

    def __enter__(self) -> _ClaimSpan:
        self.began = time.time_ns()
        return self

    def claimed(self, claimed: tuple[int, int] | None) -> None:
        if claimed is None:
            self._start("claim", 0, "empty")
        else:
            self._start("claim", 1, "claimed", *claimed)

    def handed_over(self, handover: Handover | None) -> None:
        if handover is None:
            return
        if handover.started is not None:
            row, execution = handover.started
            self._start("handover", 1, "claimed", execution.id, row.id)
        elif handover.claimed:  # a step it may not start: left to an ordinary claim
            self._start("handover", 1, "declined")
        else:
            self._start("handover", 0, "empty")

    def _start(
        self,
        via: str,
        count: int,
        outcome: str,
        execution_id: int | None = None,
        workflow_id: int | None = None,
    ) -> None:
        attributes: dict[str, Any] = {
            "geneva_drive.claim.via": via,
            "geneva_drive.claim.count": count,
            "geneva_drive.claim.outcome": outcome,
        }
        if execution_id is not None:
            attributes["geneva_drive.execution.id"] = execution_id
            attributes["geneva_drive.workflow.id"] = workflow_id
        # A root: the claim belongs to no request, and a step's span is parented by its own
        # workflow's context (see _StepSpan), not by the claim that found it.
        self.span = self.tracer.start_span(
            "geneva_drive.claim",
            context=_context_api.Context(),
            attributes=attributes,
            start_time=self.began,
        )

    def __exit__(self, *exc: Any) -> None:
        error = exc[1]
        if error is not None:
            api = _trace_api()
            assert api is not None
            if self.span is None:
                self._start("claim", 0, "error")
            self.span.record_exception(error)
            self.span.set_status(api.Status(api.StatusCode.ERROR, type(error).__name__))
        if self.span is not None:
            self.span.end()

"""Instrumentation events and logging context.

Events: ``precondition``, ``step`` and ``finalize`` (payloads as in the gem: ``execution_id``,
``workflow_id``, ``workflow_class``, ``step_name``, ``resumable`` for resumable steps, plus an
``outcome`` / state; ``step`` also has ``queue``, ``due_at`` and ``started_at``), ``gauge`` and
``housekeeping`` (``runtime.housekeeping``), ``claim`` (a claim found a row: a claim query,
or a completion that started another workflow's step, ``queries.handover``), ``recovery``
(``workflow_class``, ``step_name``, ``reason``: ``lease_expired``, ``stuck_in_progress``,
``stuck_scheduled`` or ``other``), ``signal`` (``workflow_class``,
``duplicate``) and ``timeout`` (``workflow_class``, ``step_name``, ``on_timeout``); these
three are emitted once the transaction that did the thing commits, never if it rolls back.
Subscribers are plain callables ``fn(name, payload)``; a subscriber that raises is logged and
ignored — instrumentation must never change what a workflow does. With no subscriber an event
costs one dictionary look-up: a caller that builds a payload only for it asks :func:`active`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, MutableMapping
from typing import Any, Protocol


class WorkflowRow(Protocol):
    """What the logging context reads of a workflow row (``Workflow`` has it)."""

    @property
    def id(self) -> int: ...
    @property
    def hero_type(self) -> str | None: ...
    @property
    def hero_id(self) -> str | None: ...


class ExecutionRow(Protocol):
    """What the logging context reads of a step execution row (``StepExecution`` has it)."""

    @property
    def id(self) -> int: ...
    @property
    def step_name(self) -> str: ...


Subscriber = Callable[[str, dict[str, Any]], None]
EVENTS = (
    "precondition",
    "step",
    "finalize",
    "gauge",
    "gauges",
    "housekeeping",
    "claim",
    "recovery",
    "signal",
    "timeout",
)

_subscribers: dict[str, list[Subscriber]] = {}
# Who an event goes to: its own subscribers, then the "*" ones — rebuilt under _lock on every
# (un)subscribe and replaced whole, so emit() reads it without the lock and builds nothing.
_targets: dict[str, tuple[Subscriber, ...]] = {}
_lock = threading.Lock()
log = logging.getLogger("geneva_drive")


def _rebuild_targets() -> None:
    global _targets
    every = tuple(_subscribers.get("*", ()))
    _targets = {name: (*_subscribers.get(name, ()), *every) for name in EVENTS}


def subscribe(name: str, fn: Subscriber) -> Callable[[], None]:
    """Call ``fn(name, payload)`` after every ``name`` event; returns an unsubscribe function."""
    if name not in EVENTS and name != "*":
        raise ValueError(f"unknown event {name!r}; known events: {', '.join(EVENTS)} or '*'")
    with _lock:
        _subscribers.setdefault(name, []).append(fn)
        _rebuild_targets()

    def unsubscribe() -> None:
        with _lock:
            if fn in _subscribers.get(name, []):
                _subscribers[name].remove(fn)
                _rebuild_targets()

    return unsubscribe


def active(name: str) -> bool:
    """Whether anything listens to ``name`` (build a payload only then)."""
    return bool(_targets.get(name))


def emit(name: str, payload: dict[str, Any]) -> None:
    targets = _targets.get(name)
    if not targets:
        return  # the usual case, several times per step
    for fn in targets:
        try:
            fn(name, payload)
        except Exception:
            log.exception("geneva-drive event subscriber %r failed on %s", fn, name)


class instrument:  # lower case: it is used as the function it replaced, in ``with``
    """Time a block; the block fills in ``payload`` (e.g. ``outcome``) before it is emitted.

    A class rather than a ``@contextmanager`` generator: it runs three times per step, and
    the generator's setup was most of what it cost.
    """

    __slots__ = ("name", "payload", "started")

    def __init__(self, name: str, payload: dict[str, Any]) -> None:
        self.name, self.payload = name, payload

    def __enter__(self) -> dict[str, Any]:
        self.started = time.perf_counter()
        return self.payload

    def __exit__(self, *_exc: object) -> None:
        self.payload["duration"] = time.perf_counter() - self.started
        emit(self.name, self.payload)


class ContextAdapter(logging.LoggerAdapter[logging.Logger]):
    """Prefixes messages with the workflow/execution and attaches it as ``record.geneva_drive``.

    ``fields={...}`` on a call adds fields to that record's ``geneva_drive`` only (a state
    change's ``transition`` and ``reason``), which the JSON log format writes as fields.
    """

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        context = dict(self.extra or {})
        text = context_message(msg, context)
        context.update(kwargs.pop("fields", None) or {})
        kwargs.setdefault("extra", {})["geneva_drive"] = context
        return text, kwargs


def context_message(msg: Any, context: dict[str, Any]) -> str:
    """``msg`` with the same ``[key=value ...]`` prefix :class:`ContextAdapter` writes."""
    prefix = " ".join(f"{k}={v}" for k, v in context.items() if v is not None)
    return f"[{prefix}] {msg}"


def workflow_context(workflow: WorkflowRow) -> dict[str, Any]:
    return {
        "workflow_class": type(workflow).__name__,
        "workflow_id": workflow.id,
        "hero_type": workflow.hero_type,
        "hero_id": workflow.hero_id,
    }


def workflow_logger(workflow: WorkflowRow) -> ContextAdapter:
    return ContextAdapter(log, workflow_context(workflow))


def execution_logger(workflow: WorkflowRow, execution: ExecutionRow) -> ContextAdapter:
    return ContextAdapter(
        log,
        {
            **workflow_context(workflow),
            "execution_id": execution.id,
            "step_name": execution.step_name,
        },
    )

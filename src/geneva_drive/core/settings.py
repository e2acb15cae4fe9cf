"""Settings: plain data, and the process-wide *current* settings.

The current settings are installed by ``geneva_drive.configure()`` (``runtime.configure``,
which the worker, the CLI and the pytest plugin call for you). Everything else takes what it
needs from a ``Settings`` it is given, so tests can swap engines, clocks and backends freely.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from geneva_drive.core.clock import Clock, SystemClock
from geneva_drive.core.errors import StepConfigurationError
from geneva_drive.core.events import context_message

if TYPE_CHECKING:
    from geneva_drive.core.ports import Backend

ErrorReporter = Callable[[BaseException, dict[str, Any]], None]

_STUCK_ACTIONS = ("reattempt", "cancel")
SESSION_SETTINGS = "geneva_drive.settings"  # Session.info key: the Settings it was made from
# The duration settings: (name, must be above 0 rather than 0 or more, None allowed).
_DURATIONS = (
    ("delete_completed_workflows_after", False, True),
    ("stuck_in_progress_threshold", True, False),
    ("stuck_scheduled_threshold", True, False),
    ("waiting_visibility_threshold", False, True),
)


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _log_reporter(error: BaseException, context: dict[str, Any]) -> None:
    # The context as the message's prefix too, as every other record about a step has it,
    # under the same names (reporters are given the execution as ``step_execution_id``).
    fields = {k: v for k, v in context.items() if k != "step_execution_id"}
    fields.setdefault("execution_id", context.get("step_execution_id"))
    logging.getLogger("geneva_drive.errors").error(
        context_message("step error reported: %r", fields),
        error,
        exc_info=error,
        extra={"geneva_drive": fields},
    )


@dataclass(frozen=True)
class Settings:
    engine: Engine | None = None
    backend: Backend | None = None
    clock: Clock = field(default_factory=SystemClock)
    error_reporter: ErrorReporter = _log_reporter
    enqueue_after_commit: bool = True
    delete_completed_workflows_after: timedelta | None = timedelta(days=30)
    stuck_in_progress_threshold: timedelta = timedelta(hours=1)
    stuck_scheduled_threshold: timedelta = timedelta(minutes=15)
    housekeeping_batch_size: int = 1000
    stuck_recovery_action: str = "reattempt"
    max_cursor_size: int | None = 128 * 1024
    max_signal_payload_size: int | None = 128 * 1024
    # The most bytes of JSON kept for a workflow's input, a step's result, and a workflow's
    # metadata, each (docs/inputs-and-results.md).
    max_value_size: int | None = 64 * 1024
    waiting_visibility_threshold: timedelta | None = timedelta(days=7)
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("geneva_drive"))
    # OpenTelemetry spans of steps (engine.tracing): True uses the application's global tracer
    # provider when it has configured one; False turns them off; a TracerProvider uses that.
    tracing: Any = True
    # A span per claim (engine.tracing.claim_span) as well, when tracing is on: off by
    # default, as a worker's idle polls would outnumber its steps' spans.
    trace_claims: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.trace_claims, bool):
            raise StepConfigurationError(
                f"configure(trace_claims={self.trace_claims!r}): expected True or False, e.g. "
                "configure(trace_claims=True) for a span per claim"
            )
        if not isinstance(self.tracing, bool) and not callable(
            getattr(self.tracing, "get_tracer", None)
        ):
            raise StepConfigurationError(
                f"configure(tracing={self.tracing!r}): expected True, False or an OpenTelemetry "
                "TracerProvider, e.g. configure(tracing=False) to turn step spans off"
            )
        if self.stuck_recovery_action not in _STUCK_ACTIONS:
            raise StepConfigurationError(
                f"configure(stuck_recovery_action={self.stuck_recovery_action!r}): expected one "
                f"of {', '.join(map(repr, _STUCK_ACTIONS))}"
            )
        if not _positive_int(self.housekeeping_batch_size):
            raise StepConfigurationError(
                f"configure(housekeeping_batch_size={self.housekeeping_batch_size!r}): expected "
                "a positive integer"
            )
        for name in ("max_cursor_size", "max_signal_payload_size", "max_value_size"):
            value = getattr(self, name)
            if value is not None and not _positive_int(value):
                raise StepConfigurationError(
                    f"configure({name}={value!r}): expected a positive number of bytes, or "
                    "None for no limit"
                )
        for name, positive, optional in _DURATIONS:
            value = getattr(self, name)
            if optional and value is None:
                continue
            if not isinstance(value, timedelta) or value < timedelta(0) or (positive and not value):
                rule = "above 0" if positive else "of 0 or more"
                raise StepConfigurationError(
                    f"configure({name}={value!r}): expected a timedelta {rule}"
                    f"{', or None' if optional else ''}, e.g. {name}=timedelta(minutes=15)"
                )

    def require_engine(self) -> Engine:
        if self.engine is None:
            raise StepConfigurationError(
                "geneva-drive has no database engine: call "
                "geneva_drive.configure(engine=geneva_drive.create_engine(url)) first"
            )
        return self.engine


_current = Settings()
_inline = threading.local()


def settings() -> Settings:
    return _current


def install(config: Settings) -> None:
    """Make ``config`` the current settings: ``runtime.configure`` validates and calls this."""
    global _current
    _current = config


def settings_of(session: Session) -> Settings:
    """The settings a session was made from (a worker's own), else the configured ones.

    The caller's own sessions (a web request's) carry none and use :func:`settings`.
    """
    found = session.info.get(SESSION_SETTINGS)
    return found if isinstance(found, Settings) else _current


@contextlib.contextmanager
def with_inline_enqueue() -> Iterator[None]:
    """Within the block, hand steps to the backend at once instead of after commit."""
    previous = getattr(_inline, "depth", 0)
    _inline.depth = previous + 1
    try:
        yield
    finally:
        _inline.depth = previous


def enqueues_deferred(config: Settings | None = None) -> bool:
    if getattr(_inline, "depth", 0):
        return False
    return (config or _current).enqueue_after_commit

"""Settings and the one ``configure()`` call that wires geneva-drive into an application.

There is one process-wide *current* configuration, set by :func:`configure` (the worker, the
CLI and the pytest plugin call it for you). Everything else takes what it needs from it
explicitly at the call site, so tests can swap engines, clocks and backends freely.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from .clock import Clock, SystemClock
from .engine import engine_for_workers, prepare_engine
from .errors import StepConfigurationError

if TYPE_CHECKING:
    from .backends.base import Backend

ErrorReporter = Callable[[BaseException, dict[str, Any]], None]

_STUCK_ACTIONS = ("reattempt", "cancel")
SESSION_SETTINGS = "geneva_drive.settings"  # Session.info key: the Settings it was made from


def _log_reporter(error: BaseException, context: dict[str, Any]) -> None:
    logging.getLogger("geneva_drive.errors").error(
        "step error reported: %r", error, exc_info=error, extra={"geneva_drive": context}
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
    waiting_visibility_threshold: timedelta | None = timedelta(days=7)
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("geneva_drive"))

    def __post_init__(self) -> None:
        if self.stuck_recovery_action not in _STUCK_ACTIONS:
            raise StepConfigurationError(
                f"configure(stuck_recovery_action={self.stuck_recovery_action!r}): expected one "
                f"of {', '.join(map(repr, _STUCK_ACTIONS))}"
            )
        if self.housekeeping_batch_size < 1:
            raise StepConfigurationError(
                f"configure(housekeeping_batch_size={self.housekeeping_batch_size!r}): expected "
                "a positive integer"
            )

    def session_factory(self) -> sessionmaker[Session]:
        factory = self.__dict__.get("_factory")
        if factory is None:
            # Each session remembers the settings it was made from, so what runs in it (the
            # step's own verbs and signals, the wake-ups after commit) uses this Settings'
            # backend and clock rather than the process-wide ones (see settings_of).
            factory = sessionmaker(
                bind=engine_for_workers(self.require_engine()),
                expire_on_commit=False,
                info={SESSION_SETTINGS: self},
            )
            object.__setattr__(self, "_factory", factory)  # cache on the frozen dataclass
        return factory

    def require_engine(self) -> Engine:
        if self.engine is None:
            raise StepConfigurationError(
                "geneva-drive has no database engine: call "
                "geneva_drive.configure(engine=geneva_drive.create_engine(url)) first"
            )
        return self.engine


_lock = threading.Lock()
_current = Settings()
_inline = threading.local()


def configure(**changes: Any) -> Settings:
    """Replace settings (keyword arguments as in :class:`Settings`) and return the result.

    An SQLite engine is prepared for concurrent use (WAL, busy timeout, ``BEGIN IMMEDIATE``).
    Without a ``backend``, the database worker backend is used.
    """
    global _current
    unknown = set(changes) - set(Settings.__dataclass_fields__)
    if unknown:
        raise StepConfigurationError(
            f"configure() got unknown setting(s) {', '.join(sorted(unknown))}; known settings: "
            f"{', '.join(sorted(Settings.__dataclass_fields__))}"
        )
    engine = changes.get("engine")
    if engine is not None:
        prepare_engine(engine)
    with _lock:
        candidate = replace(_current, **changes)
        if candidate.backend is None:
            from .backends.database import DatabaseBackend  # late: backends read settings

            candidate = replace(candidate, backend=DatabaseBackend())
        from .workflow import check_registered_job_options  # late: workflow reads settings

        check_registered_job_options(candidate.backend)  # before anything changes
        _current = candidate
        return _current


def settings() -> Settings:
    return _current


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


@contextlib.contextmanager
def configured(**changes: Any) -> Iterator[Settings]:
    """``configure(**changes)`` for the duration of a block, then restore what was there."""
    global _current
    previous = _current
    try:
        yield configure(**changes)
    finally:
        with _lock:
            _current = previous

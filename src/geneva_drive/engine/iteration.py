"""Resumable steps: an iteration handle whose checkpoints commit the work with the cursor.

A checkpoint writes the cursor and commits the step's session: the database work done since
the previous checkpoint and the new cursor land in one transaction, so after a crash the step
resumes exactly after the last committed item. ``checkpoint_every`` / ``checkpoint_interval``
batch those commits for throughput (the cursor is still only moved with the work it covers).

Interruption (max_iterations, max_runtime, a shutdown request — the process-wide one of
``shutdown.py`` or the runner's own — an operator's pause or cancel) is only ever decided at
a checkpoint, and an interrupting checkpoint always commits first. The workflow row is re-read
only at checkpoints that commit: batching commits also batches that read. Runtimes are
measured with the configured clock, so a ``FrozenClock`` drives them in tests.

Cost: a committing checkpoint is one statement plus the commit on PostgreSQL and SQLite (the
cursor write, the ownership check and the workflow-state read are one ``UPDATE … RETURNING``,
see ``queries.checkpoint_execution``), two on MariaDB. A checkpoint that does not commit runs
no SQL and at most one clock read, so batched checkpoints cost little more than the loop.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from geneva_drive.core.clock import Clock, SystemClock
from geneva_drive.core.errors import CursorTooLargeError
from geneva_drive.core.shutdown import shutdown_requested
from geneva_drive.core.states import WorkflowState
from geneva_drive.definition.flow import FlowControl
from geneva_drive.definition.until import checked_until
from geneva_drive.engine import unit_of_work
from geneva_drive.engine.body_results import Completed, Interrupted
from geneva_drive.engine.run_options import RunOptions
from geneva_drive.storage import queries, serialization

if TYPE_CHECKING:
    from geneva_drive.core.settings import Settings
    from geneva_drive.definition.steps import StepDefinition
    from geneva_drive.definition.workflow import Workflow
    from geneva_drive.storage.models import StepExecution


class _Interrupt(BaseException):
    def __init__(self, wait: timedelta | None = None, until: datetime | None = None) -> None:
        super().__init__()
        self.wait = wait
        self.until = until


class _LostExecution(BaseException):
    """The execution was recovered by another worker while this one still ran it."""


_NEVER = float("inf")
_STOPPED = frozenset({WorkflowState.PAUSED.value, WorkflowState.CANCELED.value})
ITERATIONS = "iterations"  # an execution's metadata: the checkpoints its run counted


class IterableStep:
    """The ``it`` handed to a resumable step."""

    def __init__(
        self,
        session: Session,
        workflow: Workflow,
        execution: StepExecution,
        step_def: StepDefinition,
        options: RunOptions,
        config: Settings,
    ) -> None:
        self._session = session
        self._execution = execution
        self._step = step_def
        self._config = config
        self._clock = config.clock
        self._execution_id = execution.id
        self._workflow_id = workflow.id
        self._owner = options.worker_id
        self._uncommitted = 0
        # Everything a checkpoint decides is precomputed here as plain numbers (inf: never),
        # so that a checkpoint which does not commit costs a few comparisons and at most one
        # clock read.
        every, interval = step_def.checkpoint_every, step_def.checkpoint_interval
        runtime = step_def.max_runtime
        interruptible = options.interruptible
        self._interval = interval.total_seconds() if isinstance(interval, timedelta) else _NEVER
        # Commit when this many checkpoints are uncommitted (every one unless batched).
        if every is None:
            every = 1 if self._interval == _NEVER else sys.maxsize
        self._commit_every: int = every
        limit = (options.max_iterations or step_def.max_iterations) if interruptible else None
        self._iteration_limit: int = limit or sys.maxsize
        self._stop_requested = _stop_requested(options.should_exit) if interruptible else None
        self._watch_workflow = interruptible
        timed = self._interval != _NEVER or (interruptible and isinstance(runtime, timedelta))
        self._elapsed = _stopwatch(self._clock) if timed else None
        start = self._elapsed() if self._elapsed is not None else 0.0
        self._commit_by = start + self._interval  # in stopwatch seconds; commit at or after
        # Interrupt once past this (strictly: "ran longer than max_runtime").
        self._stop_after = (
            start + runtime.total_seconds()
            if interruptible and isinstance(runtime, timedelta)
            else _NEVER
        )
        self.name = step_def.name
        self.cursor: Any = execution.cursor_value
        self.resumed = execution.resuming
        self.advanced = False
        self.iterations = 0

    # -- moving the cursor ---------------------------------------------------------------

    def set(self, value: Any) -> None:
        """Move the cursor to ``value`` and checkpoint."""
        self.cursor = value
        self.advanced = True
        self.checkpoint()

    def advance(self) -> None:
        if isinstance(self.cursor, bool) or not isinstance(self.cursor, int | type(None)):
            raise TypeError(f"advance() needs an integer cursor, got {self.cursor!r}")
        self.set((self.cursor or 0) + 1)

    def checkpoint(self) -> None:
        """Count an iteration; commit work + cursor when due; stop here if asked to."""
        self.iterations += 1
        self._uncommitted += 1
        elapsed = 0.0 if self._elapsed is None else self._elapsed()
        if (
            self.iterations >= self._iteration_limit
            or elapsed > self._stop_after
            or (self._stop_requested is not None and self._stop_requested())
        ):
            self._commit(read_workflow=False)
            raise _Interrupt()
        commit_due = self._uncommitted >= self._commit_every or elapsed >= self._commit_by
        if commit_due and self._commit(read_workflow=self._watch_workflow):
            raise _Interrupt()  # paused or canceled by an operator: stop after this commit

    def skip_to(
        self,
        value: Any,
        wait: timedelta | float | None = None,
        *,
        wait_until: datetime | None = None,
    ) -> None:
        """Store ``value`` as the cursor and continue in a new execution after ``wait`` (or
        at ``wait_until``, an aware datetime)."""
        until = None
        if wait_until is not None:
            where = f"{self._step.label}, workflow id={self._workflow_id}: skip_to()"
            if wait is not None:
                raise ValueError(f"{where}: takes wait= or wait_until=, not both")
            until = checked_until(wait_until, where)
        self.cursor = value
        self.advanced = True
        self._commit(read_workflow=False)
        delta = timedelta(seconds=wait) if isinstance(wait, int | float) else wait
        raise _Interrupt(delta, until)

    # -- iteration helpers -----------------------------------------------------------------

    def iterate_over(self, items: Iterable[Any]) -> Iterator[Any]:
        """Yield items from index ``cursor`` on; the cursor is the index of the next item."""
        if not isinstance(items, Iterable):
            raise TypeError(f"iterate_over() needs an iterable, got {items!r}")
        start = self.cursor or 0
        for index, item in enumerate(items):
            if index < start:
                continue
            yield item
            self.set(index + 1)

    def iterate_over_records(
        self, statement: Select[Any], *, cursor_column: Any = None, batch_size: int = 500
    ) -> Iterator[Any]:
        """Yield rows in ascending ``cursor_column`` order (keyset pages); checkpoint each.

        The cursor is the last processed row's ``cursor_column`` value (the primary key by
        default); the column must be unique and not null, or keyset paging skips rows.
        """
        for rows, key in self._pages(statement, batch_size, cursor_column):
            for row in rows:
                yield row
                self.set(getattr(row, key))

    def iterate_over_batches(
        self, statement: Select[Any], *, batch_size: int = 500, cursor_column: Any = None
    ) -> Iterator[Sequence[Any]]:
        """Yield lists of up to ``batch_size`` rows; the cursor is the last key of each batch."""
        for rows, key in self._pages(statement, batch_size, cursor_column):
            yield rows
            self.set(getattr(rows[-1], key))

    def _pages(
        self, statement: Select[Any], batch_size: int, cursor_column: Any
    ) -> Iterator[tuple[Sequence[Any], str]]:
        """Keyset pages after the cursor; each page is read after the previous one's items."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(
                f"{self._step.label}: batch_size= must be a positive integer, got {batch_size!r}"
            )
        entity = statement.column_descriptions[0]["entity"]
        column = cursor_column if cursor_column is not None else _primary_key(entity)
        key = column.key
        whole_entities = len(statement.column_descriptions) == 1 and (
            statement.column_descriptions[0]["expr"] is entity
        )
        ordered = statement.order_by(None).order_by(column.asc()).limit(batch_size)
        while True:
            # Keyset paging in cursor order: each page starts after the last checkpointed key,
            # so it costs the same on page 1 and page 10,000 (no OFFSET).
            page = ordered if self.cursor is None else ordered.where(column > self.cursor)
            result = self._session.execute(page)
            rows = result.scalars().all() if whole_entities else result.all()
            if not rows:
                return
            yield rows, key
            if len(rows) < batch_size:
                return

    # -- internals -------------------------------------------------------------------------

    def _commit(self, *, read_workflow: bool) -> bool:
        """Commit the work since the last checkpoint with the cursor; True: workflow stopped."""
        encoded = self._encoded_cursor()
        metadata = self._counted_metadata()
        now = self._clock.now()
        owned, state = queries.checkpoint_execution(
            self._session,
            self._execution_id,
            self._workflow_id,
            self._owner,
            now,
            encoded,
            read_workflow=read_workflow,
            metadata=metadata,
        )
        if not owned:
            # Recovered from under us (our lease expired): this run is now the duplicate.
            unit_of_work.rollback(self._session)  # the library's own: passes the guard
            raise _LostExecution()
        # Written with Core: tell the ORM the row holds these now, so it has nothing to flush.
        set_committed_value(self._execution, "cursor", encoded)
        set_committed_value(self._execution, "metadata_json", metadata)
        set_committed_value(self._execution, "updated_at", now)
        # The work since the last checkpoint lands with its cursor (passing the step guard).
        unit_of_work.commit(self._session)
        self._uncommitted = 0
        if self._elapsed is not None:
            self._commit_by = self._elapsed() + self._interval
        return read_workflow and state in _STOPPED

    def record_cursor(self) -> None:
        """Write the cursor (size-checked) and the iteration count to the execution; they
        commit with the session (no extra UPDATE when the last checkpoint stored both)."""
        self._execution.cursor = self._encoded_cursor()
        self._execution.metadata_json = self._counted_metadata()

    def _counted_metadata(self) -> dict[str, Any]:
        """The execution's metadata with this run's iteration count (admin.show reads it).

        The whole dict is written: while the row is in progress under our lease (the
        checkpoint's guard) nobody else writes its metadata, so nothing is overwritten.
        """
        return {**(self._execution.metadata_json or {}), ITERATIONS: self.iterations}

    def _encoded_cursor(self) -> Any:
        limit = self._config.max_cursor_size
        if limit is not None and self.cursor is not None:
            size = serialization.encoded_size(self.cursor)
            if size > limit:
                raise CursorTooLargeError(
                    f"{self._step.label} (execution id={self._execution_id}): tried to store a "
                    f"cursor of {size} bytes, over max_cursor_size={limit}; a cursor is the "
                    "value to resume from — keep it to a key or two, or raise "
                    "configure(max_cursor_size=...)"
                )
        return serialization.encode(self.cursor)


def _stopwatch(clock: Clock) -> Callable[[], float]:
    """Seconds on a fixed origin, read from ``clock``: what runtimes and intervals are measured on.

    The real clock is read through ``time.monotonic()``: a fraction of the cost of
    ``datetime.now()`` at every checkpoint, and immune to wall-clock jumps. Any other clock (a
    ``FrozenClock`` in tests) is read as it is, so moving it drives the limits.
    """
    if type(clock) is SystemClock:
        return time.monotonic
    origin = clock.now()
    return lambda: (clock.now() - origin).total_seconds()


def _stop_requested(should_exit: Callable[[], bool] | None) -> Callable[[], bool]:
    """Rule 3 of the interruption check: the process is shutting down, or this run's runner
    (a ``Worker`` that was stopped) says so."""
    if should_exit is None:
        return shutdown_requested
    return lambda: shutdown_requested() or should_exit()


def _primary_key(entity: Any) -> Any:
    mapper = entity.__mapper__
    if len(mapper.primary_key) != 1:
        raise TypeError(f"{entity.__name__}: pass cursor_column= (composite primary key)")
    return getattr(entity, mapper.primary_key[0].key)


def run_resumable(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition,
    options: RunOptions,
    config: Settings,
) -> Any:
    it = IterableStep(session, workflow, execution, step_def, options, config)
    try:
        step_def.run(workflow, it)
    except _LostExecution:
        return Interrupted()  # phase 3 finds the row no longer in progress and discards it
    except _Interrupt as interrupt:
        result: Completed | Interrupted = Interrupted(interrupt.wait, interrupt.until)
    except FlowControl:
        # Flow control keeps the step's writes, so it must keep the cursor that covers them
        # too — with batched commits the stored cursor may lag behind the work done.
        it.record_cursor()
        raise
    else:
        result = Completed()
    it.record_cursor()
    return result

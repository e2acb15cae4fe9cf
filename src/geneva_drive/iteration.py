"""Resumable steps: an iteration handle whose checkpoints commit the work with the cursor.

A checkpoint writes the cursor and commits the step's session: the database work done since
the previous checkpoint and the new cursor land in one transaction, so after a crash the step
resumes exactly after the last committed item. ``checkpoint_every`` / ``checkpoint_interval``
batch those commits for throughput (the cursor is still only moved with the work it covers).

Interruption (max_iterations, max_runtime, worker shutdown, an operator's pause or cancel) is
only ever decided at a checkpoint, and an interrupting checkpoint always commits first. The
workflow row is re-read only at checkpoints that commit: batching commits also batches that
read. Runtimes are measured with the configured clock, so a ``FrozenClock`` drives them in
tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from . import queries, serialization
from .errors import CursorTooLargeError
from .flow import FlowControl

if TYPE_CHECKING:
    from .config import Settings
    from .executor import Interrupted, RunOptions
    from .models import StepExecution
    from .steps import StepDefinition
    from .workflow import Workflow


class _Interrupt(BaseException):
    def __init__(self, wait: timedelta | None = None) -> None:
        super().__init__()
        self.wait = wait


class _LostExecution(BaseException):
    """The execution was recovered by another worker while this one still ran it."""


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
        self._workflow = workflow
        self._execution = execution
        self._step = step_def
        self._options = options
        self._config = config
        self._started = config.clock.now()
        self._last_commit = self._started
        self._uncommitted = 0
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
        commit_due = self._commit_due()
        interrupt = self._should_interrupt(read_workflow=commit_due)
        if interrupt or commit_due:
            self._commit()
        if interrupt:
            raise _Interrupt()

    def skip_to(self, value: Any, wait: timedelta | float | None = None) -> None:
        """Store ``value`` as the cursor and continue in a new execution after ``wait``."""
        self.cursor = value
        self.advanced = True
        self._commit()
        delta = timedelta(seconds=wait) if isinstance(wait, int | float) else wait
        raise _Interrupt(delta)

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
        for batch in self.iterate_over_batches(
            statement, batch_size=batch_size, cursor_column=cursor_column, _per_item=True
        ):
            yield from batch

    def iterate_over_batches(
        self,
        statement: Select[Any],
        *,
        batch_size: int = 500,
        cursor_column: Any = None,
        _per_item: bool = False,
    ) -> Iterator[Sequence[Any]]:
        """Yield lists of up to ``batch_size`` rows; the cursor is the last key of each batch."""
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
        while True:
            # Keyset paging in cursor order: each page starts after the last checkpointed key,
            # so it costs the same on page 1 and page 10,000 (no OFFSET).
            page = statement.order_by(None).order_by(column.asc()).limit(batch_size)
            if self.cursor is not None:
                page = page.where(column > self.cursor)
            result = self._session.execute(page)
            rows = result.scalars().all() if whole_entities else result.all()
            if not rows:
                return
            if _per_item:
                for row in rows:
                    yield [row]
                    self.set(getattr(row, key))
            else:
                yield rows
                self.set(getattr(rows[-1], key))
            if len(rows) < batch_size:
                return

    # -- internals -------------------------------------------------------------------------

    def _commit_due(self) -> bool:
        every, interval = self._step.checkpoint_every, self._step.checkpoint_interval
        if every is None and interval is None:
            return True
        if every is not None and self._uncommitted >= every:
            return True
        return isinstance(interval, timedelta) and (
            self._config.clock.now() - self._last_commit >= interval
        )

    def _commit(self) -> None:
        self.record_cursor()
        if not queries.still_owns_execution(
            self._session, self._execution.id, self._options.worker_id, self._config.clock.now()
        ):
            # Recovered from under us (our lease expired): this run is now the duplicate.
            self._session.rollback()
            raise _LostExecution()
        self._session.commit()  # the work since the last checkpoint lands with its cursor
        self._uncommitted = 0
        self._last_commit = self._config.clock.now()

    def record_cursor(self) -> None:
        """Write the cursor to the execution (size-checked); it commits with the session."""
        limit = self._config.max_cursor_size
        if limit is not None and self.cursor is not None:
            size = serialization.encoded_size(self.cursor)
            if size > limit:
                raise CursorTooLargeError(
                    f"{self._step.label} (execution id={self._execution.id}): tried to store a "
                    f"cursor of {size} bytes, over max_cursor_size={limit}; a cursor is the "
                    "value to resume from — keep it to a key or two, or raise "
                    "configure(max_cursor_size=...)"
                )
        self._execution.cursor = serialization.encode(self.cursor)

    def _should_interrupt(self, *, read_workflow: bool) -> bool:
        if not self._options.interruptible:
            return False
        limit = self._options.max_iterations or self._step.max_iterations
        if limit is not None and self.iterations >= limit:
            return True
        runtime = self._step.max_runtime
        if isinstance(runtime, timedelta) and self._config.clock.now() - self._started > runtime:
            return True
        if self._options.should_exit is not None and self._options.should_exit():
            return True
        return read_workflow and self._workflow_stopped()

    def _workflow_stopped(self) -> bool:
        from .workflow import Workflow

        state = self._session.execute(
            select(Workflow.state).where(Workflow.id == self._workflow.id)
        ).scalar_one()
        return state in ("paused", "canceled")


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
    from .executor import Completed, Interrupted

    it = IterableStep(session, workflow, execution, step_def, options, config)
    try:
        step_def.run(workflow, it)
    except _LostExecution:
        return Interrupted()  # phase 3 finds the row no longer in progress and discards it
    except _Interrupt as interrupt:
        result: Completed | Interrupted = Interrupted(interrupt.wait)
    except FlowControl:
        # Flow control keeps the step's writes, so it must keep the cursor that covers them
        # too — with batched commits the stored cursor may lag behind the work done.
        it.record_cursor()
        raise
    else:
        result = Completed()
    it.record_cursor()
    return result

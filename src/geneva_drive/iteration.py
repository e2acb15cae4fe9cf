"""Resumable steps: an iteration handle whose checkpoints commit the work with the cursor.

A checkpoint writes the cursor and commits the step's session: the database work done since
the previous checkpoint and the new cursor land in one transaction, so after a crash the step
resumes exactly after the last committed item. ``checkpoint_every`` / ``checkpoint_interval``
batch those commits for throughput (the cursor is still only moved with the work it covers).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from . import serialization
from .errors import CursorTooLargeError

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
        self._started = time.monotonic()
        self._last_commit = time.monotonic()
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
        interrupt = self._should_interrupt()
        if interrupt or self._commit_due():
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
        """Yield rows in ascending ``cursor_column`` order (keyset pages); checkpoint each."""
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
        entity = statement.column_descriptions[0]["entity"]
        column = cursor_column if cursor_column is not None else _primary_key(entity)
        key = column.key
        while True:
            page = statement.order_by(None).order_by(column).limit(batch_size)
            if self.cursor is not None:
                page = page.where(column > self.cursor)
            rows = self._session.execute(page).scalars().all()
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
            time.monotonic() - self._last_commit >= interval.total_seconds()
        )

    def _commit(self) -> None:
        limit = self._config.max_cursor_size
        if limit is not None and self.cursor is not None:
            size = serialization.encoded_size(self.cursor)
            if size > limit:
                raise CursorTooLargeError(
                    f"{self._step.label}: cursor is {size} bytes, over max_cursor_size={limit}; "
                    "keep cursors to a key or two"
                )
        self._execution.cursor = serialization.encode(self.cursor)
        self._session.commit()  # the work since the last checkpoint lands with its cursor
        self._uncommitted = 0
        self._last_commit = time.monotonic()

    def _should_interrupt(self) -> bool:
        if not self._options.interruptible:
            return False
        limit = self._options.max_iterations or self._step.max_iterations
        if limit is not None and self.iterations >= limit:
            return True
        runtime = self._step.max_runtime
        if (
            isinstance(runtime, timedelta)
            and time.monotonic() - self._started > runtime.total_seconds()
        ):
            return True
        if self._options.should_exit is not None and self._options.should_exit():
            return True
        return self._workflow_stopped()

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
    except _Interrupt as interrupt:
        result: Completed | Interrupted = Interrupted(interrupt.wait)
    else:
        result = Completed()
    execution.cursor = serialization.encode(it.cursor)
    return result

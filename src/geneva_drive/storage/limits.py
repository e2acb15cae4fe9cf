"""Limits on inputs, read from the table definitions so that they cannot drift from the schema.

Everything a user names ends up in a bounded column; SQLite would store an over-long string
anyway and PostgreSQL and MariaDB refuse it at flush time with a raw ``DataError``, far from
where it was written. So each name is checked where it enters — at class definition, at
``create()`` — against the length of the column that stores it. (The limits on JSON values,
nesting depth and finite numbers, live with the codec in ``serialization.py``.)
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, String

from geneva_drive.storage.models import Signal, StepExecution, workflows_table


def column_length(column: ColumnElement[Any]) -> int:
    """The declared length of a ``String(n)`` column."""
    if not isinstance(column.type, String) or column.type.length is None:  # pragma: no cover
        raise TypeError(f"{column} is not a bounded string column")
    return column.type.length


_workflows = workflows_table.c
_executions = StepExecution.__table__.c

MAX_WORKFLOW_TYPE = column_length(_workflows.type)
MAX_HERO_TYPE = column_length(_workflows.hero_type)
MAX_HERO_ID = column_length(_workflows.hero_id)
# A step's name is stored in the execution and as the workflow's current/next step.
MAX_STEP_NAME = min(
    column_length(_executions.step_name),
    column_length(_workflows.current_step_name),
    column_length(_workflows.next_step_name),
)
MAX_QUEUE = column_length(_executions.queue)
# A signal's name is stored in the signal row and as what a parked execution awaits.
MAX_SIGNAL_NAME = min(
    column_length(Signal.__table__.c.name), column_length(_executions.awaiting_signal)
)
# Not a name the user chose but one the engine records (a step error's class): cut, not refused.
MAX_ERROR_CLASS = column_length(_executions.error_class_name)

# ``priority`` is an ``Integer`` column: 32 bits on every engine we support.
PRIORITY_RANGE = (-(2**31), 2**31 - 1)

# Waits are added to "now" when a step is scheduled; beyond this the due time would leave the
# range of datetime (year 9999) long before anyone meant it to.
MAX_WAIT = timedelta(days=365 * 100)


def duration_problem(value: Any) -> str | None:
    """Why ``value`` (a timedelta or seconds) is no usable duration — NaN, infinite or longer
    than :data:`MAX_WAIT` — or None when it is fine. Type and sign are each caller's rule."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        return None
    if not math.isfinite(seconds):
        return "must be a finite duration; pass a timedelta or a finite number of seconds"
    if abs(seconds) > MAX_WAIT.total_seconds():
        return (
            f"is longer than the longest supported duration ({MAX_WAIT.days} days); "
            "for a step that waits for an event rather than a time, use wait_for= a signal"
        )
    return None

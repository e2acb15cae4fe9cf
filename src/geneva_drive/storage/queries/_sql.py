"""What every query module shares: state literals, keyset paging, the workflow model, dialects,
PostgreSQL arrays bound as text."""

from __future__ import annotations

import functools
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import (
    String,
    and_,
    bindparam,
    literal_column,
    or_,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from geneva_drive.core.ports import load_workflow_model
from geneva_drive.core.states import ExecutionState
from geneva_drive.storage.models import Base, workflows_table

if TYPE_CHECKING:
    from geneva_drive.storage.models import MappedWorkflow, WorkflowColumns

SWEEPABLE = (ExecutionState.SCHEDULED, ExecutionState.WAITING)


def in_state(column: Any, *states: ExecutionState) -> Any:
    """``state = 'scheduled'`` (or ``IN (…)``), the states written into the SQL as literals.

    Why not parameters: the executions' partial indexes (``… WHERE state = 'scheduled'``, the
    claim's, the lease sweep's, the waiting gauges') are matched against the query's text. psycopg
    prepares a statement on its sixth run and PostgreSQL then plans it once, generically; with
    the state as a parameter that plan cannot use a partial index. The claim then sorted every
    due row for each claim: 14 ms a claim at 8,000 due rows, growing with the backlog, against
    0.13 ms reading the first entry of the partial index. The states are the library's own
    constants, never input.
    """
    literals = [literal_column(f"'{ExecutionState(state).value}'", String) for state in states]
    return column == literals[0] if len(literals) == 1 else column.in_(literals)


def workflow_model() -> type[MappedWorkflow]:
    """The mapped class of the workflows table: ``workflow.Workflow``, the root users subclass.

    Found through the declarative registry, not imported: ``workflow`` is built on this query
    layer (``create()``, the verbs), so the query layer cannot import it back.
    """
    found = _workflow_root.get("class")
    if found is None:
        found = defined_workflow_model()
        if found is None:
            load_workflow_model()  # nothing imported the DSL yet (a script's first query)
            found = defined_workflow_model()
            assert found is not None, "importing the DSL maps the workflows table"
        _workflow_root["class"] = found
    return cast("type[MappedWorkflow]", found)


def defined_workflow_model() -> type[MappedWorkflow] | None:
    """``workflow_model()`` if the DSL is imported, else None — then no workflow class is
    defined in this process either (a query that only reads the table needs neither)."""
    return next(
        (
            cast("type[MappedWorkflow]", mapper.class_)
            for mapper in Base.registry.mappers
            if mapper.local_table is workflows_table and mapper.inherits is None
        ),
        None,
    )


_workflow_root: dict[str, type[Any]] = {}


def mapped_class(workflow: WorkflowColumns) -> type[MappedWorkflow]:
    """The class of a row of the workflows table, as the mapped class it is."""
    return cast("type[MappedWorkflow]", type(workflow))


def keyset(session: Session, stmt: Any) -> list[tuple[datetime, int]]:
    """(sort key, id) rows of a keyset query; the WHERE already rules out NULL keys."""
    return [(at, id_) for at, id_ in session.execute(stmt) if at is not None]


def after_key(column: Any, id_column: Any, after: tuple[datetime, int]) -> Any:
    """``(column, id) > after`` written out, as row-value comparison is not portable."""
    at, last_id = after
    return or_(column > at, and_(column == at, id_column > last_id))


_TRANSIENT_SQLSTATES = {"40001", "40P01", "55P03"}  # serialization, deadlock, lock not available
_TRANSIENT_MYSQL_CODES = {1205, 1213}  # lock wait timeout, deadlock


def is_transient(error: BaseException) -> bool:
    """A database error that says "try again" (deadlock, lock timeout, lost connection).

    Such an error is the database's, not the step's: the executor must not record it as a
    step failure, only let the transaction roll back and the execution run again.
    """
    if not isinstance(error, DBAPIError):
        return False
    if _transient(error):
        return True
    # What the database raised while undoing a transient error: InnoDB rolls the whole
    # transaction back on a deadlock, so the ROLLBACK TO SAVEPOINT that follows one fails
    # ("SAVEPOINT … does not exist"), and that error, not the deadlock, reaches the caller.
    cause, seen = error.__context__, {id(error)}
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, DBAPIError) and _transient(cause):
            return True
        seen.add(id(cause))
        cause = cause.__context__
    return False


def _transient(error: DBAPIError) -> bool:
    if error.connection_invalidated:
        return True
    orig = error.orig
    if getattr(orig, "sqlstate", None) in _TRANSIENT_SQLSTATES:
        return True
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and args[0] in _TRANSIENT_MYSQL_CODES:
        return True
    return "database is locked" in str(orig)


@functools.lru_cache(maxsize=64)
def text_array(names: tuple[str, ...]) -> str:
    """``names`` as PostgreSQL's text form of an array, ``{"a","b"}``, bound as one string
    and cast by the statement (``as_array``). psycopg dumps a list by scanning each element
    with a regular expression, at every execution; the text is made once per tuple."""
    quoted = ('"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"' for name in names)
    return "{" + ",".join(quoted) + "}"


def as_array(name: str) -> Any:
    """The bound parameter ``name``, a :func:`text_array`, as an array of text."""
    from sqlalchemy.dialects.postgresql import ARRAY  # PostgreSQL's statements only

    return sql_cast(bindparam(name, type_=String), ARRAY(String))

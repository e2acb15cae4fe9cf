"""Run the executor's hottest statements on the DBAPI cursor, compiled once.

A no-op step costs about three statements (two UPDATEs and an INSERT). Through SQLAlchemy's
``Connection.execute`` each pays for the compiled-cache lookup, parameter construction, an
execution context, a fresh cursor and a result object: about twice what the driver itself
spends sending the statement and reading the reply. That machinery is most of the worker's
CPU per step, and one worker process is bound by its CPU (the GIL).

So the statements the executor runs on every step — defined as Core constructs in
``queries.py``, like every other — are compiled here once per dialect, and run on the
connection's DBAPI cursor with their bind processors applied by hand. The transaction is
still SQLAlchemy's: the statement runs on the very connection the session has begun, and
commits or rolls back with it.

What SQLAlchemy would otherwise give, and how it is kept:

* **Logging and instrumentation.** An application that logs SQL (``echo``, the
  ``sqlalchemy.engine`` logger) or listens to cursor events (tracing, statement counters)
  must see every statement. When anyone is watching, the statement goes through
  ``Connection.execute`` as usual; only an unobserved connection takes the short path.
* **Errors.** A DBAPI error is raised as SQLAlchemy's own wrapper (``IntegrityError``,
  ``OperationalError``…), with ``connection_invalidated`` set for a lost connection, so
  callers and ``queries.is_transient`` see exactly what the long path raises. The dead
  connection is invalidated by SQLAlchemy when the transaction's rollback then fails.
* **Schema translation.** A connection with a ``schema_translate_map`` takes the long path:
  the compiled text here has no schema rewriting.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError

_SQL_LOGGER = logging.getLogger("sqlalchemy.engine")


class _Plan(NamedTuple):
    sql: str
    # Positional dialects (SQLite's qmark): parameter names in placeholder order.
    positions: tuple[str, ...] | None
    processors: Mapping[str, Callable[[Any], Any]]
    # Values the statement itself binds (literals such as a LIMIT), by name.
    defaults: Mapping[str, Any]
    returns_rows: bool
    # Per column of the rows it returns: the type's result processor, if any has one.
    row_processors: tuple[Callable[[Any], Any] | None, ...] | None


def execute(connection: Connection, stmt: Any, params: dict[str, Any]) -> Any:
    """Run ``stmt`` with ``params``: its first row (None if none) if it returns rows, else its
    rowcount.

    ``stmt`` must be built once and reused (its identity keys the compiled form), and
    ``params`` must give every parameter it binds, by the ``bindparam`` names.
    """
    plan = _plan(stmt, connection.dialect) if _unobserved(connection) else None
    if plan is None:
        result = connection.execute(stmt, params)
        return result.first() if result.returns_rows else result.rowcount
    processors = plan.processors
    if plan.defaults:
        params = {**plan.defaults, **params}
    values = {
        name: (processors[name](value) if name in processors else value)
        for name, value in params.items()
    }
    bound: Any = values if plan.positions is None else [values[name] for name in plan.positions]
    cursor = _cursor(connection)
    try:
        cursor.execute(plan.sql, bound)
        if not plan.returns_rows:
            return cursor.rowcount
        # fetchall: a RETURNING statement left unfinished would stay open in the driver.
        rows = cursor.fetchall()
    except connection.dialect.loaded_dbapi.Error as error:
        raise _wrapped(connection, plan.sql, bound, error, cursor) from error
    if not rows:
        return None
    if plan.row_processors is None:
        return rows[0]
    return tuple(
        value if process is None else process(value)
        for process, value in zip(plan.row_processors, rows[0], strict=True)
    )


_CURSOR = "geneva_drive_direct_cursor"


def _cursor(connection: Connection) -> Any:
    """One cursor per DBAPI connection, kept for its lifetime.

    Not only to save creating one: psycopg caches the adapter it found for each parameter
    type on the cursor, and looking adapters up afresh (through each type's MRO) was the
    larger part of sending a statement. Used by one thread at a time, like its connection.
    """
    fairy = connection.connection
    dbapi_connection = fairy.dbapi_connection
    kept = fairy.info.get(_CURSOR)
    if kept is not None and kept[0] is dbapi_connection:  # not a reconnected record
        return kept[1]
    assert dbapi_connection is not None  # the connection of a begun transaction
    cursor = dbapi_connection.cursor()
    fairy.info[_CURSOR] = (dbapi_connection, cursor)
    return cursor


def _unobserved(connection: Connection) -> bool:
    engine = connection.engine
    dispatch = engine.dispatch
    return not (
        engine.echo
        or _SQL_LOGGER.isEnabledFor(logging.INFO)
        or dispatch.before_cursor_execute
        or dispatch.after_cursor_execute
        or dispatch.before_execute
        or dispatch.after_execute
        or engine.dialect.dispatch.handle_error
        or connection.get_execution_options().get("schema_translate_map")
    )


@functools.lru_cache(maxsize=256)
def _plan(stmt: Any, dialect: Dialect) -> _Plan | None:
    compiled = stmt.compile(dialect=dialect)
    if compiled.post_compile_params or compiled.literal_execute_params:
        return None  # expanding parameters are rendered per execution: keep the long path
    if compiled.insert_prefetch or compiled.update_prefetch:
        return None  # a Python-side column default (onupdate=…) is computed per execution
    processors: dict[str, Callable[[Any], Any]] = {}
    defaults: dict[str, Any] = {}
    for bind, name in compiled.bind_names.items():
        if not bind.required and bind.callable is None:
            defaults[name] = bind.value  # a literal of the statement (anonymous, e.g. LIMIT 1)
        elif name != bind.key:
            return None  # the dialect escaped the name: let SQLAlchemy map it
        processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if processor is not None:
            processors[name] = processor
    positions = tuple(compiled.positiontup) if compiled.positional else None
    columns = stmt.selected_columns if stmt.is_select else compiled.effective_returning or ()
    row_processors = tuple(
        column.type.dialect_impl(dialect).result_processor(dialect, None) for column in columns
    )
    return _Plan(
        compiled.string,
        positions,
        processors,
        defaults,
        bool(columns),
        row_processors if any(row_processors) else None,
    )


def _wrapped(connection: Connection, sql: str, params: Any, error: Any, cursor: Any) -> Exception:
    dialect = connection.dialect
    lost = dialect.is_disconnect(error, connection.connection.dbapi_connection, cursor)
    # The class SQLAlchemy would raise for this DBAPI error (IntegrityError, OperationalError…).
    wrapped: Exception = DBAPIError.instance(
        sql,
        params,
        error,
        dialect.loaded_dbapi.Error,
        connection_invalidated=lost,
        dialect=dialect,
    )
    return wrapped

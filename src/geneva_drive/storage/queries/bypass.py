"""Where geneva-drive steps around SQLAlchemy's ORM and execution layer, and why.

Three shortcuts, all confined to this module (the only one relying on SQLAlchemy internals
beyond the public API; the versions it is tested on are pinned in ``pyproject.toml``):

**The ORM bypass.** The executor's own bookkeeping (states, stamps, leases) is written with
Core ``UPDATE``/``INSERT`` statements rather than through the unit of work, and the loaded
instances are brought in line by hand (``mark_written``, ``as_loaded``). Row locks taken in a
transaction are remembered with their instances (``lock_workflow``/``lock_execution``), as is
the transaction's connection, so re-locking costs no round trip.

**The held connection.** A worker's run (a claim and the steps chained after it) begins
all its transactions on one connection instead of one checkout per transaction, while its
session stays bound to the engine (``hold_connection``, below).

**The DBAPI short path.**
A no-op step costs about three statements (two UPDATEs and an INSERT). Through SQLAlchemy's
``Connection.execute`` each pays for the compiled-cache lookup, parameter construction, an
execution context, a fresh cursor and a result object: about twice what the driver itself
spends sending the statement and reading the reply. That machinery is most of the worker's
CPU per step, and one worker process is bound by its CPU (the GIL).

So the statements the executor runs on every step — defined as Core constructs in
the ``queries`` package, like every other — are compiled here once per dialect, and run on the
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
  callers and ``queries.is_transient`` see exactly what the long path raises. A lost
  connection is invalidated (and the pool told) as ``Connection.execute`` would.
* **Schema translation.** A connection with a ``schema_translate_map`` takes the long path:
  the compiled text here has no schema rewriting.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from sqlalchemy import (
    Connection,
    bindparam,
    event,
    select,
    update,
)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, InvalidRequestError
from sqlalchemy.orm import Session, make_transient_to_detached
from sqlalchemy.orm.attributes import instance_state, set_committed_value

from geneva_drive.storage.dialects import dialect_of
from geneva_drive.storage.models import StepExecution, WorkflowColumns
from geneva_drive.storage.queries._sql import workflow_model

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
    # Numbered placeholders for psycopg's RawCursor (see _numbered); ``positions`` has
    # the parameters in their numbers' order.
    raw: bool = False


def execute_direct(connection: Connection, stmt: Any, params: dict[str, Any]) -> Any:
    """Run ``stmt`` with ``params``: its first row (None if none) if it returns rows, else its
    rowcount.

    ``stmt`` must be built once and reused (its identity keys the compiled form), and
    ``params`` must give every parameter it binds, by the ``bindparam`` names.
    """
    plan = _plan(stmt, connection.dialect) if _unobserved(connection) else None
    if plan is None:
        result = connection.execute(stmt, params)
        return result.first() if result.returns_rows else result.rowcount
    bound = _bound(plan, params)
    cursor = None
    try:
        # Inside: making the cursor is where a connection found closed fails first.
        cursor = _cursor(connection, raw=plan.raw)
        cursor.execute(plan.sql, bound)
        return _result(plan, cursor)
    except connection.dialect.loaded_dbapi.Error as error:
        raise _wrapped(connection, plan.sql, bound, error, cursor) from error


def execute_pipelined(
    connection: Connection, first: tuple[Any, dict[str, Any]], then: tuple[Any, dict[str, Any]]
) -> tuple[Any, Any]:
    """:func:`execute_direct` of two statements in one round trip (psycopg's pipeline mode).

    The server still runs them one after the other, and each takes its own snapshot when it
    starts: the second begins only once the first has finished, lock waits included. If
    the first fails, the second does not run. Where there is no pipeline (another driver)
    or someone observes the connection, they are sent one after the other.
    """
    dialect = connection.dialect
    driver: Any = connection.connection.driver_connection
    observed = not _unobserved(connection)
    plan1 = None if observed else _plan(first[0], dialect)
    plan2 = None if observed else _plan(then[0], dialect)
    if plan1 is None or plan2 is None or not hasattr(driver, "pipeline"):
        return execute_direct(connection, *first), execute_direct(connection, *then)
    bound1, bound2 = _bound(plan1, first[1]), _bound(plan2, then[1])
    cursor = None
    try:
        cursor = _cursor(connection, raw=plan1.raw)
        second = _cursor(connection, _SECOND_CURSOR, raw=plan2.raw)
        with driver.pipeline():
            cursor.execute(plan1.sql, bound1)
            second.execute(plan2.sql, bound2)
        return _result(plan1, cursor), _result(plan2, second)
    except dialect.loaded_dbapi.Error as error:
        sql = f"{plan1.sql};\n{plan2.sql}"
        raise _wrapped(connection, sql, (bound1, bound2), error, cursor) from error


def execute_alone(connection: Connection, stmt: Any, params: dict[str, Any]) -> Any:
    """:func:`execute_direct` of a statement that is its transaction's first and last: run
    on its own, it is committed by the server as it ends.

    psycopg begins a transaction with a BEGIN of its own, one round trip, before its first
    statement, and ends it with a COMMIT, another. A transaction that holds one statement
    needs neither: in autocommit mode the statement is the transaction, atomic by itself,
    one round trip instead of three, and the caller's ``commit()`` then finds nothing left
    to send. Taken only where this transaction has sent nothing yet (psycopg's connection
    is idle) and would begin as the server's default would (no isolation level, read-only
    or deferrable flag of the driver's own); otherwise, or on another driver, the statement
    joins the transaction as :func:`execute_direct` runs it.

    The caller promises that nothing after the statement writes in this transaction, and
    must not count on a lock the statement took: it is released as the statement ends.
    """
    driver: Any = connection.connection.driver_connection
    dialect = connection.dialect
    if not (dialect.driver == "psycopg" and not dialect.is_async and _idle_with_defaults(driver)):
        return execute_direct(connection, stmt, params)
    driver.autocommit = True
    try:
        return execute_direct(connection, stmt, params)
    finally:
        # A connection lost mid-statement is closed (and invalidated): nothing to restore.
        if not driver.closed:
            driver.autocommit = False


def driver_in_transaction(connection: Connection) -> bool:
    """Whether the driver has begun a transaction on ``connection`` (psycopg; any other
    driver is taken to have: a statement of :func:`execute_alone` is then not committed)."""
    driver: Any = connection.connection.driver_connection
    if connection.dialect.driver != "psycopg":
        return True
    return bool(driver.info.transaction_status != _PSYCOPG_IDLE)


def _idle_with_defaults(driver: Any) -> bool:
    return bool(
        driver.info.transaction_status == _PSYCOPG_IDLE
        and not driver.autocommit
        and driver.isolation_level is None
        and driver.read_only is None
        and driver.deferrable is None
    )


_PSYCOPG_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE, without importing the driver here


def _bound(plan: _Plan, params: dict[str, Any]) -> Any:
    processors = plan.processors
    if plan.defaults:
        params = {**plan.defaults, **params}
    values = {
        name: (processors[name](value) if name in processors else value)
        for name, value in params.items()
    }
    return values if plan.positions is None else [values[name] for name in plan.positions]


def _result(plan: _Plan, cursor: Any) -> Any:
    if not plan.returns_rows:
        return cursor.rowcount
    # fetchall: a RETURNING statement left unfinished would stay open in the driver.
    rows = cursor.fetchall()
    if not rows:
        return None
    if plan.row_processors is None:
        return rows[0]
    return tuple(
        value if process is None else process(value)
        for process, value in zip(plan.row_processors, rows[0], strict=True)
    )


_CURSOR = "geneva_drive_direct_cursor"


_SECOND_CURSOR = "geneva_drive_direct_cursor_2"  # a pipeline's second statement's


def _cursor(connection: Connection, key: str = _CURSOR, *, raw: bool = False) -> Any:
    """One cursor per DBAPI connection, kept for its lifetime.

    Not only to save creating one: psycopg caches the adapter it found for each parameter
    type on the cursor, and looking adapters up afresh (through each type's MRO) was the
    larger part of sending a statement. Used by one thread at a time, like its connection.
    """
    fairy = connection.connection
    dbapi_connection = fairy.dbapi_connection
    key = f"{key}_raw" if raw else key
    kept = fairy.info.get(key)
    if kept is not None and kept[0] is dbapi_connection:  # not a reconnected record
        return kept[1]
    assert dbapi_connection is not None  # the connection of a begun transaction
    cursor = _raw_cursor(dbapi_connection) if raw else dbapi_connection.cursor()
    fairy.info[key] = (dbapi_connection, cursor)
    return cursor


def _raw_cursor(dbapi_connection: Any) -> Any:
    from psycopg import RawCursor  # psycopg is optional: only a psycopg plan is raw

    return RawCursor(dbapi_connection)


def _unobserved(connection: Connection) -> bool:
    engine = connection.engine
    dispatch = engine.dispatch
    return not (
        engine.echo
        # An asyncio driver (a worker's async lane) is reached through SQLAlchemy's adapter,
        # whose cursor awaits on the loop: the short path's raw psycopg cursor, pipeline and
        # autocommit switch are the sync driver's. The lane is bound by I/O, not by this CPU.
        or engine.dialect.is_async
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
    sql, raw = compiled.string, _parsed_every_time(compiled, dialect)
    positions = tuple(compiled.positiontup) if compiled.positional else None
    if raw:
        sql, positions = _numbered(sql)
    columns = stmt.selected_columns if stmt.is_select else compiled.effective_returning or ()
    row_processors = tuple(
        column.type.dialect_impl(dialect).result_processor(dialect, None) for column in columns
    )
    return _Plan(
        sql,
        positions,
        processors,
        defaults,
        bool(columns),
        row_processors if any(row_processors) else None,
        raw,
    )


def _parsed_every_time(compiled: Any, dialect: Dialect) -> bool:
    """Whether psycopg would parse this statement's text at every ``execute()``: it keeps
    what it parsed only for a text of at most 4,096 characters with at most 50 parameters
    (``psycopg._queries.MAX_CACHED_STATEMENT_LENGTH`` and ``…_PARAMS``)."""
    return (
        dialect.driver == "psycopg"
        and not compiled.positional
        and (len(compiled.string.encode()) > 4096 or len(compiled.bind_names) > 50)
    )


_PYFORMAT = re.compile(r"%%|%\(([^)]+)\)s")


def _numbered(sql: str) -> tuple[str, tuple[str, ...]]:
    """``%(name)s`` placeholders as PostgreSQL's own ``$1``, ``$2``… (a name used twice keeps
    its number), ``%%`` as ``%``: the text psycopg's ``RawCursor`` sends as it is. The names in
    the order of their numbers.

    For a statement psycopg would otherwise parse for its placeholders at every
    ``execute()`` (:func:`_parsed_every_time`): done here once instead. (For a shorter one
    psycopg's own cache is as cheap: the raw cursor measured no gain there.)
    """
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        return f"${numbers.setdefault(name, len(numbers) + 1)}"

    return _PYFORMAT.sub(number, sql), tuple(numbers)


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
    if lost:
        _invalidate(connection, wrapped)
    return wrapped


def _invalidate(connection: Connection, error: Exception) -> None:
    """What ``Connection.execute`` does on a lost connection, which the short path skipped.

    Without it the dead connection stays in the transaction: ``session.rollback()`` then
    fails on it again ("the connection is lost"), and the executor's hand-back of the step
    never runs, leaving it in progress under a live lease. Invalidated, the rollback just
    discards it. The pool is told too, so the other connections it opened before the loss
    (as dead after a server restart) are replaced on their next checkout, not used and failed.
    """
    if connection.invalidated:
        return
    connection.engine.pool._invalidate(connection.connection, error)
    connection.invalidate(error)


# -- the ORM bypass ------------------------------------------------------------------------


def lock_workflow(session: Session, workflow_id: int) -> WorkflowColumns | None:
    """``SELECT … FOR UPDATE`` the workflow row and refresh the instance from it.

    On SQLite ``FOR UPDATE`` is not rendered; the transaction already holds the database write
    lock from ``BEGIN IMMEDIATE`` (see ``engine.py``), which is stronger. Re-locking a row the
    transaction already holds is re-entrant on every engine.
    """
    cached = _locked_instance(session, workflow_id)
    if cached is not None:
        # Already locked and loaded in this very transaction: nobody else can have changed
        # the row since, so this instance is the truth. Saves a round trip per scheduling
        # call in phase 3, and phase 1's re-read after the claim.
        return cached
    stmt = (
        select(workflow_model())
        .where(workflow_model().id == workflow_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    workflow = session.execute(stmt).scalar_one_or_none()
    if workflow is not None:
        remember_workflow_lock(session, workflow_id, workflow)
    return workflow


def lock_workflow_state_with(
    session: Session, workflow: WorkflowColumns, stmt: Any, params: dict[str, Any]
) -> tuple[str | None, Any]:
    """:func:`lock_workflow` for a caller that needs only the row's ``state``, with ``stmt``
    run right after the lock in the same round trip (:func:`execute_pipelined`): the state
    (None if the row is gone) and ``stmt``'s first row. ``stmt`` is sent before the state is
    known, so it must check the state itself.

    The state is written into ``workflow``; the instance's other columns are not reloaded
    (the ORM's reload costs several times the statement: ``signal()``'s hot path). When
    this transaction holds the lock already, only ``stmt`` runs.
    """
    connection = connection_of(session)
    cached = _locked_instance(session, workflow.id)
    if cached is not None:
        return str(cached.state), execute_direct(connection, stmt, params)
    lock = (_lock_state_stmt(), {"workflow_id": workflow.id})
    row, result = execute_pipelined(connection, lock, (stmt, params))
    if row is None:
        return None, result
    mark_written(session, workflow, {"state": row[0]})
    remember_workflow_lock(session, workflow.id)  # held, but the instance is not the truth
    return str(row[0]), result


@functools.cache
def _lock_state_stmt() -> Any:
    table = workflow_model().__table__
    return select(table.c.state).where(table.c.id == bindparam("workflow_id")).with_for_update()


_HELD = "geneva_drive_held_workflow_locks"


def _locked_instance(session: Session, workflow_id: int) -> WorkflowColumns | None:
    """The instance this transaction locked and loaded ``workflow_id``'s row into, if any."""
    held = _held_workflow_locks(session)
    return held.get(workflow_id) if held is not None else None


def _held_workflow_locks(session: Session) -> dict[int, WorkflowColumns | None] | None:
    """WorkflowColumns ids locked in the session's current top-level transaction (None: unknown).

    Inside a savepoint we never trust the cache: rolling back to a savepoint releases the
    row locks taken after it, so a lock remembered there may be gone.
    """
    entry = held_locks(session)
    return None if entry is None else entry[0]


def held_locks(
    session: Session, *, create: bool = False
) -> tuple[dict[int, WorkflowColumns | None], dict[int, StepExecution]] | None:
    """(workflows, executions) locked and loaded in the current top-level transaction."""
    if session.in_nested_transaction():
        return None
    transaction = session.get_transaction()
    if transaction is None:
        return None
    entry = session.info.get(_HELD)
    if entry is None or entry[0] is not transaction:
        if not create:
            return None
        entry = session.info[_HELD] = (transaction, {}, {})
    return entry[1], entry[2]


def remember_workflow_lock(
    session: Session, workflow_id: int, workflow: WorkflowColumns | None = None
) -> None:
    """Note that this transaction holds ``workflow_id``'s row lock (and its loaded instance;
    the strong reference keeps it in the session's weak identity map)."""
    held = held_locks(session, create=True)
    if held is not None and (workflow is not None or workflow_id not in held[0]):
        held[0][workflow_id] = workflow


def lock_execution(
    session: Session, execution_id: int, *, only_if: str | None = None
) -> StepExecution | None:
    """Lock one execution row (only after its workflow row — see the module docstring).

    ``only_if``: lock it only while it is in that state; None if it is not (or is gone). On
    PostgreSQL the state the statement's snapshot sees is checked before the lock is asked
    for, so a row already in another state is never waited for (the wait this avoids is
    described in ``prepare.lock_both``).
    """
    held = held_locks(session)
    cached = held[1].get(execution_id) if held is not None else None
    if cached is not None:
        # Locked and loaded by this transaction's claim: as current as a re-read would be.
        return cached if only_if is None or cached.state == only_if else None
    stmt = select(StepExecution).where(StepExecution.id == execution_id)
    if only_if is not None:
        stmt = stmt.where(StepExecution.state == only_if)
    stmt = stmt.with_for_update().execution_options(populate_existing=True)
    return session.execute(stmt).scalar_one_or_none()


def write_through(
    session: Session,
    instance: Any,
    values: dict[str, Any],
    *,
    expect: dict[str, Any] | None = None,
) -> bool:
    """Write ``values`` and the instance's pending column changes in one Core ``UPDATE``.

    The executor's own bookkeeping (states, stamps, leases) goes this way rather than through
    the unit of work: a flush costs several times the statement it emits, and it would run
    twice per step. The loaded instance is kept in step with ``set_committed_value`` (the ORM
    then has nothing left to flush for it), so later code reads what the row now holds.
    ``values`` are by attribute name.

    ``expect``: write only while these columns still hold these values (NULL-safe); the
    rowcount is the check. False means nothing was written and the instance is untouched.
    On PostgreSQL and MySQL/MariaDB the UPDATE takes the row lock, waiting for a holder and
    re-checking the condition on the row it then finds. Without ``expect`` the caller
    already holds the workflow row lock.
    """
    mapper = type(instance).__mapper__
    state = instance_state(instance)
    pending = state.committed_state
    if pending:
        columns = mapper.column_attrs
        values = {
            **{key: getattr(instance, key) for key in pending if key in columns},
            **values,
        }
    stmt = update_by_id(mapper, tuple(values), tuple(expect or ()))
    written = execute_direct(connection_of(session), stmt, update_params(instance, values, expect))
    if expect and not written:
        return False
    mark_written(session, instance, values)
    return True


_CONNECTION = "geneva_drive_connection"


def connection_of(session: Session) -> Connection:
    """``session.connection()``, remembered for the session's current transaction.

    The hot path asks for it once per statement, and the session's answer runs through its
    transaction state machine each time. A transaction keeps one connection to its end
    (savepoints included), so the remembered one is the same object.
    """
    transaction = session.get_transaction()
    kept = session.info.get(_CONNECTION)
    if kept is not None and transaction is not None and kept[0] is transaction:
        connection: Connection = kept[1]
        return connection
    connection = _connection_for_transaction(session)
    session.info[_CONNECTION] = (session.get_transaction(), connection)
    return connection


# -- the connection a step thread holds --------------------------------------------------------
#
# A session bound to the engine checks a connection out of the pool for each transaction and
# gives it back (the pool's reset included) at each commit: four times for a claim and the
# two steps chained after it, 8 % of a step's CPU on one thread (4 % in a worker). The executor's
# session instead holds one connection for the whole run, and its transactions begin on it.
# The session stays bound to the *engine*: ``session.get_bind()`` is what the application's
# code sees, and a session it opens on that bind must stay a transaction of its own (bound
# to a connection already in a transaction, SQLAlchemy would silently join it instead).

_HELD_CONNECTION = "geneva_drive_held_connection"


def hold_connection(session: Session, connection: Connection) -> None:
    """Begin ``session``'s transactions on ``connection`` (not in a transaction) from now on."""
    session.info[_HELD_CONNECTION] = connection


def _connection_for_transaction(session: Session) -> Connection:
    held: Connection | None = session.info.get(_HELD_CONNECTION)
    if held is not None:
        try:
            # Registered for the engine too: the session's later requests find it there.
            return session.connection(bind_arguments={"bind": held})
        except InvalidRequestError:
            pass  # this transaction already has one (a body's query began it)
    return session.connection()


def begin_on_held_connection(session: Session) -> None:
    """Begin a transaction on the held connection now, so that the step body's own queries
    run on it, where beginning sends nothing to the server (psycopg and PyMySQL begin with
    their first statement). Not on SQLite: there a transaction begins with ``BEGIN
    IMMEDIATE``, which would hold the database's write lock for the whole of the body."""
    held: Connection | None = session.info.get(_HELD_CONNECTION)
    if held is not None and not dialect_of(held).single_writer and not session.in_transaction():
        connection_of(session)


@event.listens_for(Session, "after_soft_rollback")
def _reset_held_connection(session: Session, rolled_back: Any) -> None:
    # What the pool does to a connection given back, for the held one. A transaction whose
    # COMMIT failed is over for SQLAlchemy but not always for the driver: SQLite keeps it
    # open after a busy or refused commit, and the next BEGIN would fail. Only when a whole
    # transaction that ran on the held connection rolls back (never on the hot path, where
    # every transaction commits).
    held: Connection | None = session.info.get(_HELD_CONNECTION)
    kept = session.info.get(_CONNECTION)
    if held is None or kept is None or kept[0] is not rolled_back or kept[1] is not held:
        return
    if held.invalidated or held.in_transaction():
        return
    try:
        held.dialect.do_rollback(held.connection)
    except Exception:
        # Lost under us (a restart, a closed file): a fresh one is connected at the next
        # begin. Raising here would stop the rollback's caller from handing the step back.
        held.invalidate()


def mark_written(session: Session, instance: Any, values: dict[str, Any]) -> None:
    """Bring ``instance`` in line with the row an UPDATE just wrote ``values`` to."""
    state = instance_state(instance)
    if not state.modified and not state.expired_attributes:
        # Nothing pending or expired: the loaded values are simply replaced, as a load does.
        state.dict.update(values)
        return
    for key, value in values.items():
        set_committed_value(instance, key, value)
    if state.modified and not state.committed_state:
        # Every pending column change went out with this UPDATE, but the session still lists
        # the instance as modified and would run an (empty, yet costly) flush for it. This
        # is what a flush itself does to the instances it wrote.
        state._commit_all(state.dict, session.identity_map)


@functools.lru_cache(maxsize=128)
def update_by_id(
    mapper: Any, keys: tuple[str, ...], expected: tuple[str, ...], prefix: str = ""
) -> Any:
    # Built once per shape: SQLAlchemy then reuses the compiled form from its cache.
    table = mapper.local_table
    columns = mapper.column_attrs
    stmt = update(table).where(table.c.id == bindparam(f"{prefix}pk"))
    for key in expected:
        column = columns[key].columns[0]
        stmt = stmt.where(column.is_not_distinct_from(bindparam(f"{prefix}e_{key}")))
    return stmt.values({columns[key].columns[0]: bindparam(f"{prefix}v_{key}") for key in keys})


def update_params(
    instance: Any, values: dict[str, Any], expect: dict[str, Any] | None, prefix: str = ""
) -> dict[str, Any]:
    params = {f"{prefix}v_{key}": value for key, value in values.items()}
    params[f"{prefix}pk"] = instance.id
    if expect:
        params.update({f"{prefix}e_{key}": value for key, value in expect.items()})
    return params


def as_loaded(
    session: Session, mapper: Any, values: dict[str, Any], *, from_select: bool = False
) -> Any:
    """An instance of ``mapper`` holding ``values`` as loaded, persistent in ``session``.

    What a SELECT would give, without the ORM's loading machinery: every column set as
    loaded (none expired, so reading it never goes back to the database), made persistent
    without a flush. The constructor would instead record each value as a change to flush.
    Only for a session that does not hold this identity yet. ``from_select``: the values were
    read, not written, so the class's ``load`` hooks (``@reconstructor``) run, as on a load.
    """
    manager = mapper.class_manager
    instance = manager.new_instance()
    state = instance_state(instance)
    state.dict.update(values)
    make_transient_to_detached(instance)
    # What session.add() does, without its cascade: a new instance holding column values
    # only has no related objects to cascade to, and walking its relationships to find
    # that out was a twentieth of a step's CPU.
    session._save_or_update_impl(state)
    if from_select and manager.dispatch.load:
        manager.dispatch.load(state, None)  # no Query behind it, as after Session.merge()
    return instance


def as_inserted(session: Session, mapper: Any, values: dict[str, Any]) -> Any:
    """:func:`as_loaded` for a row the session's transaction has just inserted.

    It enters the session as already persistent (no flush), so SQLAlchemy's rollback — which
    expunges the objects *its* flushes inserted — does not know the row is gone. Left in the
    identity map, the instance would load nothing, and clash with the next row to take its id
    (SQLite hands a rolled-back id out again). So it is expunged if the transaction (or the
    savepoint) it was inserted in rolls back.
    """
    instance = as_loaded(session, mapper, values)
    transaction = session.get_nested_transaction() or session.get_transaction()
    root = session.get_transaction()
    entry: tuple[Any, list[tuple[Any, Any]]] | None = session.info.get(_INSERTED)
    if entry is None or entry[0] is not root:  # a new top-level transaction: start afresh
        entry = session.info[_INSERTED] = (root, [])
    entry[1].append((transaction, instance))
    return instance


_INSERTED = "geneva_drive_inserted_instances"


@event.listens_for(Session, "after_soft_rollback")
def _expunge_rolled_back(session: Session, rolled_back: Any) -> None:
    # Listened on the class, not per session: a worker makes a session per claim, and an
    # instance-level listener cost more to set up than the rest of the session (11 µs).
    entry = session.info.get(_INSERTED)
    if entry is None:
        return
    kept = []
    for transaction, instance in entry[1]:
        if inside(transaction, rolled_back):
            if instance in session:
                session.expunge(instance)
        else:
            kept.append((transaction, instance))
    entry[1][:] = kept


def inside(transaction: Any, outer: Any) -> bool:
    """Whether ``transaction`` is ``outer`` or a savepoint within it."""
    while transaction is not None:
        if transaction is outer:
            return True
        transaction = transaction.parent
    return False


def mark_written_if_loaded(
    session: Session, mapped: Any, row_id: int, values: dict[str, Any]
) -> None:
    """:func:`mark_written` for the row ``row_id`` of ``mapped``, if the session holds it."""
    key = sa_inspect(mapped).identity_key_from_primary_key((row_id,))
    instance = session.identity_map.get(key)
    if instance is not None:
        mark_written(session, instance, values)


def rollback_cause(session: Session) -> BaseException | None:
    """The error that rolled back the session's (now inactive) transaction; None if unknown.

    A flush that fails (or an autoflush, or a statement on a lost connection) rolls the
    transaction back and leaves the session refusing every statement until ``rollback()``.
    SQLAlchemy keeps that error on the transaction (``_rollback_exception``, the one it quotes
    in ``PendingRollbackError``); there is no public accessor.
    """
    error = getattr(session.get_transaction(), "_rollback_exception", None)
    return error if isinstance(error, BaseException) else None

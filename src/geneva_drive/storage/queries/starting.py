"""Inserting new workflows with their first execution: ``create()`` and ``create_many()``.

The database is the arbiter of "one ongoing workflow per class and hero" (the partial unique
index; a unique generated column on MySQL/MariaDB). A start that loses to it must leave the
caller's transaction usable and say so per workflow, without a savepoint's two round trips:

- PostgreSQL and SQLite: ``INSERT … ON CONFLICT DO NOTHING`` — a refused row is simply not
  inserted (no error, so PostgreSQL does not abort the transaction). The table's unique keys
  besides the primary key are that index and a child's ``(parent_id, child_key)``, which only
  a child's start sets — and it looks for the child of that key when refused — so the
  untargeted form is exact.
  PostgreSQL also waits for an uncommitted competitor and then decides, as a plain INSERT
  would. There, ``create()`` is one statement: the workflow's INSERT, its first execution's
  INSERT and (when the caller's commit is to wake workers) ``pg_notify`` as data-modifying
  CTEs, one round trip.
- MySQL/MariaDB: a plain INSERT; InnoDB rolls back only the failing statement on a duplicate
  key (error 1062), so the transaction stays as it was.

One strategy per kind of database, chosen once from what its dialect can do
(:func:`starter_for`); callers never ask which database it is.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    String,
    Text,
    bindparam,
    cast,
    func,
    insert,
    select,
    true,
    tuple_,
)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.exc import IntegrityError

from geneva_drive.core.states import WorkflowState
from geneva_drive.storage.dialects import Dialect, dialect_of
from geneva_drive.storage.models import StepExecution
from geneva_drive.storage.queries._sql import workflow_model
from geneva_drive.storage.queries.bypass import execute_direct
from geneva_drive.storage.queries.coordination import NOTIFY_CHANNEL

_MYSQL_DUPLICATE_KEY = 1062
# Rows per multi-row INSERT of a bulk start: few round trips, statements of a bounded size
# (each row binds ~10 workflow or ~25 execution parameters; PostgreSQL takes 65,535 per
# statement, SQLite 32,766).
BULK_ROWS = 1000
PG_BULK_ROWS = 10_000  # PostgreSQL: heroes per statement (two array parameters)


def workflow_row(values: dict[str, Any]) -> dict[str, Any]:
    """Every column of a new workflow but ``id``, by attribute name: ``values``, else NULL."""
    row: dict[str, Any] = dict.fromkeys(_workflow_keys())
    row.update(values)
    return row


def execution_row(values: dict[str, Any]) -> dict[str, Any]:
    """Every column of a new execution but ``id``: ``values``, else NULL (``updated_at`` is
    ``created_at``)."""
    row: dict[str, Any] = dict.fromkeys(_execution_keys())
    row.update(values)
    row["updated_at"] = row["created_at"]
    return row


# The columns a start writes itself; any other column with a default (a server default, or a
# Python-side one) is left out of the INSERT, so that the database or SQLAlchemy fills it in
# as for an ORM flush — never overwritten with NULL.
_WORKFLOW_WRITES = frozenset(
    {"type", "hero_type", "hero_id", "state", "next_step_name", "allow_multiple"}
    | {"metadata_json", "created_at", "updated_at"}
)
_EXECUTION_WRITES = frozenset(
    {"workflow_id", "step_name", "state", "scheduled_for", "queue", "priority"}
    | {"created_at", "updated_at"}
)


def _insert_keys(mapped: Any, writes: frozenset[str]) -> tuple[str, ...]:
    keys = []
    for attr in sa_inspect(mapped).column_attrs:
        column = attr.columns[0]
        if attr.key == "id":
            continue
        if attr.key in writes or (column.default is None and column.server_default is None):
            keys.append(attr.key)
    return tuple(keys)


@functools.cache
def _workflow_keys() -> tuple[str, ...]:
    return _insert_keys(workflow_model(), _WORKFLOW_WRITES)


@functools.cache
def _execution_keys() -> tuple[str, ...]:
    return _insert_keys(StepExecution, _EXECUTION_WRITES)


Hero = tuple[str | None, str | None]  # (hero_type, hero_id)
# A workflow a bulk start inserted: (its id, its hero, its first execution's id, its input as
# stored — what tells hero-less ones apart).
Started = tuple[int, Hero, int, Any]


class Starter:
    """Inserts new workflows; ``None`` (or a missing row) means the unique index refused it."""

    def insert_one(
        self,
        connection: Connection,
        workflow: dict[str, Any],
        first: dict[str, Any] | None,
        wake_queue: str | None,
    ) -> tuple[int, int | None] | None:
        """(workflow id, first execution id), or None when refused. ``wake_queue``: NOTIFY
        that queue in this transaction too (PostgreSQL only)."""
        workflow_id = self.insert_workflow(connection, workflow)
        if workflow_id is None:
            return None
        if first is None:
            return workflow_id, None
        return workflow_id, _insert_execution(connection, {**first, "workflow_id": workflow_id})

    def insert_workflow(self, connection: Connection, workflow: dict[str, Any]) -> int | None:
        row = execute_direct(connection, _workflow_insert(dialect_of(connection)), workflow)
        return None if row is None else int(row[0])

    def start_many(
        self,
        connection: Connection,
        workflow: dict[str, Any],
        heroes: Sequence[Hero],
        first: dict[str, Any],
        wake_queue: str | None,
        inputs: Sequence[Any] | None = None,
    ) -> list[Started]:
        """Insert one workflow (``workflow``'s columns) per hero, each hero at most once, with
        its first execution (``first``'s) and its own input (``inputs``, in the order of
        ``heroes``; None: ``workflow``'s): see :data:`Started`. Heroes the unique index
        refused are missing."""
        given = inputs if inputs is not None else [workflow["input_json"]] * len(heroes)
        rows = [
            {**workflow, "hero_type": t, "hero_id": i, "input_json": value}
            for (t, i), value in zip(heroes, given, strict=True)
        ]
        inserted = self.insert_many(connection, rows)
        executions = insert_executions(
            connection, [{**first, "workflow_id": workflow_id} for workflow_id, *_ in inserted]
        )
        return [(w, hero, executions[w], value) for w, hero, value in inserted]

    def insert_many(
        self, connection: Connection, rows: Sequence[dict[str, Any]]
    ) -> list[tuple[int, Hero, Any]]:
        """Insert ``rows`` (workflows of one class, each hero at most once): (id, hero,
        input) of each inserted one. Rows the unique index refused are missing."""
        if not connection.dialect.insert_executemany_returning:
            return self._one_by_one(connection, rows)
        inserted: list[tuple[int, Hero, Any]] = []
        for start in range(0, len(rows), BULK_ROWS):
            inserted += self._insert_chunk(connection, rows[start : start + BULK_ROWS])
        return inserted

    def _insert_chunk(
        self, connection: Connection, chunk: Sequence[dict[str, Any]]
    ) -> list[tuple[int, Hero, Any]]:
        result = connection.execute(_returning_heroes(dialect_of(connection)), list(chunk))
        return [(int(id_), (type_, hero_id), value) for id_, type_, hero_id, value in result]

    def _one_by_one(
        self, connection: Connection, rows: Sequence[dict[str, Any]]
    ) -> list[tuple[int, Hero, Any]]:
        inserted = []
        for row in rows:
            workflow_id = self.insert_workflow(connection, row)
            if workflow_id is not None:
                hero = (row["hero_type"], row["hero_id"])
                inserted.append((workflow_id, hero, row["input_json"]))
        return inserted


class MySQLStarter(Starter):
    """MySQL/MariaDB: no ``ON CONFLICT``; a refused row is InnoDB's statement-level rollback.

    MariaDB (10.5+) returns the new id with ``RETURNING``; MySQL 8 has no ``RETURNING`` and
    reports it as the last insert id.
    """

    def insert_workflow(self, connection: Connection, workflow: dict[str, Any]) -> int | None:
        try:
            if connection.dialect.insert_returning:
                return super().insert_workflow(connection, workflow)
            result = connection.execute(_workflow_insert_base(dialect_of(connection)), workflow)
        except IntegrityError as error:
            if _is_duplicate_key(error):
                return None
            raise
        key = result.inserted_primary_key
        return None if key is None else int(key[0])

    def _insert_chunk(
        self, connection: Connection, chunk: Sequence[dict[str, Any]]
    ) -> list[tuple[int, Hero, Any]]:
        # Heroes with an ongoing single workflow are left out first. A competitor committing
        # in between makes the chunk's one INSERT fail as a whole (InnoDB undoes just that
        # statement); it is then retried without the heroes the competitor now holds.
        pending = list(chunk)
        if pending and pending[0]["allow_multiple"]:  # such rows collide with nothing
            return super()._insert_chunk(connection, pending)
        while pending:
            taken = ongoing_heroes(connection, pending)
            pending = [r for r in pending if (r["hero_type"], r["hero_id"]) not in taken]
            if not pending:
                break
            try:
                return super()._insert_chunk(connection, pending)
            except IntegrityError as error:
                if not _is_duplicate_key(error):
                    raise
        return []


class PostgresStarter(Starter):
    """PostgreSQL: the workflow, its first execution and the wake-up in one statement."""

    def insert_one(
        self,
        connection: Connection,
        workflow: dict[str, Any],
        first: dict[str, Any] | None,
        wake_queue: str | None,
    ) -> tuple[int, int | None] | None:
        if first is None:
            return super().insert_one(connection, workflow, None, None)
        params = {**{f"w_{k}": v for k, v in workflow.items()}, **first}
        if wake_queue is not None:
            params["wake_channel"], params["wake_queue"] = NOTIFY_CHANNEL, wake_queue
        row = execute_direct(connection, _create_stmt(wake_queue is not None), params)
        if row is None:
            return None
        return int(row[1]), int(row[0])

    def start_many(
        self,
        connection: Connection,
        workflow: dict[str, Any],
        heroes: Sequence[Hero],
        first: dict[str, Any],
        wake_queue: str | None,
        inputs: Sequence[Any] | None = None,
    ) -> list[Started]:
        # One statement per PG_BULK_ROWS heroes, whose parameters are two arrays (three with
        # inputs) and the shared columns: a multi-row VALUES list of that size has ~35
        # placeholders per row, and psycopg's parsing of them cost more than the database's
        # inserts.
        started: list[Started] = []
        params = {**{f"w_{k}": v for k, v in workflow.items()}, **first}
        if wake_queue is not None:
            params["wake_channel"], params["wake_queue"] = NOTIFY_CHANNEL, wake_queue
        stmt = _start_many_stmt(wake_queue is not None, inputs is not None)
        for start in range(0, len(heroes), PG_BULK_ROWS):
            chunk = heroes[start : start + PG_BULK_ROWS]
            params["hero_types"] = [t for t, _ in chunk]
            params["hero_ids"] = [i for _, i in chunk]
            if inputs is not None:  # as JSON text, cast to JSONB per row (NULL stays NULL)
                params["inputs"] = [
                    None if v is None else json.dumps(v)
                    for v in inputs[start : start + PG_BULK_ROWS]
                ]
            result = connection.execute(stmt, params)
            started += [(int(w), (t, i), int(x), value) for w, t, i, value, x in result]
        return started


def _is_duplicate_key(error: IntegrityError) -> bool:
    args: tuple[Any, ...] = getattr(error.orig, "args", ())
    return bool(args) and args[0] == _MYSQL_DUPLICATE_KEY


@functools.cache
def _starter(dialect: Dialect) -> Starter:
    if dialect.combined_writes:
        return PostgresStarter()
    if not dialect.skips_conflicting_inserts:
        return MySQLStarter()
    return Starter()


def starter_for(connection: Connection) -> Starter:
    """The insert strategy for the connection's dialect, chosen once per dialect."""
    return _starter(dialect_of(connection))


def ongoing_heroes(connection: Connection, rows: Sequence[dict[str, Any]]) -> dict[Hero, int]:
    """Ids of the ongoing single (not ``allow_multiple``) workflows of ``rows``' class that
    hold one of their heroes: the rows a new single workflow would collide with."""
    keys = [(r["hero_type"], r["hero_id"]) for r in rows if r["hero_id"] is not None]
    if not keys:
        return {}
    wf = workflow_model()
    found: dict[Hero, int] = {}
    for start in range(0, len(keys), BULK_ROWS):
        stmt = select(wf.id, wf.hero_type, wf.hero_id).where(
            wf.type == rows[0]["type"],
            tuple_(wf.hero_type, wf.hero_id).in_(keys[start : start + BULK_ROWS]),
            wf.state.notin_((WorkflowState.FINISHED, WorkflowState.CANCELED)),
            wf.allow_multiple.is_(False),
        )
        found.update({(t, h): int(i) for i, t, h in connection.execute(stmt)})
    return found


def insert_executions(connection: Connection, rows: Sequence[dict[str, Any]]) -> dict[int, int]:
    """Insert first executions (``workflow_id`` set, one per workflow): the new execution's
    id by workflow id."""
    ids: dict[int, int] = {}
    if not connection.dialect.insert_executemany_returning:
        for row in rows:
            ids[row["workflow_id"]] = _insert_execution(connection, row)
        return ids
    table: Any = StepExecution.__table__
    stmt = _execution_insert().returning(table.c.id, table.c.workflow_id)
    for start in range(0, len(rows), BULK_ROWS):
        result = connection.execute(stmt, list(rows[start : start + BULK_ROWS]))
        ids.update({int(w): int(x) for x, w in result})
    return ids


def _insert_execution(connection: Connection, row: dict[str, Any]) -> int:
    if connection.dialect.insert_returning:
        return int(execute_direct(connection, _execution_insert_returning(), row)[0])
    key = connection.execute(_execution_insert(), row).inserted_primary_key
    assert key is not None  # an INSERT of one row always reports its key
    return int(key[0])


def _hero_columns() -> tuple[Any, ...]:
    """What a bulk start reads back of each workflow it inserted: id, hero and input."""
    table: Any = workflow_model().__table__
    return table.c.id, table.c.hero_type, table.c.hero_id, table.c.input


def _bound(mapped: Any, keys: tuple[str, ...], prefix: str = "") -> dict[Any, Any]:
    columns = sa_inspect(mapped).column_attrs
    return {
        columns[k].columns[0]: bindparam(f"{prefix}{k}", type_=columns[k].columns[0].type)
        for k in keys
    }


@functools.cache
def _workflow_insert_base(dialect: Dialect) -> Any:
    """The workflow INSERT without RETURNING, skipping a row the unique index refuses where
    the database can (built once per dialect: SQLAlchemy then reuses its compiled form)."""
    table: Any = workflow_model().__table__
    return dialect.insert_skipping_conflicts(table).values(
        _bound(workflow_model(), _workflow_keys())
    )


@functools.cache
def _workflow_insert(dialect: Dialect) -> Any:
    # MariaDB takes RETURNING; MySQL 8 does not (MySQLStarter checks insert_returning).
    return _workflow_insert_base(dialect).returning(_hero_columns()[0])


@functools.cache
def _returning_heroes(dialect: Dialect) -> Any:
    return _workflow_insert_base(dialect).returning(*_hero_columns())


@functools.cache
def _execution_insert() -> Any:
    table: Any = StepExecution.__table__
    return insert(table).values(_bound(StepExecution, _execution_keys()))


@functools.cache
def _execution_insert_returning() -> Any:
    table: Any = StepExecution.__table__
    return _execution_insert().returning(table.c.id)


@functools.cache
def _create_stmt(wake: bool) -> Any:
    """``WITH w AS (INSERT workflow … ON CONFLICT DO NOTHING RETURNING id) [, wake AS (SELECT
    pg_notify(…))], x AS (INSERT execution SELECT … FROM w RETURNING id, workflow_id) SELECT …``.

    No workflow row (refused), no execution row: the SELECT returns nothing. The NOTIFY is
    queued by the transaction and delivered at its commit (never for a rollback).
    """
    from sqlalchemy.dialects import postgresql  # PostgreSQL's statements only

    workflows: Any = workflow_model().__table__
    w_columns = sa_inspect(workflow_model()).column_attrs
    w = (
        postgresql.insert(workflows)
        .values(
            {
                w_columns[k].columns[0]: bindparam(f"w_{k}", type_=w_columns[k].columns[0].type)
                for k in _workflow_keys()
            }
        )
        .on_conflict_do_nothing()
        .returning(workflows.c.id)
        .cte("w")
    )
    x = _first_executions(w, wake, lambda key, type_: bindparam(key, type_=type_))
    return select(x.c.id, x.c.workflow_id)


@functools.cache
def _start_many_stmt(wake: bool, inputs: bool = False) -> Any:
    """``WITH w AS (INSERT workflow SELECT … FROM unnest(:hero_types, :hero_ids[, :inputs]) ON
    CONFLICT DO NOTHING RETURNING …) [, wake AS (SELECT pg_notify(…))], x AS (INSERT execution
    SELECT … FROM w RETURNING …) SELECT w.id, w.hero_type, w.hero_id, w.input, x.id FROM w
    JOIN x``.

    Two duplicate heroes in one array would be one insert and one DO NOTHING; the caller
    passes each hero once anyway. ``inputs``: each workflow's own input, as JSON text.
    """
    from sqlalchemy.dialects import postgresql  # PostgreSQL's statements only

    workflows: Any = workflow_model().__table__
    w_columns = sa_inspect(workflow_model()).column_attrs
    arrays = [
        cast(bindparam("hero_types"), postgresql.ARRAY(String)),
        cast(bindparam("hero_ids"), postgresql.ARRAY(String)),
    ]
    if inputs:
        arrays.append(cast(bindparam("inputs"), postgresql.ARRAY(Text)))
    heroes = (
        func.unnest(*arrays)
        .table_valued("hero_type", "hero_id", *(["input"] if inputs else []))
        .render_derived(name="h")
    )
    per_row = (*_HERO_KEYS, "input_json") if inputs else _HERO_KEYS
    w_keys = (*per_row, *(k for k in _workflow_keys() if k not in per_row))

    def value(key: str) -> Any:
        if inputs and key == "input_json":
            return cast(heroes.c.input, postgresql.JSONB)
        if key in _HERO_KEYS:
            return heroes.c[key]
        return _typed(f"w_{key}", w_columns[key].columns[0].type)

    w_values = [value(k) for k in w_keys]
    w = (
        postgresql.insert(workflows)
        .from_select([w_columns[k].columns[0] for k in w_keys], select(*w_values))
        .on_conflict_do_nothing()
        .returning(*_hero_columns())
        .cte("w")
    )
    x = _first_executions(w, wake, _typed)
    return select(w.c.id, w.c.hero_type, w.c.hero_id, w.c.input, x.c.id).join_from(
        w, x, x.c.workflow_id == w.c.id
    )


_HERO_KEYS = ("hero_type", "hero_id")


def _first_executions(w: Any, wake: bool, param: Callable[[str, Any], Any]) -> Any:
    """The CTE ``x AS (INSERT execution SELECT … FROM w RETURNING id, workflow_id)``: one first
    execution per workflow the CTE ``w`` inserted, its other columns from ``param(key, type)``.

    With the wake-up: a cross join with its one row, which makes PostgreSQL evaluate it.
    """
    executions: Any = StepExecution.__table__
    x_columns = sa_inspect(StepExecution).column_attrs
    keys = _execution_keys()
    values = [
        w.c.id if key == "workflow_id" else param(key, x_columns[key].columns[0].type)
        for key in keys
    ]
    source = select(*values).select_from(w.join(_wake_cte(), true()) if wake else w)
    return (
        executions.insert()
        .from_select([x_columns[k].columns[0] for k in keys], source)
        .returning(executions.c.id, executions.c.workflow_id)
        .cte("x")
    )


def _typed(name: str, type_: Any) -> Any:
    """A parameter the SELECT list casts to its column's type: PostgreSQL cannot infer the
    type of an untyped parameter there (a NULL, a str for a timestamp) when many rows share it."""
    return cast(bindparam(name, type_=type_), type_)


def _wake_cte() -> Any:
    return select(
        func.pg_notify(bindparam("wake_channel"), bindparam("wake_queue")).label("sent")
    ).cte("wake")

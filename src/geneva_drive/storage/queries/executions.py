"""Execution rows: starting, completing, inserting, sweeping, checkpointing, and their history."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    and_,
    bindparam,
    case,
    func,
    literal_column,
    null,
    or_,
    select,
    update,
)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import instance_state, set_committed_value

from geneva_drive.core.states import ExecutionState, Outcome
from geneva_drive.storage.dialects import dialect_of
from geneva_drive.storage.models import TIMEOUT_FOR, LimitSlot, StepExecution, WorkflowColumns
from geneva_drive.storage.queries._sql import SWEEPABLE, in_state, mapped_class, workflow_model
from geneva_drive.storage.queries.bypass import (
    as_inserted,
    connection_of,
    execute_alone,
    execute_direct,
    mark_written,
    update_by_id,
    update_params,
    write_through,
)


def start_both(
    session: Session,
    execution: StepExecution,
    started: dict[str, Any],
    workflow: WorkflowColumns,
    performing: dict[str, Any],
) -> None:
    """Phase 1's two writes that start a step, under the locks the caller holds.

    On PostgreSQL as one statement (``WITH e AS (UPDATE execution) UPDATE workflow``) when
    neither instance has pending changes to fold in; elsewhere as two ``write_through``.
    """
    connection = connection_of(session)
    if (
        not dialect_of(connection).combined_writes
        or instance_state(execution).modified
        or instance_state(workflow).modified
    ):
        write_through(session, execution, started)
        write_through(session, workflow, performing)
        return
    stmt = _start_stmt(
        mapped_class(workflow).__mapper__.base_mapper, tuple(started), tuple(performing)
    )
    params = {
        **update_params(execution, started, None, "x_"),
        **update_params(workflow, performing, None, "w_"),
    }
    execute_direct(connection, stmt, params)
    mark_written(session, execution, started)
    mark_written(session, workflow, performing)


@functools.lru_cache(maxsize=16)
def _start_stmt(workflow_mapper: Any, started: tuple[str, ...], performing: tuple[str, ...]) -> Any:
    execution_update = update_by_id(sa_inspect(StepExecution), started, (), "x_")
    return update_by_id(workflow_mapper, performing, (), "w_").add_cte(execution_update.cte("e"))


def complete_in_one_statement(
    session: Session,
    workflow: WorkflowColumns,
    navigation: dict[str, Any],
    as_started: dict[str, Any],
    execution: StepExecution,
    done: dict[str, Any],
    following: dict[str, Any] | None,
    *,
    alone: bool = False,
    pass_slot: tuple[int, datetime] | None = None,
) -> tuple[bool, bool, StepExecution | None, bool]:
    """Phase 3's three writes as one PostgreSQL statement: (workflow written, execution
    written, the following execution inserted, the slot passed on).

    ``pass_slot``: (workflow id, now) when the concurrency slot ``execution`` holds passes to
    the following execution (``engine.limits.inherits_slot``): a fourth write in the same
    statement, ``p AS (UPDATE limit_slots … WHERE execution_id = ours AND EXISTS n)``, where
    it took a statement of its own after this one (``limits.pass_slot``) — and kept the
    transaction from committing as the completion is written. It locks the slot row last,
    as phase 3 always did, and looks for no waiter: the slot stays held.

    ``WITH w AS (UPDATE workflow … RETURNING), e AS (UPDATE execution … WHERE EXISTS w
    RETURNING), n AS (INSERT … SELECT … WHERE EXISTS e RETURNING) SELECT …``: the same
    guarded writes, in the same order, as :func:`write_through` twice and
    :func:`insert_execution` — each runs only if the one before it wrote — in one round trip
    instead of three. Nothing pending on either instance (the caller checks).

    The workflow is written only while the execution is still in progress, and that row is
    locked (``FOR SHARE``) as the workflow's guard reads it: nobody can take the execution
    between the two writes, so the statement writes all three or nothing. Which is what lets
    it run as a transaction of its own (``alone``, :func:`execute_alone`) when the step's
    transaction has nothing else in it: no partial outcome can be committed. (The shared
    lock comes before the workflow row's, against the lock order of ``queries``: a recovery
    that locked the workflow and waits for the execution can deadlock with it, which the
    database breaks and the executor treats as transient. Only a run whose execution is
    being taken from it can meet one: a duplicate run of the same execution holds the
    workflow row too, but never waits for an execution that is no longer scheduled —
    ``prepare.lock_both``.)
    """
    workflow_mapper = mapped_class(workflow).__mapper__
    passes = following is not None and pass_slot is not None
    stmt = _complete_stmt(
        workflow_mapper.base_mapper,
        tuple(navigation),
        tuple(as_started),
        tuple(done),
        following is not None,
        passes,
    )
    params = completion_params(workflow, navigation, as_started, execution, done)
    row = None
    if following is not None:
        row = _execution_row(following)
        params.update({f"n_{key}": value for key, value in row.items()})
        if pass_slot is not None:
            params["p_workflow_id"], params["p_taken_at"] = pass_slot
    run = execute_alone if alone else execute_direct
    result = run(connection_of(session), stmt, params)
    w, e, n, attempt = result[0], result[1], result[2], result[3]
    p = result[4] if passes else None  # a fifth column only where the slot may pass on
    if w:
        mark_written(session, workflow, navigation)
    if e:
        mark_written(session, execution, done)
    if n is None or row is None:
        return bool(w), bool(e), None, False
    row["id"], row["attempt"] = int(n), attempt
    inserted: StepExecution = as_inserted(session, StepExecution.__mapper__, row)
    return bool(w), bool(e), inserted, bool(p)


@functools.lru_cache(maxsize=32)
def _complete_stmt(
    workflow_mapper: Any,
    navigation: tuple[str, ...],
    as_started: tuple[str, ...],
    done: tuple[str, ...],
    insert: bool,
    passes: bool = False,
) -> Any:
    w, e = completion_ctes(workflow_mapper, navigation, as_started, done)
    counts = [
        select(func.count()).select_from(w).scalar_subquery(),
        select(func.count()).select_from(e).scalar_subquery(),
    ]
    if not insert:
        return select(*counts, null(), null())
    executions: Any = StepExecution.__table__
    # Bound by attribute name, as _execution_row gives them (metadata_json -> "metadata").
    attrs = [a for a in sa_inspect(StepExecution).column_attrs if a.key != "id"]
    columns = [a.columns[0] for a in attrs]
    # HAVING, not WHERE: the aggregate gives its row even when no row matches its WHERE.
    source = new_row_source(attrs, "n_").having(select(e.c.id).exists())
    n = (
        executions.insert()
        .from_select(columns, source)
        .returning(executions.c.id, executions.c.attempt)
        .cte("n")
    )
    inserted = (select(n.c.id).scalar_subquery(), select(n.c.attempt).scalar_subquery())
    if not passes:
        return select(*counts, *inserted)
    slots: Any = LimitSlot.__table__
    p = (
        update(slots)
        .where(slots.c.execution_id == bindparam("x_pk"), select(n.c.id).exists())
        .values(
            execution_id=select(n.c.id).scalar_subquery(),
            workflow_id=bindparam("p_workflow_id", type_=slots.c.workflow_id.type),
            taken_at=bindparam("p_taken_at", type_=slots.c.taken_at.type),
        )
        .returning(slots.c.slot)
        .cte("p")
    )
    return select(*counts, *inserted, select(func.count()).select_from(p).scalar_subquery())


def completion_params(
    workflow: WorkflowColumns,
    navigation: dict[str, Any],
    as_started: dict[str, Any],
    execution: StepExecution,
    done: dict[str, Any],
) -> dict[str, Any]:
    """The parameters :func:`completion_ctes` binds."""
    return {
        **update_params(workflow, navigation, as_started, "w_"),
        **update_params(execution, done, {"state": ExecutionState.IN_PROGRESS}, "x_"),
    }


def completion_ctes(
    workflow_mapper: Any,
    navigation: tuple[str, ...],
    as_started: tuple[str, ...],
    done: tuple[str, ...],
) -> tuple[Any, Any]:
    """The completion's two guarded writes as CTEs ``w`` and ``e`` (each returning ``id``):
    the workflow's navigation while it holds ``as_started`` and the execution is still in
    progress (read ``FOR SHARE``), then the execution's end if the workflow was written.
    Bound with :func:`completion_params`."""
    executions: Any = StepExecution.__table__
    still_ours = (
        select(executions.c.id)
        .where(executions.c.id == bindparam("x_pk"), executions.c.state == bindparam("x_e_state"))
        .with_for_update(read=True)
        .exists()
    )
    w = (
        update_by_id(workflow_mapper, navigation, as_started, "w_")
        .where(still_ours)
        .returning(workflow_mapper.local_table.c.id)
        .cte("w")
    )
    e = (
        update_by_id(sa_inspect(StepExecution), done, ("state",), "x_")
        .where(select(w.c.id).exists())
        .returning(executions.c.id)
        .cte("e")
    )
    return w, e


def get_execution(session: Session, execution_id: int) -> StepExecution | None:
    return session.get(StepExecution, execution_id)


def sweep_strays(session: Session, workflow_id: int, values: dict[str, Any]) -> int:
    """Cancel scheduled/waiting executions before a new one is created (one active per workflow).

    In-progress rows are never swept: their worker owns them until phase 3. A Core UPDATE
    (the ORM's bulk path costs more than the statement, and nearly always nothing matches);
    pending ORM changes are flushed first, as an autoflush would, and instances of swept rows
    that this session holds are brought in line afterwards. ``values``: how a swept row ends
    (``outcomes.for_stray``), by attribute name.
    """
    session.flush()
    params = {"of_workflow": workflow_id, **{f"v_{key}": value for key, value in values.items()}}
    result = session.connection().execute(_sweep_stmt(tuple(values)), params)
    swept = int(getattr(result, "rowcount", 0) or 0)
    if swept:
        for instance in list(session.identity_map.values()):
            if (
                isinstance(instance, StepExecution)
                and instance.workflow_id == workflow_id
                and instance.state in SWEEPABLE
            ):
                for key, value in values.items():
                    set_committed_value(instance, key, value)
    return swept


@functools.cache
def _sweep_stmt(columns: tuple[str, ...]) -> Any:
    table: Any = StepExecution.__table__
    return (
        update(table)
        .where(table.c.workflow_id == bindparam("of_workflow"), in_state(table.c.state, *SWEEPABLE))
        .values({key: bindparam(f"v_{key}") for key in columns})
    )


def insert_execution(session: Session, values: dict[str, Any]) -> StepExecution:
    """INSERT one execution with Core and return it as a loaded, clean instance of the session.

    ``values`` by attribute name, ``created_at`` included (it is also the ``updated_at``);
    every other column is NULL or its default. Cheaper than ``session.add()`` + flush, which
    is the one other flush a step would pay for.
    """
    mapper = StepExecution.__mapper__
    row = _execution_row(values)
    connection = connection_of(session)
    if not connection.dialect.insert_returning:
        # e.g. SQLite before 3.35: the driver's lastrowid, through SQLAlchemy; the attempt is
        # left unknown (NULL), counted when a span needs it (attempt_number)
        key = connection.execute(
            _insert_stmt(returning=False, counts_attempt=False), [row]
        ).inserted_primary_key
        assert key is not None  # an INSERT of one row always reports its key
        row["id"] = int(key[0])
    elif dialect_of(connection).counts_attempt_on_insert:
        new_id, row["attempt"] = execute_direct(
            connection, _insert_stmt(returning=True, counts_attempt=True), row
        )
        row["id"] = int(new_id)
    else:  # MySQL/MariaDB: a plain INSERT, the attempt left NULL (see the dialect)
        row["id"] = int(
            execute_direct(connection, _insert_stmt(returning=True, counts_attempt=False), row)[0]
        )
    execution: StepExecution = as_inserted(session, mapper, row)
    return execution


def _execution_row(values: dict[str, Any]) -> dict[str, Any]:
    """Every column of a new execution but ``id``: ``values``, else NULL or the default."""
    row: dict[str, Any] = {attr.key: None for attr in StepExecution.__mapper__.column_attrs}
    row.update(state=ExecutionState.SCHEDULED, queue="default", priority=0)
    row.update(values)
    row["updated_at"] = row["created_at"]
    del row["id"]
    return row


@functools.cache
def _insert_stmt(*, returning: bool, counts_attempt: bool) -> Any:
    """With ``counts_attempt``, ``INSERT … SELECT`` of the bound values and the row's attempt
    (:func:`new_row_source`) ``RETURNING id, attempt``; else a plain ``INSERT … VALUES``
    (attempt NULL), ``RETURNING id`` if ``returning``."""
    table: Any = StepExecution.__table__
    attrs = [a for a in sa_inspect(StepExecution).column_attrs if a.key != "id"]
    if counts_attempt:
        return (
            table.insert()
            .from_select([a.columns[0] for a in attrs], new_row_source(attrs, ""))
            .returning(table.c.id, table.c.attempt)
        )
    stmt = table.insert().values({a.columns[0]: bindparam(a.key) for a in attrs})
    return stmt.returning(table.c.id) if returning else stmt


def new_row_source(attrs: list[Any], prefix: str) -> Any:
    """``SELECT`` one new execution's columns (``attrs``, each bound as ``prefix`` + its
    attribute's name) with its ``attempt`` worked out from its step's earlier rows in its
    workflow: one more than the runs before it (timers, ``attempt`` 0, not counted), as
    ``admin.show``'s timeline counts them; NULL (unknown) if any earlier row has none
    (written before migration 0017), then counted by :func:`attempt_number` if a span needs it.

    In SQL, so that no path that schedules a step — the next step after a completion, a
    reattempt, an operator's retry or resume_at, a step come back to — needs a statement of
    its own for it. An aggregate over the earlier rows (found by the workflow's index), so it
    gives its one row whether there are any or not; ``INSERT … SELECT … FROM`` the table
    itself, which MySQL/MariaDB allow where they refuse a subquery on it."""
    p: Any = StepExecution.__table__.alias("p")
    known = func.count() == func.count(p.c.attempt)
    # Literal numbers, not parameters: a completion's statement is near the parameters and
    # length psycopg keeps its parsing for (bypass._parsed_every_time).
    runs = func.count(func.nullif(p.c.attempt, literal_column("0"))) + literal_column("1")
    attempt = case((known, runs), else_=null())
    bound = {a.key: bindparam(f"{prefix}{a.key}", type_=a.columns[0].type) for a in attrs}
    values = [attempt if a.key == "attempt" else bound[a.key] for a in attrs]
    return (
        select(*values)
        .select_from(p)
        .where(p.c.workflow_id == bound["workflow_id"], p.c.step_name == bound["step_name"])
    )


def current_execution(session: Session, workflow_id: int) -> StepExecution | None:
    """The single scheduled, waiting or in-progress execution, if any (newest wins).

    A parked execution with a signal timeout has its timeout row (scheduled) beside it; the
    waiting row is the current one, so it comes first.
    """
    stmt = (
        select(StepExecution)
        .where(
            StepExecution.workflow_id == workflow_id,
            in_state(
                StepExecution.state,
                ExecutionState.SCHEDULED,
                ExecutionState.WAITING,
                ExecutionState.IN_PROGRESS,
            ),
        )
        .order_by(
            case((in_state(StepExecution.state, ExecutionState.WAITING), 0), else_=1),
            StepExecution.created_at.desc(),
            StepExecution.id.desc(),
        )
        .limit(1)
        # Rows change under other sessions (workers); never answer from a stale identity map.
        .execution_options(populate_existing=True)
    )
    return session.execute(stmt).scalar_one_or_none()


def execution_history(session: Session, workflow_id: int) -> Sequence[StepExecution]:
    stmt = (
        select(StepExecution)
        .where(StepExecution.workflow_id == workflow_id)
        .order_by(StepExecution.created_at, StepExecution.id)
        .execution_options(populate_existing=True)
    )
    return session.execute(stmt).scalars().all()


def attempt_number(session: Session, execution: StepExecution) -> int:
    """Which run of its step ``execution`` is in its workflow, counted as ``admin.show``'s
    timeline does: the step's executions up to and including it by (created_at, id), timers
    (rows that time a wait out) not counted. For a span's attribute, read only when tracing.

    Most steps run once: a count of those rows, one statement built once and sent directly
    on the session's connection (no flush), answers 1 for them; only a step with earlier
    rows reads them, to leave the timers out."""
    params = {
        "workflow_id": execution.workflow_id,
        "step_name": execution.step_name,
        "created_at": execution.created_at,
        "id": execution.id,
    }
    connection = connection_of(session)
    counted = execute_direct(connection, _attempt_stmts()[0], params)
    if counted is None or counted[0] <= 1:
        return 1
    rows = connection.execute(_attempt_stmts()[1], params)
    runs = sum(1 for (meta,) in rows if TIMEOUT_FOR not in (meta or {}))
    return max(runs, 1)


@functools.cache
def _attempt_stmts() -> tuple[Any, Any]:
    """(the count of the step's rows up to the execution, their metadata)."""
    table = StepExecution.__table__
    created_at = bindparam("created_at", type_=table.c.created_at.type)
    up_to = and_(
        table.c.workflow_id == bindparam("workflow_id"),
        table.c.step_name == bindparam("step_name"),
        or_(
            table.c.created_at < created_at,
            and_(table.c.created_at == created_at, table.c.id <= bindparam("id")),
        ),
    )
    return select(func.count()).where(up_to), select(table.c.metadata).where(up_to)


def consecutive_reattempt_count(session: Session, workflow_id: int, step_name: str) -> int:
    """Reattempts of ``step_name`` since its last clean completion, by (created_at, id).

    Ordering by (created_at, id) rather than id alone keeps the count right with
    non-monotonic keys. Flow-control reattempts (the step asked for them) do not count.
    """
    of_step = and_(StepExecution.workflow_id == workflow_id, StepExecution.step_name == step_name)
    last_reset = session.execute(
        select(StepExecution.created_at, StepExecution.id)
        .where(
            of_step,
            in_state(StepExecution.state, ExecutionState.COMPLETED),
            StepExecution.outcome != Outcome.REATTEMPTED,
        )
        .order_by(StepExecution.created_at.desc(), StepExecution.id.desc())
        .limit(1)
    ).first()
    stmt = select(StepExecution.metadata_json).where(
        of_step, StepExecution.outcome == Outcome.REATTEMPTED
    )
    if last_reset is not None:
        created_at, reset_id = last_reset
        stmt = stmt.where(
            or_(
                StepExecution.created_at > created_at,
                and_(StepExecution.created_at == created_at, StepExecution.id > reset_id),
            )
        )
    return sum(
        1
        for (meta,) in session.execute(stmt)
        if (meta or {}).get("reattempt_reason") != "flow_control"
    )


def executions_of_step(
    session: Session, workflow_id: int, step_name: str, **filters: Any
) -> Sequence[StepExecution]:
    stmt = (
        select(StepExecution)
        .where(StepExecution.workflow_id == workflow_id, StepExecution.step_name == step_name)
        .execution_options(populate_existing=True)
    )
    for column, value in filters.items():
        stmt = stmt.where(getattr(StepExecution, column) == value)
    return (
        session.execute(stmt.order_by(StepExecution.created_at, StepExecution.id)).scalars().all()
    )


def successor_of(session: Session, execution_id: int) -> StepExecution | None:
    """The execution that continues ``execution_id`` (a resumable step's next run), if any."""
    stmt = select(StepExecution).where(StepExecution.continues_from_id == execution_id)
    return session.execute(stmt).scalar_one_or_none()


def newest_paused_marker(session: Session, workflow_id: int) -> StepExecution | None:
    """Newest completed/workflow_paused execution without a successor (resumable resume)."""
    successors = (
        select(StepExecution.continues_from_id)
        .where(
            StepExecution.workflow_id == workflow_id,
            StepExecution.continues_from_id.is_not(None),
        )
        .scalar_subquery()
    )
    stmt = (
        select(StepExecution)
        .where(
            StepExecution.workflow_id == workflow_id,
            in_state(StepExecution.state, ExecutionState.COMPLETED),
            StepExecution.outcome == Outcome.WORKFLOW_PAUSED,
            StepExecution.id.notin_(successors),
        )
        .order_by(StepExecution.created_at.desc(), StepExecution.id.desc())
        .limit(1)
    )
    return session.execute(stmt).scalar_one_or_none()


def checkpoint_execution(
    session: Session,
    execution_id: int,
    workflow_id: int,
    owner: str | None,
    now: datetime,
    cursor: Any,
    *,
    read_workflow: bool,
    metadata: dict[str, Any] | None = None,
) -> tuple[bool, str | None]:
    """Write a resumable step's encoded ``cursor`` (and its ``metadata``: the iteration
    count the admin API shows) iff the execution is still ours.

    Returns ``(owned, workflow_state)``. ``owned`` is False when the execution is no longer in
    progress under ``owner`` (None: no lease) — recovered by housekeeping while this worker
    stalled — and then nothing was written: the caller must roll back, not commit its work
    onto a row a successor now redoes. The UPDATE takes the execution's row lock, so lease
    recovery (which locks the workflow, then this row) either ran before and we see its result
    (rowcount 0), or waits until our checkpoint commits.

    ``workflow_state`` is the workflow row's state (to observe an operator's pause or cancel),
    read by the same statement through ``RETURNING`` where the dialect has ``UPDATE …
    RETURNING`` (PostgreSQL, SQLite): one round trip per checkpoint. MariaDB has no ``UPDATE
    … RETURNING``, so it takes a second statement, only when ``read_workflow``; otherwise
    None. A plain read, no lock: a pause committed just after it is seen at the next
    checkpoint, as it would be a moment later anyway.

    Core, not the ORM: a flush per checkpoint costs several times the statement. The loaded
    execution's ``cursor``/``updated_at`` are the caller's to keep in step.
    """
    returning = bool(session.get_bind().dialect.update_returning)
    params = {
        "gd_id": execution_id,
        "gd_owner": owner,
        "gd_now": now,
        "gd_cursor": cursor,
        "gd_metadata": metadata,
    }
    if returning:
        params["gd_workflow_id"] = workflow_id
    result = session.connection().execute(_checkpoint_statement(returning), params)
    if returning:
        row = result.first()
        return (False, None) if row is None else (True, row[0])
    if not getattr(result, "rowcount", 0):
        return False, None
    if not read_workflow:
        return True, None
    state = session.connection().execute(
        _workflow_state_statement(), {"gd_workflow_id": workflow_id}
    )
    return True, state.scalar_one()


@functools.lru_cache(maxsize=2)
def _checkpoint_statement(returning: bool) -> Any:
    # Built once: SQLAlchemy then reuses its compiled form (and psycopg prepares it).
    table: Any = StepExecution.__table__
    stmt = (
        update(table)
        .where(
            table.c.id == bindparam("gd_id"),
            in_state(table.c.state, ExecutionState.IN_PROGRESS),
            table.c.lease_owner.is_not_distinct_from(
                bindparam("gd_owner", type_=table.c.lease_owner.type)
            ),
        )
        .values(
            {
                table.c.cursor: bindparam("gd_cursor", type_=table.c.cursor.type),
                table.c["metadata"]: bindparam("gd_metadata", type_=table.c["metadata"].type),
                table.c.updated_at: bindparam("gd_now", type_=table.c.updated_at.type),
            }
        )
    )
    if returning:
        stmt = stmt.returning(_workflow_state_statement().scalar_subquery())
    return stmt


@functools.lru_cache(maxsize=1)
def _workflow_state_statement() -> Any:
    workflows: Any = workflow_model().__table__
    return select(workflows.c.state).where(workflows.c.id == bindparam("gd_workflow_id"))

"""Every query geneva-drive runs, named and documented. Only the engine's modules call these.

Lock order, everywhere: the workflow row first, then its execution rows. Holding the workflow
row lock is what serialises everything that happens to one workflow (phase 1 and phase 3 of
the executor, scheduling, signals, operator verbs, housekeeping); execution rows are only
written by a holder of their workflow's lock.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Connection,
    String,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal_column,
    null,
    or_,
    select,
    update,
)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session, make_transient_to_detached
from sqlalchemy.orm.attributes import set_committed_value

from . import direct
from .models import Signal, StepExecution
from .states import (
    ONGOING_WORKFLOW_STATES,
    TERMINAL_WORKFLOW_STATES,
    ExecutionState,
    Outcome,
    WorkflowState,
)

if TYPE_CHECKING:
    from .workflow import Workflow

_SWEEPABLE = (ExecutionState.SCHEDULED, ExecutionState.WAITING)


def _in_state(column: Any, *states: ExecutionState) -> Any:
    """``state = 'scheduled'`` (or ``IN (…)``), the states written into the SQL as literals.

    Why not parameters: the executions' partial indexes (``… WHERE state = 'scheduled'``, the
    claim's, the lease sweep's, the waiting gauges') are matched against the query's text. psycopg
    prepares a statement on its fifth run and PostgreSQL then plans it once, generically; with
    the state as a parameter that plan cannot use a partial index. The claim then sorted every
    due row for each claim: 14 ms a claim at 8,000 due rows, growing with the backlog, against
    0.13 ms reading the first entry of the partial index. The states are the library's own
    constants, never input.
    """
    literals = [literal_column(f"'{ExecutionState(state).value}'", String) for state in states]
    return column == literals[0] if len(literals) == 1 else column.in_(literals)


def workflow_model() -> type[Workflow]:
    from .workflow import Workflow

    return Workflow


def lock_workflow(session: Session, workflow_id: int) -> Workflow | None:
    """``SELECT … FOR UPDATE`` the workflow row and refresh the instance from it.

    On SQLite ``FOR UPDATE`` is not rendered; the transaction already holds the database write
    lock from ``BEGIN IMMEDIATE`` (see ``engine.py``), which is stronger. Re-locking a row the
    transaction already holds is re-entrant on every engine.
    """
    held = _held_workflow_locks(session)
    cached = held.get(workflow_id) if held is not None else None
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


_HELD = "geneva_drive_held_workflow_locks"


def _held_workflow_locks(session: Session) -> dict[int, Workflow | None] | None:
    """Workflow ids locked in the session's current top-level transaction (None: unknown).

    Inside a savepoint we never trust the cache: rolling back to a savepoint releases the
    row locks taken after it, so a lock remembered there may be gone.
    """
    entry = _held(session)
    return None if entry is None else entry[0]


def _held(
    session: Session, *, create: bool = False
) -> tuple[dict[int, Workflow | None], dict[int, StepExecution]] | None:
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
    session: Session, workflow_id: int, workflow: Workflow | None = None
) -> None:
    """Note that this transaction holds ``workflow_id``'s row lock (and its loaded instance;
    the strong reference keeps it in the session's weak identity map)."""
    held = _held(session, create=True)
    if held is not None and (workflow is not None or workflow_id not in held[0]):
        held[0][workflow_id] = workflow


def lock_execution(session: Session, execution_id: int) -> StepExecution | None:
    """Lock one execution row (only after its workflow row — see the module docstring)."""
    held = _held(session)
    cached = held[1].get(execution_id) if held is not None else None
    if cached is not None:
        # Locked and loaded by this transaction's claim: as current as a re-read would be.
        return cached
    stmt = (
        select(StepExecution)
        .where(StepExecution.id == execution_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
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
    mapper = sa_inspect(type(instance))
    state = sa_inspect(instance)
    pending = state.committed_state
    if pending:
        columns = mapper.column_attrs
        values = {
            **{key: getattr(instance, key) for key in pending if key in columns},
            **values,
        }
    stmt = _update_by_id(mapper, tuple(values), tuple(expect or ()))
    written = direct.execute(_connection(session), stmt, _update_params(instance, values, expect))
    if expect and not written:
        return False
    _written(session, instance, values)
    return True


_CONNECTION = "geneva_drive_connection"


def _connection(session: Session) -> Connection:
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
    connection = session.connection()
    session.info[_CONNECTION] = (session.get_transaction(), connection)
    return connection


def start_both(
    session: Session,
    execution: StepExecution,
    started: dict[str, Any],
    workflow: Workflow,
    performing: dict[str, Any],
) -> None:
    """Phase 1's two writes that start a step, under the locks the caller holds.

    On PostgreSQL as one statement (``WITH e AS (UPDATE execution) UPDATE workflow``) when
    neither instance has pending changes to fold in; elsewhere as two ``write_through``.
    """
    connection = _connection(session)
    if (
        connection.dialect.name != "postgresql"
        or sa_inspect(execution).modified
        or sa_inspect(workflow).modified
    ):
        write_through(session, execution, started)
        write_through(session, workflow, performing)
        return
    stmt = _start_stmt(sa_inspect(type(workflow)).base_mapper, tuple(started), tuple(performing))
    params = {
        **_update_params(execution, started, None, "x_"),
        **_update_params(workflow, performing, None, "w_"),
    }
    direct.execute(connection, stmt, params)
    _written(session, execution, started)
    _written(session, workflow, performing)


@functools.lru_cache(maxsize=16)
def _start_stmt(workflow_mapper: Any, started: tuple[str, ...], performing: tuple[str, ...]) -> Any:
    execution_update = _update_by_id(sa_inspect(StepExecution), started, (), "x_")
    return _update_by_id(workflow_mapper, performing, (), "w_").add_cte(execution_update.cte("e"))


def _written(session: Session, instance: Any, values: dict[str, Any]) -> None:
    """Bring ``instance`` in line with the row an UPDATE just wrote ``values`` to."""
    state = sa_inspect(instance)
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


def complete_in_one_statement(
    session: Session,
    workflow: Workflow,
    navigation: dict[str, Any],
    as_started: dict[str, Any],
    execution: StepExecution,
    done: dict[str, Any],
    following: dict[str, Any] | None,
) -> tuple[bool, bool, StepExecution | None]:
    """Phase 3's three writes as one PostgreSQL statement: (workflow written, execution
    written, the following execution inserted).

    ``WITH w AS (UPDATE workflow … RETURNING), e AS (UPDATE execution … WHERE EXISTS w
    RETURNING), n AS (INSERT … SELECT … WHERE EXISTS e RETURNING) SELECT …``: the same
    guarded writes, in the same order, as :func:`write_through` twice and
    :func:`insert_execution` — each runs only if the one before it wrote — in one round trip
    instead of three. Nothing pending on either instance (the caller checks).
    """
    workflow_mapper = sa_inspect(type(workflow))
    stmt = _complete_stmt(
        workflow_mapper.base_mapper,
        tuple(navigation),
        tuple(as_started),
        tuple(done),
        following is not None,
    )
    params = {
        **_update_params(workflow, navigation, as_started, "w_"),
        **_update_params(execution, done, {"state": ExecutionState.IN_PROGRESS}, "x_"),
    }
    row = None
    if following is not None:
        row = _execution_row(following)
        params.update({f"n_{key}": value for key, value in row.items()})
    w, e, n = direct.execute(_connection(session), stmt, params)
    if w:
        _written(session, workflow, navigation)
    if e:
        _written(session, execution, done)
    if n is None or row is None:
        return bool(w), bool(e), None
    row["id"] = int(n)
    inserted: StepExecution = _as_loaded(session, sa_inspect(StepExecution), row)
    return bool(w), bool(e), inserted


@functools.lru_cache(maxsize=32)
def _complete_stmt(
    workflow_mapper: Any,
    navigation: tuple[str, ...],
    as_started: tuple[str, ...],
    done: tuple[str, ...],
    insert: bool,
) -> Any:
    executions: Any = StepExecution.__table__
    w = (
        _update_by_id(workflow_mapper, navigation, as_started, "w_")
        .returning(workflow_mapper.local_table.c.id)
        .cte("w")
    )
    e = (
        _update_by_id(sa_inspect(StepExecution), done, ("state",), "x_")
        .where(select(w.c.id).exists())
        .returning(executions.c.id)
        .cte("e")
    )
    counts = [
        select(func.count()).select_from(w).scalar_subquery(),
        select(func.count()).select_from(e).scalar_subquery(),
    ]
    if not insert:
        return select(*counts, null())
    # Bound by attribute name, as _execution_row gives them (metadata_json -> "metadata").
    attrs = [a for a in sa_inspect(StepExecution).column_attrs if a.key != "id"]
    columns = [a.columns[0] for a in attrs]
    values = [bindparam(f"n_{a.key}", type_=c.type) for a, c in zip(attrs, columns, strict=True)]
    n = (
        executions.insert()
        .from_select(columns, select(*values).where(select(e.c.id).exists()))
        .returning(executions.c.id)
        .cte("n")
    )
    return select(*counts, select(n.c.id).scalar_subquery())


@functools.lru_cache(maxsize=128)
def _update_by_id(
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


def _update_params(
    instance: Any, values: dict[str, Any], expect: dict[str, Any] | None, prefix: str = ""
) -> dict[str, Any]:
    params = {f"{prefix}v_{key}": value for key, value in values.items()}
    params[f"{prefix}pk"] = instance.id
    if expect:
        params.update({f"{prefix}e_{key}": value for key, value in expect.items()})
    return params


def get_execution(session: Session, execution_id: int) -> StepExecution | None:
    return session.get(StepExecution, execution_id)


def sweep_strays(session: Session, workflow_id: int, now: datetime) -> int:
    """Cancel scheduled/waiting executions before a new one is created (one active per workflow).

    In-progress rows are never swept: their worker owns them until phase 3. A Core UPDATE
    (the ORM's bulk path costs more than the statement, and nearly always nothing matches);
    pending ORM changes are flushed first, as an autoflush would, and instances of swept rows
    that this session holds are brought in line afterwards.
    """
    session.flush()
    values = {
        "state": ExecutionState.CANCELED,
        "outcome": Outcome.CANCELED,
        "canceled_at": now,
        "updated_at": now,
    }
    params = {"of_workflow": workflow_id, **{f"v_{key}": value for key, value in values.items()}}
    result = session.connection().execute(_sweep_stmt(), params)
    swept = int(getattr(result, "rowcount", 0) or 0)
    if swept:
        for instance in list(session.identity_map.values()):
            if (
                isinstance(instance, StepExecution)
                and instance.workflow_id == workflow_id
                and instance.state in _SWEEPABLE
            ):
                for key, value in values.items():
                    set_committed_value(instance, key, value)
    return swept


_SWEPT_COLUMNS = ("state", "outcome", "canceled_at", "updated_at")


@functools.cache
def _sweep_stmt() -> Any:
    table: Any = StepExecution.__table__
    return (
        update(table)
        .where(
            table.c.workflow_id == bindparam("of_workflow"), _in_state(table.c.state, *_SWEEPABLE)
        )
        .values({key: bindparam(f"v_{key}") for key in _SWEPT_COLUMNS})
    )


def insert_execution(session: Session, values: dict[str, Any]) -> StepExecution:
    """INSERT one execution with Core and return it as a loaded, clean instance of the session.

    ``values`` by attribute name, ``created_at`` included (it is also the ``updated_at``);
    every other column is NULL or its default. Cheaper than ``session.add()`` + flush, which
    is the one other flush a step would pay for.
    """
    mapper = sa_inspect(StepExecution)
    row = _execution_row(values)
    connection = _connection(session)
    if connection.dialect.insert_returning:
        row["id"] = int(direct.execute(connection, _insert_stmt(returning=True), row)[0])
    else:  # e.g. SQLite before 3.35: the driver's lastrowid, through SQLAlchemy
        key = connection.execute(_insert_stmt(returning=False), [row]).inserted_primary_key
        assert key is not None  # an INSERT of one row always reports its key
        row["id"] = int(key[0])
    execution: StepExecution = _as_loaded(session, mapper, row)
    return execution


def _execution_row(values: dict[str, Any]) -> dict[str, Any]:
    """Every column of a new execution but ``id``: ``values``, else NULL or the default."""
    row: dict[str, Any] = {attr.key: None for attr in sa_inspect(StepExecution).column_attrs}
    row.update(state=ExecutionState.SCHEDULED, queue="default", priority=0)
    row.update(values)
    row["updated_at"] = row["created_at"]
    del row["id"]
    return row


def _as_loaded(
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
    state = sa_inspect(instance)
    state.dict.update(values)
    make_transient_to_detached(instance)
    session.add(instance)
    if from_select and manager.dispatch.load:
        manager.dispatch.load(state, None)  # no Query behind it, as after Session.merge()
    return instance


@functools.cache
def _insert_stmt(*, returning: bool) -> Any:
    table: Any = StepExecution.__table__
    columns = sa_inspect(StepExecution).column_attrs
    stmt = table.insert().values(
        {attr.columns[0]: bindparam(attr.key) for attr in columns if attr.key != "id"}
    )
    return stmt.returning(table.c.id) if returning else stmt


def current_execution(session: Session, workflow_id: int) -> StepExecution | None:
    """The single scheduled, waiting or in-progress execution, if any (newest wins).

    A parked execution with a signal timeout has its timeout row (scheduled) beside it; the
    waiting row is the current one, so it comes first.
    """
    stmt = (
        select(StepExecution)
        .where(
            StepExecution.workflow_id == workflow_id,
            _in_state(
                StepExecution.state,
                ExecutionState.SCHEDULED,
                ExecutionState.WAITING,
                ExecutionState.IN_PROGRESS,
            ),
        )
        .order_by(
            case((_in_state(StepExecution.state, ExecutionState.WAITING), 0), else_=1),
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
            _in_state(StepExecution.state, ExecutionState.COMPLETED),
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


def find_ongoing_duplicate(
    session: Session, type_: str, hero_type: str | None, hero_id: str | None
) -> int | None:
    """Id of an ongoing, single-instance workflow of ``type_`` for this hero, if any."""
    wf = workflow_model()
    stmt = select(wf.id).where(
        wf.type == type_,
        wf.hero_type == hero_type if hero_type is not None else wf.hero_type.is_(None),
        wf.hero_id == hero_id if hero_id is not None else wf.hero_id.is_(None),
        wf.state.notin_((WorkflowState.FINISHED, WorkflowState.CANCELED)),
        wf.allow_multiple.is_(False),
    )
    return session.execute(stmt.limit(1)).scalar_one_or_none()


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
            _in_state(StepExecution.state, ExecutionState.COMPLETED),
            StepExecution.outcome == Outcome.WORKFLOW_PAUSED,
            StepExecution.id.notin_(successors),
        )
        .order_by(StepExecution.created_at.desc(), StepExecution.id.desc())
        .limit(1)
    )
    return session.execute(stmt).scalar_one_or_none()


def _workflow_is_ready(wf: Any) -> Any:
    """``state = 'ready'`` written so that no index on ``state`` can serve it.

    Joined from the due executions, the workflow must be found by primary key. On a backlog
    that arrives before ANALYZE has run, PostgreSQL believes one workflow is ready and picks
    the state index instead, scanning every ready workflow for every due execution —
    quadratic, 280 ms a claim at 1,400 due rows. ``state`` is NOT NULL, so the COALESCE
    changes nothing but the plan.
    """
    return func.coalesce(wf.state, "") == WorkflowState.READY


def claim_due_execution(
    session: Session, now: datetime, queues: Sequence[str] | None
) -> tuple[int, int] | None:
    """Pick one due scheduled execution and lock it and its workflow row, skipping busy ones.

    ``FOR UPDATE OF … SKIP LOCKED`` (see :func:`_claim_locked`) lets concurrent workers pass
    over each other's rows instead of queueing behind them. Lower ``priority`` runs first,
    then the earliest due. SQLite renders neither clause; its ``BEGIN IMMEDIATE`` transaction
    is already the only writer.
    """
    return _claim(session, now, queues)


def _claim(
    session: Session, now: datetime, queues: Sequence[str] | None, execution_id: int | None = None
) -> tuple[int, int] | None:
    mysql = _is_mysql(session)
    params: dict[str, Any] = {"now": now}
    if execution_id is not None:
        params["execution_id"] = execution_id
    if queues:
        params["queues"] = list(queues)
    stmt = _claim_stmt(by_id=execution_id is not None, queued=bool(queues), mysql=mysql)
    if mysql:
        # No FOR UPDATE OF on MariaDB: candidates without locks, then their workflow rows one
        # by one (see the helper).
        candidates = session.execute(stmt, params).all()
        return _mysql_lock_first_claimable(session, candidates, now, queues)
    return _claim_locked(session, stmt, params)


@functools.lru_cache(maxsize=8)
def _claim_stmt(*, by_id: bool, queued: bool, mysql: bool) -> Any:
    """The claim, built once per shape (its compiled form is then cached by SQLAlchemy)."""
    wf = workflow_model()
    stmt = (
        select(StepExecution.id, StepExecution.workflow_id)
        .join(wf, wf.id == StepExecution.workflow_id)
        .where(_in_state(StepExecution.state, ExecutionState.SCHEDULED))
        .where(StepExecution.scheduled_for <= bindparam("now"))
        # Only ready workflows: a paused one keeps its row for resume(), and claiming it
        # would be a no-op that a worker repeats forever.
        .where(_workflow_is_ready(wf))
    )
    if by_id:
        stmt = stmt.where(StepExecution.id == bindparam("execution_id"))
    else:
        stmt = stmt.order_by(StepExecution.priority, StepExecution.scheduled_for)
    if queued:
        stmt = stmt.where(StepExecution.queue.in_(bindparam("queues", expanding=True)))
    if mysql:
        return stmt if by_id else stmt.limit(MYSQL_CLAIM_CANDIDATES)
    if not by_id:
        stmt = stmt.limit(1)
    return (
        stmt.add_columns(StepExecution, wf)
        .with_for_update(of=(wf, StepExecution), skip_locked=True)
        # The rows it locks are the latest versions: refresh instances already loaded.
        .execution_options(populate_existing=True)
    )


def _claim_locked(session: Session, stmt: Any, params: dict[str, Any]) -> tuple[int, int] | None:
    """Run a claim on PostgreSQL/SQLite, loading and locking the execution and its workflow.

    ``FOR UPDATE OF workflows, executions SKIP LOCKED``: the workflow lock is the one that
    serialises everything (see the module docstring); the execution lock is what makes the
    loaded execution current. Under READ COMMITTED a row lock re-reads the latest version of
    each *locked* row and re-checks the WHERE (PostgreSQL's EvalPlanQual), so a row another
    worker finished between our snapshot and our lock is either seen finished or not
    returned — without it, the execution would be as of the statement's snapshot, and phase
    1 would have to select it again. SKIP LOCKED never waits, so taking the two locks in one
    statement cannot deadlock against the workflow-first order of everyone else.
    """
    if session.identity_map:
        # Instances this session already holds must be refreshed in place: the ORM does it.
        row = session.execute(stmt, params).first()
        if row is None:
            return None
        execution, workflow = row[2], row[3]
    else:
        # A fresh session (every worker claim): the same statement through Core, and the two
        # instances built from its row - a third of the cost of the ORM's loading.
        core = _core_claim(stmt)
        loaded = direct.execute(_connection(session), core, params)
        if loaded is None:
            return None
        labels = core.selected_columns.keys()
        execution, workflow = _claimed_instances(session, dict(zip(labels, loaded, strict=True)))
    remember_workflow_lock(session, workflow.id, workflow)
    held = _held(session, create=True)
    if held is not None:
        held[1][execution.id] = execution
    return (execution.id, workflow.id)


@functools.lru_cache(maxsize=8)
def _core_claim(stmt: Any) -> Any:
    """The ORM claim ``stmt`` selecting plain, labelled columns of both rows instead."""
    executions: Any = StepExecution.__table__
    workflows: Any = workflow_model().__table__
    columns = [c.label(f"e_{c.key}") for c in executions.c]
    columns += [c.label(f"w_{c.key}") for c in workflows.c]
    return stmt.with_only_columns(*columns).execution_options(populate_existing=False)


def _claimed_instances(session: Session, values: dict[str, Any]) -> tuple[StepExecution, Workflow]:
    execution_mapper = sa_inspect(StepExecution)
    execution = _as_loaded(
        session,
        execution_mapper,
        {a.key: values[f"e_{a.columns[0].key}"] for a in execution_mapper.column_attrs},
        from_select=True,
    )
    base = sa_inspect(workflow_model())
    # The row's own class (a vanished class loads as the base: see workflow._FallbackIdentities).
    mapper = base.polymorphic_map[values["w_type"]]
    workflow = _as_loaded(
        session,
        mapper,
        {a.key: values[f"w_{a.columns[0].key}"] for a in base.column_attrs},
        from_select=True,
    )
    return execution, workflow


# MySQL/MariaDB: how many due executions one claim considers before reporting nothing due.
# Only rows whose workflow is locked at this very moment (phase 1 or 3 of another worker) are
# passed over, so a handful per worker thread is plenty.
MYSQL_CLAIM_CANDIDATES = 16


def _is_mysql(session: Session) -> bool:
    return session.get_bind().dialect.name in ("mysql", "mariadb")


def _mysql_lock_first_claimable(
    session: Session,
    candidates: Sequence[Any],
    now: datetime,
    queues: Sequence[str] | None,
) -> tuple[int, int] | None:
    """The claim on MySQL/MariaDB: lock the first candidate's workflow row that is free.

    MariaDB has no ``FOR UPDATE OF <table>``: on a join, ``FOR UPDATE SKIP LOCKED`` locks the
    rows of both tables in whatever order the plan reads them (execution first, breaking the
    workflow-first lock order), and with ``ORDER BY … LIMIT`` InnoDB may lock every due row it
    sorted, not just the one returned. So the candidates are read without locks, and each
    one's workflow row alone is locked with ``SKIP LOCKED`` — on the condition that the
    execution is still claimable. That condition is a non-locking subquery (READ COMMITTED:
    the latest committed state); InnoDB drops the lock again from a workflow row that fails
    it. As on PostgreSQL, a claim that turns out stale by the time phase 1 re-reads the rows
    under the lock is a harmless no-op there.
    """
    wf = workflow_model()
    for execution_id, workflow_id in candidates:
        claimable = (
            select(StepExecution.id)
            .where(StepExecution.id == execution_id)
            .where(StepExecution.workflow_id == wf.id)
            .where(_in_state(StepExecution.state, ExecutionState.SCHEDULED))
            .where(StepExecution.scheduled_for <= now)
        )
        if queues:
            claimable = claimable.where(StepExecution.queue.in_(queues))
        locked = session.execute(
            select(wf.id)
            .where(wf.id == workflow_id, wf.state == WorkflowState.READY, claimable.exists())
            .with_for_update(skip_locked=True)
        ).first()
        if locked is not None:
            remember_workflow_lock(session, workflow_id)
            return execution_id, workflow_id
    return None


def claim_execution(
    session: Session, execution_id: int, now: datetime, queues: Sequence[str] | None
) -> tuple[int, int] | None:
    """Claim one known execution the way :func:`claim_due_execution` claims any: eager continuation.

    Same conditions and the same ``FOR UPDATE OF … SKIP LOCKED``, so a worker running the
    step it just scheduled can never collide with another worker that saw the row too.
    """
    return _claim(session, now, queues, execution_id)


def next_claimable_due_time(session: Session, queues: Sequence[str] | None) -> datetime | None:
    """When the next execution a worker could claim falls due (ready workflows only).

    Rows kept for a paused workflow's ``resume()`` are ignored: they are due in the past, and
    an idle worker timing its sleep on them would spin. Written as "the first scheduled row
    in due order whose workflow is ready" rather than ``MIN()`` over a join: the scheduled
    rows' due-time index is walked in order and each workflow found by
    primary key, stopping at the first ready one, so the cost does not grow with the tables
    (``MIN()`` let PostgreSQL hash-join every workflow at 1M rows).
    """
    wf = workflow_model()
    stmt = (
        select(StepExecution.scheduled_for)
        .join(wf, wf.id == StepExecution.workflow_id)
        .where(_in_state(StepExecution.state, ExecutionState.SCHEDULED), _workflow_is_ready(wf))
        .order_by(StepExecution.scheduled_for)
        .limit(1)
    )
    if queues:
        stmt = stmt.where(StepExecution.queue.in_(queues))
    return session.execute(stmt).scalar_one_or_none()


def extend_leases(session: Session, worker_id: str, until: datetime, now: datetime) -> int:
    """Heartbeat: push out the lease of every in-progress execution ``worker_id`` holds.

    Only rows still ``in_progress``: one recovered by another worker (its lease had run out)
    stays recovered — the recovery re-checks the lease under the row lock, and this UPDATE
    re-checks the state after waiting for that lock, so the two never both win.
    """
    result = session.execute(
        update(StepExecution)
        .where(
            StepExecution.lease_owner == worker_id,
            _in_state(StepExecution.state, ExecutionState.IN_PROGRESS),
        )
        .values(lease_expires_at=until, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    return int(getattr(result, "rowcount", 0) or 0)


def expired_lease_ids(
    session: Session, now: datetime, limit: int, after: tuple[datetime, int] | None = None
) -> list[tuple[datetime, int]]:
    """In-progress executions whose worker stopped heartbeating, oldest expiry first.

    Uses the partial index ``ix_geneva_drive_step_executions_lease`` (in-progress rows only),
    so the sweep every worker runs costs the same with 1k or 10M finished rows. Keyset
    pagination by ``(lease_expires_at, id)``: a row that could not be recovered is passed over.
    """
    stmt = (
        select(StepExecution.lease_expires_at, StepExecution.id)
        .where(
            _in_state(StepExecution.state, ExecutionState.IN_PROGRESS),
            StepExecution.lease_expires_at < now,
        )
        .order_by(StepExecution.lease_expires_at, StepExecution.id)
        .limit(limit)
    )
    if after is not None:
        stmt = stmt.where(_after(StepExecution.lease_expires_at, StepExecution.id, after))
    return _keys(session, stmt)


def stuck_in_progress_ids(
    session: Session,
    cutoff: datetime,
    now: datetime,
    limit: int,
    after: tuple[datetime, int] | None = None,
) -> list[tuple[datetime, int]]:
    """In-progress executions started before ``cutoff`` whose lease (if any) has run out.

    A step that runs for hours under a worker that still heartbeats is not stuck: only rows
    without a lease (external backends) or with an expired one qualify. By started_at, id.
    """
    stmt = (
        select(StepExecution.started_at, StepExecution.id)
        .where(
            _in_state(StepExecution.state, ExecutionState.IN_PROGRESS),
            StepExecution.started_at < cutoff,
            or_(StepExecution.lease_expires_at.is_(None), StepExecution.lease_expires_at < now),
        )
        .order_by(StepExecution.started_at, StepExecution.id)
        .limit(limit)
    )
    if after is not None:
        stmt = stmt.where(_after(StepExecution.started_at, StepExecution.id, after))
    return _keys(session, stmt)


def stuck_scheduled_ids(
    session: Session, cutoff: datetime, limit: int, after: tuple[datetime, int] | None = None
) -> list[tuple[datetime, int]]:
    """Scheduled executions overdue since before ``cutoff``, oldest first.

    Rows of paused workflows are left out: they are kept on purpose for ``resume()`` (the gem
    recovered them — H-12). ``waiting`` rows are never stuck: they wait for a signal.
    """
    wf = workflow_model()
    stmt = (
        select(StepExecution.scheduled_for, StepExecution.id)
        .join(wf, wf.id == StepExecution.workflow_id)
        .where(
            _in_state(StepExecution.state, ExecutionState.SCHEDULED),
            StepExecution.scheduled_for < cutoff,
            wf.state != WorkflowState.PAUSED,
        )
        .order_by(StepExecution.scheduled_for, StepExecution.id)
        .limit(limit)
    )
    if after is not None:
        stmt = stmt.where(_after(StepExecution.scheduled_for, StepExecution.id, after))
    return [(row[0], row[1]) for row in session.execute(stmt)]


def _keys(session: Session, stmt: Any) -> list[tuple[datetime, int]]:
    """(sort key, id) rows of a keyset query; the WHERE already rules out NULL keys."""
    return [(at, id_) for at, id_ in session.execute(stmt) if at is not None]


def _after(column: Any, id_column: Any, after: tuple[datetime, int]) -> Any:
    """``(column, id) > after`` written out, as row-value comparison is not portable."""
    at, last_id = after
    return or_(column > at, and_(column == at, id_column > last_id))


# -- housekeeping: batched cleanup and gauges ------------------------------------------------


def _old_terminal_workflow_ids(cutoff: datetime) -> Any:
    """Ids of finished/canceled workflows that transitioned before ``cutoff``.

    ``state IN (…) AND transitioned_at < cutoff`` is one range per terminal state of
    ``ix_geneva_drive_workflows_state_transitioned`` (``state`` equal, ``transitioned_at``
    bounded), so a pass that finds nothing old reads a few index pages whatever the history
    kept — where the ``state`` index alone matched nearly every row of a mature table.
    """
    wf = workflow_model()
    return select(wf.id).where(
        wf.state.in_(sorted(TERMINAL_WORKFLOW_STATES)),
        wf.transitioned_at < cutoff,
    )


def _delete_batch(session: Session, table: Any, ids: Any) -> int:
    """Delete the rows of ``table`` whose id the ``ids`` query (with its LIMIT) selects.

    PostgreSQL and SQLite: ``DELETE … WHERE id IN (SELECT id FROM (SELECT … LIMIT n) AS
    batch)`` — a semi-join on the primary key. MySQL/MariaDB: the multi-table form ``DELETE
    FROM t USING t, (SELECT … LIMIT n) AS batch WHERE t.id = batch.id``. The derived table is
    what lets MySQL/MariaDB take a LIMIT and read the table being deleted from; the join is
    because a single-table DELETE with an IN sub-query runs it as a *dependent* sub-query
    for every row of the table (no semi-join for DELETE before MariaDB 11.1): a full scan of
    the table per batch, even when nothing is old.
    """
    batch = ids.subquery("batch")
    if _is_mysql(session):
        stmt = delete(table).where(table.c.id == batch.c.id)
    else:
        stmt = delete(table).where(table.c.id.in_(select(batch.c.id)))
    result = session.execute(stmt, execution_options={"synchronize_session": False})
    return int(getattr(result, "rowcount", 0) or 0)


def delete_executions_of_old_workflows(session: Session, cutoff: datetime, limit: int) -> int:
    """Delete up to ``limit`` executions of finished/canceled workflows older than ``cutoff``."""
    se = StepExecution.__table__
    ids = (
        select(se.c.id).where(se.c.workflow_id.in_(_old_terminal_workflow_ids(cutoff))).limit(limit)
    )
    return _delete_batch(session, se, ids)


def delete_signals_of_old_workflows(session: Session, cutoff: datetime, limit: int) -> int:
    """Delete up to ``limit`` signals of finished/canceled workflows older than ``cutoff``."""
    sig = Signal.__table__
    ids = (
        select(sig.c.id)
        .where(sig.c.workflow_id.in_(_old_terminal_workflow_ids(cutoff)))
        .limit(limit)
    )
    return _delete_batch(session, sig, ids)


def delete_old_workflows(session: Session, cutoff: datetime, limit: int) -> int:
    """Delete up to ``limit`` finished/canceled workflows older than ``cutoff`` (children first)."""
    table = workflow_model().__table__
    return _delete_batch(session, table, _old_terminal_workflow_ids(cutoff).limit(limit))


def workflow_counts(session: Session, terminal_since: datetime) -> list[tuple[str, str, int]]:
    """(state, type, count) of ongoing workflows, and of terminal ones since ``terminal_since``.

    Ongoing (ready, performing, paused): all of them. Finished and canceled: only those whose
    ``transitioned_at`` is at or after ``terminal_since``. Both halves are ranges of
    ``ix_geneva_drive_workflows_state_transitioned`` — the ongoing states a prefix, the terminal
    ones ``(state, transitioned_at >= since)`` — so the cost follows the work in flight and the
    recent throughput, never the finished history kept until cleanup (counting every row was a
    full scan of the table on every pass). One statement: ``UNION ALL`` of the two.
    """
    wf = workflow_model()
    columns = (wf.state, wf.type, func.count())
    ongoing = select(*columns).where(wf.state.in_(sorted(ONGOING_WORKFLOW_STATES)))
    terminal = select(*columns).where(
        wf.state.in_(sorted(TERMINAL_WORKFLOW_STATES)), wf.transitioned_at >= terminal_since
    )
    stmt = ongoing.group_by(wf.state, wf.type).union_all(terminal.group_by(wf.state, wf.type))
    return [(row[0], row[1], int(row[2])) for row in session.execute(stmt)]


def waiting_counts(session: Session, since_before: datetime | None = None) -> list[tuple[str, int]]:
    """(workflow type, count) of ``waiting`` executions, optionally parked before a time.

    Each waiting row looks its workflow's type up by primary key (a correlated sub-query)
    instead of joining: with a join grouped by ``type``, SQLite preferred to walk every
    workflow in ``type`` index order (saving the GROUP BY a sort) and probe its executions —
    a pass that grew with the history. This way every planner starts from the waiting rows
    (the ``state`` index) and the cost follows how many are waiting.
    """
    wf = workflow_model()
    type_ = (
        select(wf.type)
        .where(wf.id == StepExecution.workflow_id)
        .scalar_subquery()
        .label("workflow_type")
    )
    stmt = (
        select(type_, func.count())
        .where(_in_state(StepExecution.state, ExecutionState.WAITING))
        .group_by(type_)
    )
    if since_before is not None:
        stmt = stmt.where(StepExecution.waiting_since < since_before)
    return [(row[0], int(row[1])) for row in session.execute(stmt)]


# -- cross-process coordination: NOTIFY and the housekeeping lock ----------------------------

NOTIFY_CHANNEL = "geneva_drive"
# An arbitrary, fixed 64-bit key for pg_try_advisory_lock ("gd-hk" in ASCII).
HOUSEKEEPING_LOCK_KEY = 0x67642D686B


def notify_due(connection: Connection, queue: str) -> None:
    """``NOTIFY geneva_drive, '<queue>'`` (PostgreSQL): wake listening idle workers."""
    connection.execute(select(func.pg_notify(NOTIFY_CHANNEL, queue)))


def try_housekeeping_lock(connection: Connection) -> bool:
    """Take the cluster-wide housekeeping lock on ``connection`` if free; never waits.

    PostgreSQL: a session-level advisory lock, released by :func:`release_housekeeping_lock`
    or when the connection closes (a crashed holder cannot keep it). MySQL/MariaDB:
    ``GET_LOCK`` with the same life cycle. SQLite runs on one node: always granted.
    """
    dialect = connection.dialect.name
    if dialect == "postgresql":
        return bool(
            connection.execute(select(func.pg_try_advisory_lock(HOUSEKEEPING_LOCK_KEY))).scalar()
        )
    if dialect in ("mysql", "mariadb"):
        return (
            connection.execute(select(func.get_lock("geneva_drive_housekeeping", 0))).scalar() == 1
        )
    return True


def release_housekeeping_lock(connection: Connection) -> None:
    dialect = connection.dialect.name
    if dialect == "postgresql":
        connection.execute(select(func.pg_advisory_unlock(HOUSEKEEPING_LOCK_KEY)))
    elif dialect in ("mysql", "mariadb"):
        connection.execute(select(func.release_lock("geneva_drive_housekeeping")))


def listen_statement() -> str:
    """What an idle worker's dedicated connection runs to receive :func:`notify_due`."""
    return f"LISTEN {NOTIFY_CHANNEL}"


# -- external queues (Celery): what was sent, what must be sent --------------------------------


def delivery_facts(session: Session, execution_id: int) -> tuple[str, datetime] | None:
    """(state, scheduled_for) of one execution, or None: what a message's receiver checks first."""
    row = session.execute(
        select(StepExecution.state, StepExecution.scheduled_for).where(
            StepExecution.id == execution_id
        )
    ).first()
    return None if row is None else (row[0], row[1])


def record_job_id(session: Session, execution_id: int, job_id: str | None, now: datetime) -> None:
    """Remember the message that carries an execution (None: no message is out for it).

    ``updated_at`` doubles as the time it was sent, which :func:`executions_to_dispatch` uses
    to tell a lost message from a recent one. ``job_id`` is delivery bookkeeping, not workflow
    state, so this one write goes without the workflow lock: a send never waits for a step.
    """
    session.execute(
        update(StepExecution)
        .where(StepExecution.id == execution_id)
        .values(job_id=job_id, updated_at=now)
        .execution_options(synchronize_session=False)
    )


def executions_to_dispatch(
    session: Session, *, send_before: datetime, resend_before: datetime, limit: int
) -> Sequence[tuple[StepExecution, Workflow]]:
    """Scheduled executions of ready workflows that an external queue must be told about.

    Never sent (``job_id`` is NULL) and due before ``send_before`` (now + the ETA horizon); or
    sent before ``resend_before`` and due since before it — a message presumed lost. Paused
    workflows' rows wait for ``resume()``. The outer ``scheduled_for`` bound lets the scheduled
    rows' ``scheduled_for`` index do the work: cost follows due rows, not table size.
    """
    wf = workflow_model()
    stmt = (
        select(StepExecution, wf)
        .join(wf, wf.id == StepExecution.workflow_id)
        .where(
            _in_state(StepExecution.state, ExecutionState.SCHEDULED),
            StepExecution.scheduled_for <= send_before,
            wf.state == WorkflowState.READY,
            or_(
                StepExecution.job_id.is_(None),
                and_(
                    StepExecution.scheduled_for <= resend_before,
                    StepExecution.updated_at <= resend_before,
                ),
            ),
        )
        .order_by(StepExecution.scheduled_for, StepExecution.id)
        .limit(limit)
        .execution_options(populate_existing=True)
    )
    return [(row[0], row[1]) for row in session.execute(stmt)]


def checkpoint_execution(
    session: Session,
    execution_id: int,
    workflow_id: int,
    owner: str | None,
    now: datetime,
    cursor: Any,
    *,
    read_workflow: bool,
) -> tuple[bool, str | None]:
    """Write a resumable step's encoded ``cursor`` iff the execution is still ours.

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
    params = {"gd_id": execution_id, "gd_owner": owner, "gd_now": now, "gd_cursor": cursor}
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
            _in_state(table.c.state, ExecutionState.IN_PROGRESS),
            table.c.lease_owner.is_not_distinct_from(
                bindparam("gd_owner", type_=table.c.lease_owner.type)
            ),
        )
        .values(
            {
                table.c.cursor: bindparam("gd_cursor", type_=table.c.cursor.type),
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


_TRANSIENT_SQLSTATES = {"40001", "40P01", "55P03"}  # serialization, deadlock, lock not available
_TRANSIENT_MYSQL_CODES = {1205, 1213}  # lock wait timeout, deadlock


def is_transient(error: BaseException) -> bool:
    """A database error that says "try again" (deadlock, lock timeout, lost connection).

    Such an error is the database's, not the step's: the executor must not record it as a
    step failure, only let the transaction roll back and the execution run again.
    """
    from sqlalchemy.exc import DBAPIError

    if not isinstance(error, DBAPIError):
        return False
    if error.connection_invalidated:
        return True
    orig = error.orig
    if getattr(orig, "sqlstate", None) in _TRANSIENT_SQLSTATES:
        return True
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and args[0] in _TRANSIENT_MYSQL_CODES:
        return True
    return "database is locked" in str(orig)

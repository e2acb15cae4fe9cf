"""Claiming due executions for a worker (SKIP LOCKED, the MariaDB two-step claim), and leases."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Integer,
    String,
    and_,
    any_,
    bindparam,
    false,
    func,
    literal_column,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.orm import Session

from geneva_drive.core.states import ExecutionState, Outcome, WorkflowState
from geneva_drive.storage.dialects import dialect_of
from geneva_drive.storage.models import StepExecution, WorkflowColumns
from geneva_drive.storage.queries._sql import (
    after_key,
    as_array,
    in_state,
    keyset,
    text_array,
    workflow_model,
)
from geneva_drive.storage.queries.bypass import (
    as_loaded,
    connection_of,
    execute_direct,
    held_locks,
    remember_workflow_lock,
)


@dataclass(frozen=True)
class ClaimScope:
    """What a worker may claim: the queues it serves, and the classes whose rows it can run.

    ``queues`` empty: every queue. With ``loaded_only`` (a worker's scope, see
    ``loaded.claim_scope``) only executions whose workflow's ``type`` is one of
    ``workflow_types`` and whose ``hero_type`` is NULL or one of ``hero_types``: a row of a
    class it has not loaded would fail on it (a hero it cannot load pauses the workflow, a
    vanished hero-less class is canceled), and is left scheduled for a worker that has the
    code. Without it, rows of every class (a runner handed one execution by id, tests).

    ``fair``: some class it serves has a ``fairness_key``: its claims then take turns, the
    ordinary claim's (rows without a key) and the keys' (``queries.fairness``,
    ``engine.fair_turns``). Without one, every claim is the ordinary one.
    """

    queues: tuple[str, ...] = ()
    workflow_types: tuple[str, ...] = ()
    hero_types: tuple[str, ...] = ()
    loaded_only: bool = False
    fair: bool = False

    @classmethod
    def on_queues(cls, queues: Sequence[str] | None) -> ClaimScope:
        """Rows of every class on ``queues`` (None or empty: every queue)."""
        return cls(queues=tuple(queues or ()))

    @property
    def params(self) -> dict[str, str]:
        """One bound parameter per class name (not an expanding IN): the statement is then
        fixed for a given number of names, so it keeps the DBAPI short path and psycopg's
        prepared statements, and its text is what test_claim_plans explains."""
        return {
            **{f"wf_type_{i}": name for i, name in enumerate(self.workflow_types)},
            **{f"hero_type_{i}": name for i, name in enumerate(self.hero_types)},
        }

    @functools.cached_property
    def array_params(self) -> dict[str, str]:
        """The names as two arrays, for :func:`loaded_classes_in_arrays` (PostgreSQL)."""
        return {
            "wf_types": text_array(self.workflow_types),
            "hero_types": text_array(("", *self.hero_types)),
        }

    @property
    def takes_turns(self) -> bool:
        """Whether keyed rows are among those it may claim: a class it serves has a key, or
        it serves every class (the ordinary claim takes none of them)."""
        return self.fair or not self.loaded_only

    @property
    def shape(self) -> Shape:
        """How many workflow and hero types it binds: the claim statement is built per shape."""
        if not self.loaded_only:
            return None
        return len(self.workflow_types), len(self.hero_types)


EVERY_CLASS_ANY_QUEUE = ClaimScope()


def without_key(fair_key: Any) -> Any:
    """The ordinary claim's rows: those without a fairness key. A keyed row is claimed by its
    key's turn only (``queries.fairness``); the ordinary claim's partial indexes hold only
    unkeyed rows (``models.UNKEYED_SCHEDULED``, migration 0016), so it never walks past a
    keyed burst to find its row, and its statement is the same in every worker."""
    return fair_key.is_(None)


Shape = tuple[int, int] | None  # a ClaimScope's shape; None: rows of every class


def _loaded_classes_only(wf: Any, shape: tuple[int, int]) -> Any:
    """``type IN (…) AND (hero_type IS NULL OR hero_type IN (…))``, one parameter per name.

    Both columns are on the workflow row, which the claim finds by primary key from each due
    execution in index order. Written inside COALESCE for the reason given at
    :func:`_workflow_is_ready`: as a bare ``type IN (…)`` SQLite drove the claim from the
    workflows' type index instead, and sorted every due row of those types for each claim.
    """
    types, heroes = shape
    if not types:
        return false()
    names = [bindparam(f"wf_type_{i}", type_=String) for i in range(types)]
    hero_names = [bindparam(f"hero_type_{i}", type_=String) for i in range(heroes)]
    no_hero = literal_column("''", String)  # a class name is never empty
    return and_(
        func.coalesce(wf.type, "").in_(names),
        func.coalesce(wf.hero_type, no_hero).in_([no_hero, *hero_names]),
    )


def loaded_classes_in_arrays(wf: Any) -> Any:
    """:func:`_loaded_classes_only` with the names bound as two arrays (``wf_types``,
    ``hero_types``; see ``ClaimScope.array_params``): two parameters however many classes, for
    a statement that binds many others (psycopg caches and prepares a statement of at most
    50 parameters only). PostgreSQL only; it plans ``= ANY(…)`` as it plans ``IN (…)``."""
    no_hero = literal_column("''", String)
    return and_(
        func.coalesce(wf.type, "") == any_(as_array("wf_types")),
        func.coalesce(wf.hero_type, no_hero) == any_(as_array("hero_types")),
    )


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
    session: Session, now: datetime, scope: ClaimScope = EVERY_CLASS_ANY_QUEUE
) -> tuple[int, int] | None:
    """Pick one due scheduled execution and lock it and its workflow row, skipping busy ones.

    ``FOR UPDATE OF … SKIP LOCKED`` (see :func:`_claim_locked`) lets concurrent workers pass
    over each other's rows instead of queueing behind them. Lower ``priority`` runs first,
    then the earliest due. SQLite renders neither clause; its ``BEGIN IMMEDIATE`` transaction
    is already the only writer.
    """
    return _claim(session, now, scope)


def _claim(
    session: Session, now: datetime, scope: ClaimScope, execution_id: int | None = None
) -> tuple[int, int] | None:
    params: dict[str, Any] = {"now": now, **scope.params}
    if execution_id is not None:
        params["execution_id"] = execution_id
    queued = bool(scope.queues)
    if queued:
        params["queues"] = list(scope.queues)
    dialect = dialect_of(session)
    if execution_id is None and dialect.windowed_claim:
        # The due rows in claim order, tried one by one (see first_in_order).
        return _claim_locked(session, _windowed_core_claim(queued, scope.shape), params)
    candidates_first = dialect.claims_candidates_then_locks
    stmt = _claim_stmt(
        by_id=execution_id is not None,
        queued=queued,
        candidates_first=candidates_first,
        shape=scope.shape,
    )
    if candidates_first:
        # No FOR UPDATE OF on MariaDB: candidates without locks, then their workflow rows one
        # by one (see the helper).
        candidates = session.execute(stmt, params).all()
        return _mysql_lock_first_claimable(session, candidates, now, scope.queues)
    return _claim_locked(session, _core_claim(stmt), params)


@functools.lru_cache(maxsize=32)
def _claim_stmt(
    *,
    by_id: bool,
    queued: bool,
    candidates_first: bool,
    shape: Shape = None,
    row: Any = None,
    keyed: bool = False,
) -> Any:
    """The claim, built once per shape (its compiled form is then cached by SQLAlchemy).

    With ``row`` (rows of :func:`_scheduled_rows`, see :func:`first_in_order`): the claim of
    one of them, found by primary key, unordered. Of any due row, only rows without a
    fairness key (:func:`without_key`), unless ``keyed`` (a key's turn adds its key:
    ``queries.fairness``).
    """
    wf = workflow_model()
    # A row of the window names its workflow too: both rows are then found by primary key,
    # each on its own. Joined to each other, on tables planned while empty (throughput
    # mode's start) the planner read the workflows from the first page for each execution.
    joined = wf.id == (row.c.workflow_id if row is not None else StepExecution.workflow_id)
    stmt = (
        select(StepExecution.id, StepExecution.workflow_id)
        .join(wf, joined)
        .where(StepExecution.scheduled_for <= bindparam("now"))
        # Only ready workflows: a paused one keeps its row for resume(), and claiming it
        # would be a no-op that a worker repeats forever.
        .where(_workflow_is_ready(wf))
    )
    if row is not None or by_id:
        # One row, by primary key. The state inside COALESCE, so that no partial index (all
        # of them name the state) can serve the look-up: the primary key is then the only
        # index the planner may use. On tables not analysed yet it costs every index alike,
        # and took the scheduled rows' by due time, reading every due row for one.
        key = row.c.id if row is not None else bindparam("execution_id")
        stmt = stmt.where(
            StepExecution.id == key,
            func.coalesce(StepExecution.state, "") == literal_column("'scheduled'", String),
        )
    else:
        stmt = stmt.where(in_state(StepExecution.state, ExecutionState.SCHEDULED))
        if not keyed:
            stmt = stmt.where(without_key(StepExecution.fair_key))
        stmt = stmt.order_by(StepExecution.priority, StepExecution.scheduled_for)
    if queued:
        stmt = stmt.where(StepExecution.queue.in_(bindparam("queues", expanding=True)))
    if shape is not None:
        stmt = stmt.where(_loaded_classes_only(wf, shape))
    if candidates_first:  # read without locks (MySQL/MariaDB have no FOR UPDATE OF)
        return stmt if by_id else stmt.limit(MYSQL_CLAIM_CANDIDATES)
    if not by_id and row is None:
        stmt = stmt.limit(1)
    return (
        stmt.add_columns(StepExecution, wf)
        .with_for_update(of=(wf, StepExecution), skip_locked=True)
        # The rows it locks are the latest versions: refresh instances already loaded.
        .execution_options(populate_existing=True)
    )


# PostgreSQL: how many scheduled executions a claim (or the idle worker's look for the next
# due time) tries, in order, before it tries more (see first_in_order). The first need only
# outnumber the rows other workers are claiming at the same moment; the second the rows an
# operator leaves at the head of the queue (paused workflows', classes no worker has loaded).
CLAIM_WINDOWS = (16, 1024)
# Every window, then every scheduled row (None): the ordinary claim's (see first_in_order).
EVERY_WINDOW: tuple[int | None, ...] = (*CLAIM_WINDOWS, None)


@functools.lru_cache(maxsize=16)
def _scheduled_rows(
    *, queued: bool, due: bool, size: int | None, keyed: bool = False, key: Any = None
) -> Any:
    """Scheduled executions (id, workflow, due time) in the order of a partial index: the due
    ones in claim order (``due``), or every one by due time; the first ``size`` of them (a
    CTE), or all of them (``None``, a subquery). ``keyed``: only those of one fairness key
    (``fair_key``, the fair claim's: ``queries.fairness``), or of the key ``key`` gives (an
    expression of the statement, in place of the parameter)."""
    executions: Any = StepExecution.__table__
    stmt = select(executions.c.id, executions.c.workflow_id, executions.c.scheduled_for).where(
        in_state(executions.c.state, ExecutionState.SCHEDULED)
    )
    if due:
        now = bindparam("now", type_=executions.c.scheduled_for.type)
        stmt = stmt.where(executions.c.scheduled_for <= _unseen_by_the_planner(now))
        if not keyed:
            stmt = stmt.where(without_key(executions.c.fair_key))
        if keyed:
            # The key first: only the key's index gives that order, so the generic plan
            # cannot take the due rows' index instead and read past other keys' rows (it did,
            # its costs being alike for an average key). See the condition below.
            stmt = stmt.order_by(executions.c.fair_key)
        stmt = stmt.order_by(executions.c.priority, executions.c.scheduled_for)
    else:
        stmt = stmt.order_by(executions.c.scheduled_for)
    if queued:
        stmt = stmt.where(executions.c.queue.in_(bindparam("queues", expanding=True)))
    if keyed:
        # "key <= k AND key >= k", not "key = k": an equality would make the key a constant
        # to the planner, and drop it from the ORDER BY above.
        if key is None:
            key = bindparam("fair_key", type_=String)
        stmt = stmt.where(executions.c.fair_key >= key, executions.c.fair_key <= key)
    name = "due" if due else "scheduled"
    if size is None:
        return stmt.subquery(f"{name}_rows")
    # A literal, not a parameter: the planner then knows the window's size.
    return stmt.limit(literal_column(str(size), Integer)).cte(f"{name}_{size}")


def _unseen_by_the_planner(value: Any) -> Any:
    """``value`` as ``(SELECT value)``: evaluated once at run time, never known to the plan.

    psycopg prepares a statement on its sixth run, and PostgreSQL then plans it five more times
    with the parameters' values (custom plans) before it compares their average cost, plus an
    allowance for the planning itself, with the cost of one plan for any value (the generic
    plan), and keeps planning every run if the generic one costs more. Knowing ``now``, the
    custom plans of the claim's last window (every due row, see :func:`first_in_order`) expect
    every scheduled row to be due and read them in the index's order; the generic plan expects
    a third of them, and sorts them. Its cost then grows with the backlog until, past about
    5,000 scheduled rows, the generic plan loses: every claim is planned anew (1.2 ms of the
    server's CPU each). Found in the handover, which then held every window and was planned
    at every workflow's finish (half its work per step at 8,000 workflows); its custom plans
    also took a partial index of in-progress rows for a look-up by primary key. Unseen, the
    value leaves both plans the same estimate, and the generic plan, which skips the
    planning, is kept from the eleventh run on.
    """
    return select(value).scalar_subquery()


def first_in_order(
    of_row: Callable[[Any], Any],
    *,
    queued: bool,
    due: bool,
    windows: tuple[int | None, ...] = EVERY_WINDOW,
    keyed: bool = False,
    key: Any = None,
) -> Any:
    """The first row that ``of_row`` gives for a scheduled execution, the executions taken
    in the order of :func:`_scheduled_rows` (``queued``, ``due``, ``keyed``). PostgreSQL.

    ``of_row(rows)`` is the query of one row of ``rows`` (it names their ``id``,
    ``workflow_id`` or ``scheduled_for``): the claim of that execution (``_claim_stmt(row=…)``
    with the caller's columns and conditions), or its due time if its workflow is ready.

    Why: the worker's claim and its look for the next due time keep the scheduled executions
    of ready workflows of the loaded classes. Written as one join, those conditions are on
    the workflow row, where the planner can only guess (they are inside COALESCE, see
    :func:`_workflow_is_ready`, and the class names are parameters), and it guesses that
    almost no workflow passes them. Once ANALYZE has seen a few hundred workflows —
    autovacuum runs it within a minute of a backlog arriving — the plan it kept read every
    ready workflow, looked up each one's execution and sorted them all, to return one row: a
    claim took 5 ms at 2,000 ready workflows and 46 ms at 20,000, so that a backlog drained
    in time quadratic in its size, and the look for the next due time 53 ms with 20,000
    workflows waiting.

    So the rows are taken from the partial index in its order, with no join and nothing to
    guess, and ``of_row`` is tried on each in turn, its workflow (and execution) found by
    primary key, until one gives a row (``JOIN LATERAL … LIMIT 1``). They are tried without
    an ORDER BY of their own, which would try them all — and a claim lock every claimable
    one: a lateral subquery that PostgreSQL cannot merge into the outer query (it has a
    LIMIT) is joined by a nested loop, which keeps the order of its outer side, the
    index's. The rows come in windows, each read only if the one before was full and gave
    nothing (rows other workers are claiming at this moment, ``SKIP LOCKED``; paused
    workflows' rows kept for ``resume()``; classes this worker has not loaded): the first
    ``CLAIM_WINDOWS[0]`` (for a LIMIT that small the planner reads the index in order), then the
    first ``CLAIM_WINDOWS[1]``, then every scheduled row, which may cost a read of them all,
    still with no workflow looked up but those tried. The windows are one ``UNION ALL``,
    each after the first gated by a condition PostgreSQL evaluates only if the ones before
    gave nothing; a window's rows are read as they are tried, so the first claimable row
    ends the reading. ``windows``: their sizes (None: every row), the claim's by default; the
    handover tries only the first (see ``queries.handover``). ``key``: see
    :func:`_scheduled_rows`.
    """
    branches: list[Any] = []
    not_before: list[Any] = []
    for size in windows:
        rows = _scheduled_rows(queued=queued, due=due, size=size, keyed=keyed, key=key)
        name = f"first_of_{size or 'all'}"
        found = _first_of(rows, of_row(rows), f"tried_{size or 'all'}")
        found = found.cte(name) if size is not None else found.subquery(name)
        branches.append(select(*found.c).where(*not_before))
        if size is not None:
            full = select(func.count()).select_from(rows).scalar_subquery() == size
            not_before += [~select(found.c[0]).exists(), full]
    if len(branches) == 1:
        return branches[0]  # one row at most already (_first_of)
    # At most one branch gives a row; the LIMIT says so to the planner (which would count
    # one per branch) and stops the reading at the first.
    return union_all(*branches).limit(literal_column("1", Integer))


def _first_of(rows: Any, of_row: Any, name: str) -> Any:
    one = literal_column("1", Integer)
    # LIMIT 1 of its own (it gives one row at most anyway): PostgreSQL would otherwise merge
    # a subquery without one (nor FOR UPDATE) into the outer join, and be free to join it
    # any way it likes — on tables planned while empty, by reading every workflow.
    tried = of_row.limit(one).lateral(name)
    return select(*tried.c).select_from(rows).join(tried, true()).limit(one)


def _claim_locked(session: Session, core: Any, params: dict[str, Any]) -> tuple[int, int] | None:
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
    # The statement through Core (``_core_claim``), and the two instances built from its
    # row: a third of the cost of the ORM's loading.
    loaded = execute_direct(connection_of(session), core, params)
    if loaded is None:
        return None
    return load_claimed(session, dict(zip(_selected_labels(core), loaded, strict=True)))


def load_claimed(session: Session, values: dict[str, Any]) -> tuple[int, int]:
    """The claimed rows' instances from a claim's row (``values`` by label, ``e_*`` and
    ``w_*``: :func:`_core_claim`'s), held as this transaction's locked rows."""
    if _holds_either(session, values["e_id"], values["w_id"]):
        # Instances this session already holds are refreshed in place instead (a session
        # that claims after finishing a workflow, whose body may have loaded other rows).
        # Read again, plainly: the claim holds both row locks, so these reads see the rows
        # as it locked them.
        execution = session.get(StepExecution, values["e_id"], populate_existing=True)
        workflow: WorkflowColumns | None = session.get(
            workflow_model(), values["w_id"], populate_existing=True
        )
        assert execution is not None and workflow is not None  # locked by this transaction
    else:
        execution, workflow = _claimed_instances(session, values)
    remember_workflow_lock(session, workflow.id, workflow)
    held = held_locks(session, create=True)
    if held is not None:
        held[1][execution.id] = execution
    return (execution.id, workflow.id)


def _holds_either(session: Session, execution_id: int, workflow_id: int) -> bool:
    identities = session.identity_map
    if not identities:
        return False
    execution_key = StepExecution.__mapper__.identity_key_from_primary_key((execution_id,))
    workflow_key = workflow_model().__mapper__.identity_key_from_primary_key((workflow_id,))
    return execution_key in identities or workflow_key in identities


@functools.lru_cache(maxsize=8)
def _core_claim(stmt: Any) -> Any:
    """The ORM claim ``stmt`` selecting plain, labelled columns of both rows instead."""
    executions: Any = StepExecution.__table__
    workflows: Any = workflow_model().__table__
    columns = [c.label(f"e_{c.key}") for c in executions.c]
    columns += [c.label(f"w_{c.key}") for c in workflows.c]
    return stmt.with_only_columns(*columns).execution_options(populate_existing=False)


@functools.lru_cache(maxsize=8)
def _windowed_core_claim(queued: bool, shape: Shape) -> Any:
    """:func:`_core_claim` of the claim of any due row, through :func:`first_in_order`."""

    def claim_of(row: Any) -> Any:
        claim = _claim_stmt(
            by_id=False, queued=queued, candidates_first=False, shape=shape, row=row
        )
        return _core_claim(claim)

    return first_in_order(claim_of, queued=queued, due=True)


@functools.lru_cache(maxsize=8)
def _selected_labels(core: Any) -> tuple[str, ...]:
    return tuple(core.selected_columns.keys())


def _claimed_instances(
    session: Session, values: dict[str, Any]
) -> tuple[StepExecution, WorkflowColumns]:
    execution_mapper = StepExecution.__mapper__
    execution = as_loaded(
        session,
        execution_mapper,
        {key: values[label] for key, label in _labels(execution_mapper, "e_")},
        from_select=True,
    )
    base = workflow_model().__mapper__
    # The row's own class (a vanished class loads as the base: see workflow._FallbackIdentities).
    mapper = base.polymorphic_map[values["w_type"]]
    workflow = as_loaded(
        session,
        mapper,
        {key: values[label] for key, label in _labels(base, "w_")},
        from_select=True,
    )
    return execution, workflow


@functools.lru_cache(maxsize=8)
def _labels(mapper: Any, prefix: str) -> tuple[tuple[str, str], ...]:
    """(attribute, label in the claim's row) per column of ``mapper``: worked out once, not
    at every claim (it was a tenth of a claim's own Python)."""
    return tuple((a.key, f"{prefix}{a.columns[0].key}") for a in mapper.column_attrs)


# MySQL/MariaDB: how many due executions one claim considers before reporting nothing due.
# Only rows whose workflow is locked at this very moment (phase 1 or 3 of another worker) are
# passed over, so a handful per worker thread is plenty.
MYSQL_CLAIM_CANDIDATES = 16


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
            .where(in_state(StepExecution.state, ExecutionState.SCHEDULED))
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
    session: Session, execution_id: int, now: datetime, scope: ClaimScope = EVERY_CLASS_ANY_QUEUE
) -> tuple[int, int] | None:
    """Claim one known execution the way :func:`claim_due_execution` claims any: eager continuation.

    Same conditions and the same ``FOR UPDATE OF … SKIP LOCKED``, so a worker running the
    step it just scheduled can never collide with another worker that saw the row too.
    """
    return _claim(session, now, scope, execution_id)


def next_claimable_due_time(
    session: Session, scope: ClaimScope = EVERY_CLASS_ANY_QUEUE
) -> datetime | None:
    """When the next execution a worker could claim falls due (ready workflows only).

    Rows kept for a paused workflow's ``resume()`` are ignored: they are due in the past, and
    an idle worker timing its sleep on them would spin. So are rows of classes outside a
    :class:`ClaimScope`, for the same reason. Written as "the first scheduled row
    in due order whose workflow is ready" rather than ``MIN()`` over a join: the scheduled
    rows' due-time index is walked in order and each workflow found by
    primary key, stopping at the first ready one, so the cost does not grow with the tables
    (``MIN()`` let PostgreSQL hash-join every workflow at 1M rows).
    """
    stmt = _next_due_stmt(
        queued=bool(scope.queues),
        shape=scope.shape,
        windowed=dialect_of(session).windowed_claim,
    )
    params: dict[str, Any] = dict(scope.params)
    if scope.queues:
        params["queues"] = list(scope.queues)
    return session.execute(stmt, params).scalar_one_or_none()


@functools.lru_cache(maxsize=8)
def _next_due_stmt(*, queued: bool, shape: Shape, windowed: bool) -> Any:
    """:func:`next_claimable_due_time`'s query; on PostgreSQL the first scheduled rows first
    (:func:`first_in_order`)."""
    wf = workflow_model()

    def ready(stmt: Any) -> Any:
        stmt = stmt.where(_workflow_is_ready(wf))
        return stmt if shape is None else stmt.where(_loaded_classes_only(wf, shape))

    stmt = ready(
        select(StepExecution.scheduled_for)
        .join(wf, wf.id == StepExecution.workflow_id)
        .where(in_state(StepExecution.state, ExecutionState.SCHEDULED))
        .order_by(StepExecution.scheduled_for)
        .limit(1)
    )
    if queued:
        stmt = stmt.where(StepExecution.queue.in_(bindparam("queues", expanding=True)))
    if not windowed:
        return stmt

    def due_time_of(row: Any) -> Any:  # if its workflow, found by primary key, is ready
        return ready(select(row.c.scheduled_for).select_from(wf).where(wf.id == row.c.workflow_id))

    return first_in_order(due_time_of, queued=queued, due=False)


def unclaimable_counts(session: Session, scope: ClaimScope) -> list[tuple[str, str | None, int]]:
    """(workflow type, hero type, scheduled executions) a worker of ``scope`` leaves alone.

    Scheduled executions of ready workflows on the worker's queues whose class or hero class
    is not in the scope. It reads every scheduled row (the partial index, not the whole
    table), so a worker runs it at start and now and then, never per claim.
    """
    if scope.shape is None:
        return []  # a scope of every class leaves nothing alone
    wf = workflow_model()
    stmt = (
        select(wf.type, wf.hero_type, func.count())
        .join(StepExecution, StepExecution.workflow_id == wf.id)
        .where(in_state(StepExecution.state, ExecutionState.SCHEDULED), _workflow_is_ready(wf))
        .where(~_loaded_classes_only(wf, scope.shape))
        .group_by(wf.type, wf.hero_type)
        .order_by(wf.type, wf.hero_type)
    )
    if scope.queues:
        stmt = stmt.where(StepExecution.queue.in_(scope.queues))
    rows = session.execute(stmt, scope.params)
    return [(type_, hero_type, int(count)) for type_, hero_type, count in rows]


def extend_leases(
    session: Session, worker_id: str, execution_ids: Sequence[int], until: datetime, now: datetime
) -> int:
    """Heartbeat: push out the leases of the given executions, those ``worker_id`` runs now.

    By id, not by owner alone: a row leased to this worker that none of its threads runs any
    more (its phase 3 failed) must expire, or it would stay leased for the life of the worker,
    out of reach of lease recovery and housekeeping. The owner check keeps a row that another
    worker recovered and someone started again from being extended by us.

    Only rows still ``in_progress``: one recovered by another worker (its lease had run out)
    stays recovered — the recovery re-checks the lease under the row lock, and this UPDATE
    re-checks the state after waiting for that lock, so the two never both win.
    """
    if not execution_ids:
        return 0
    result = session.execute(
        update(StepExecution)
        .where(
            StepExecution.id.in_(list(execution_ids)),
            StepExecution.lease_owner == worker_id,
            in_state(StepExecution.state, ExecutionState.IN_PROGRESS),
        )
        .values(lease_expires_at=until, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    return int(getattr(result, "rowcount", 0) or 0)


def recovered_from(session: Session, execution_ids: Sequence[int]) -> list[int]:
    """Which of ``execution_ids`` lease recovery took away (ended ``recovered``): the ones a
    renewal missed because another worker found their lease run out, not because the step
    finished meanwhile."""
    if not execution_ids:
        return []
    rows = session.scalars(
        select(StepExecution.id)
        .where(
            StepExecution.id.in_(list(execution_ids)),
            StepExecution.outcome == Outcome.RECOVERED,
        )
        .order_by(StepExecution.id)
    )
    return list(rows)


def expire_leases(session: Session, worker_id: str, now: datetime) -> int:
    """Expire every in-progress lease ``worker_id`` holds: it is leaving, recover them at once."""
    result = session.execute(
        update(StepExecution)
        .where(
            StepExecution.lease_owner == worker_id,
            in_state(StepExecution.state, ExecutionState.IN_PROGRESS),
        )
        .values(lease_expires_at=now, updated_at=now)
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
            in_state(StepExecution.state, ExecutionState.IN_PROGRESS),
            StepExecution.lease_expires_at < now,
        )
        .order_by(StepExecution.lease_expires_at, StepExecution.id)
        .limit(limit)
    )
    if after is not None:
        stmt = stmt.where(after_key(StepExecution.lease_expires_at, StepExecution.id, after))
    return keyset(session, stmt)

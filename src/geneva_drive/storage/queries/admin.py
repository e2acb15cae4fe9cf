"""The admin API's queries: filtered keyset pages, capped counts, timelines, stats.

Every query here is a range of an index whose size follows the rows asked about — a page, the
work in flight, the last hour's throughput — never the whole history (tests/admin/
test_admin_plans.py checks the plans):

- pages of workflows: ``(created_at, id)``, ``(state, created_at, id)`` or ``(type,
  created_at, id)``, read in order with a keyset ``(created_at, id) < cursor`` and a LIMIT;
  never OFFSET, which reads and throws away every row before the page;
- "waits for signal X", "failed with error X", "has a failed execution": the candidates off
  the partial index over the waiting (failed) executions, a primary-key probe each, then a
  sort of those few (``_driven_keys``), never a walk of the workflows' creation order;
- a count stops at its cap (``SELECT count(*) FROM (… LIMIT cap + 1)``);
- a timeline: one workflow's rows by ``(workflow_id, …)``, the newest ``limit`` of them;
- stats: the partial indexes over scheduled, waiting and in-progress rows, and the
  ``finished_at`` range of the last hour.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import (
    String,
    and_,
    case,
    exists,
    func,
    literal_column,
    or_,
    select,
)
from sqlalchemy.orm import Session, aliased

from geneva_drive.core.states import ExecutionState, WorkflowState
from geneva_drive.storage.models import OperatorAction, Signal, StepExecution, workflows_table
from geneva_drive.storage.queries._sql import in_state

WORKFLOW_COLUMNS = (
    "id",
    "type",
    "state",
    "hero_type",
    "hero_id",
    "current_step_name",
    "next_step_name",
    "created_at",
    "transitioned_at",
    "updated_at",
)


@dataclass(frozen=True)
class Selection:
    """Which workflows an admin query is about: every field narrows it; None means any, a
    tuple any of its values. (``admin.WorkflowFilter`` is this, with its parsing.)"""

    workflow_type: str | tuple[str, ...] | None = None  # the stored ``type`` (class name)
    state: str | tuple[str, ...] | None = None  # WorkflowState values
    hero_type: str | None = None
    hero_id: str | None = None
    current_step: str | None = None  # the step it stands at (current or next step name)
    error_class: str | None = None  # error_class_name of its latest failed execution
    awaiting_signal: str | None = None  # the signal its waiting execution waits for; "*": any
    created_after: datetime | None = None
    created_before: datetime | None = None
    transitioned_after: datetime | None = None
    transitioned_before: datetime | None = None
    has_failed_execution: bool | None = None
    ids: tuple[int, ...] | None = None


ANY_SIGNAL = "*"  # Selection(awaiting_signal="*"): waiting for any signal


def _one_or_many(column: Any, value: str | tuple[str, ...]) -> Any:
    if isinstance(value, tuple):
        return column.in_(value)
    return column == value


def _failed() -> Any:
    return in_state(StepExecution.state, ExecutionState.FAILED)


def _latest_failed_with(error_class: str) -> Any:
    """Workflow ids whose newest failed execution (by created_at, id) has ``error_class``.

    Read from the partial index over failed rows; the "no newer failure" check is a probe of
    ``(workflow_id, state)`` per candidate.
    """
    newer = aliased(StepExecution)
    return select(StepExecution.workflow_id).where(
        _failed(),
        StepExecution.error_class_name == error_class,
        ~exists().where(
            newer.workflow_id == StepExecution.workflow_id,
            in_state(newer.state, ExecutionState.FAILED),
            or_(
                newer.created_at > StepExecution.created_at,
                and_(newer.created_at == StepExecution.created_at, newer.id > StepExecution.id),
            ),
        ),
    )


def _waiting_ids(signal: str) -> Any:
    """Ids of workflows waiting for ``signal`` ("*": any): the partial index over waiting rows."""
    waiting = in_state(StepExecution.state, ExecutionState.WAITING)
    if signal != ANY_SIGNAL:
        return select(StepExecution.workflow_id).where(
            waiting, StepExecution.awaiting_signal == signal
        )
    # "waiting_since IS NOT NULL" (writer.park, the only way into "waiting", stamps it) makes
    # this a range of the partial waiting index, which SQLite, with no statistics, would
    # otherwise pass over for a scan of the whole covering (workflow_id, state) index.
    return select(StepExecution.workflow_id).where(
        waiting, StepExecution.waiting_since.is_not(None)
    )


def _failed_ids() -> Any:
    # "error_class_name IS NOT NULL" (every failure records its error) makes this a range
    # of the partial failed index, which SQLite, with no statistics, would otherwise pass
    # over for a scan of the whole (workflow_id, state) index.
    return select(StepExecution.workflow_id).where(
        _failed(), StepExecution.error_class_name.is_not(None)
    )


def _driver(where: Selection) -> tuple[Any, Selection] | None:
    """The workflow ids a selective filter reads off its partial index, and the rest of it.

    Waiting and failed rows are the live work: a few thousand, however long the history.
    """
    if where.awaiting_signal is not None:
        return _waiting_ids(where.awaiting_signal), replace(where, awaiting_signal=None)
    if where.error_class is not None:
        return _latest_failed_with(where.error_class), replace(where, error_class=None)
    if where.has_failed_execution is True:
        return _failed_ids(), replace(where, has_failed_execution=None)
    return None


def conditions(where: Selection) -> list[Any]:
    """The WHERE clauses of ``where`` over the workflows table."""
    t = workflows_table
    clauses: list[Any] = []
    if where.workflow_type is not None:
        clauses.append(_one_or_many(t.c.type, where.workflow_type))
    if where.state is not None:
        # Literals (the filter admits WorkflowState values only): a prepared statement's
        # generic plan then still knows "paused" is rare, and keeps the state index instead
        # of filtering its way through the creation order.
        states = (where.state,) if isinstance(where.state, str) else where.state
        known = tuple(WorkflowState(s) for s in states)
        clauses.append(_workflow_in(t, known) if known else t.c.id.is_(None))
    if where.hero_type is not None:
        clauses.append(t.c.hero_type == where.hero_type)
    if where.hero_id is not None:
        clauses.append(t.c.hero_id == where.hero_id)
    if where.current_step is not None:
        # Performing: current_step_name; ready or paused: next_step_name (the same step).
        clauses.append(
            or_(
                t.c.current_step_name == where.current_step,
                t.c.next_step_name == where.current_step,
            )
        )
    if where.error_class is not None:
        clauses.append(t.c.id.in_(_latest_failed_with(where.error_class)))
    if where.awaiting_signal is not None:
        clauses.append(t.c.id.in_(_waiting_ids(where.awaiting_signal)))
    for column, after, before in (
        (t.c.created_at, where.created_after, where.created_before),
        (t.c.transitioned_at, where.transitioned_after, where.transitioned_before),
    ):
        if after is not None:
            clauses.append(column >= after)
        if before is not None:
            clauses.append(column < before)
    if where.has_failed_execution is True:
        clauses.append(t.c.id.in_(_failed_ids()))
    elif where.has_failed_execution is False:
        clauses.append(~exists().where(StepExecution.workflow_id == t.c.id, _failed()))
    if where.ids is not None:
        clauses.append(t.c.id.in_(where.ids) if where.ids else t.c.id.is_(None))
    return clauses


def workflow_page(
    session: Session,
    where: Selection,
    *,
    newest_first: bool,
    limit: int,
    after: tuple[datetime, int] | None,
) -> Sequence[Any]:
    """Up to ``limit`` workflow rows (``WORKFLOW_COLUMNS``) after the keyset ``after``.

    Ordered by ``(created_at, id)``, descending when ``newest_first``. The keyset condition is
    written out (row-value comparison is not portable) and matches the index order, so the
    page is read straight off the index from the cursor on, however deep it is. A filter on
    waiting or failed rows starts from those instead (``_driven_page``).
    """
    t = workflows_table
    cols = [t.c[name] for name in WORKFLOW_COLUMNS]
    driver = _driver(where)
    if driver is not None:
        ids, rest = driver
        return _driven_page(session, ids, rest, cols, newest_first, limit, after)
    stmt = select(*cols).where(*conditions(where), *_keyset(t, newest_first, after))
    order = (t.c.created_at.desc(), t.c.id.desc()) if newest_first else (t.c.created_at, t.c.id)
    return session.execute(stmt.order_by(*order).limit(limit)).all()


def _keyset(t: Any, newest_first: bool, after: tuple[datetime, int] | None) -> list[Any]:
    """``(created_at, id)`` past the cursor ``after``.

    "created_at <= at AND (created_at < at OR id < last)", not the bare OR: the first term is
    what the planner can start the index scan at. With the OR alone it read the index from
    the newest row and filtered up to the cursor (39 ms at 500,000 rows deep, against 0.05).
    """
    if after is None:
        return []
    at, last_id = after
    if newest_first:
        return [t.c.created_at <= at, or_(t.c.created_at < at, t.c.id < last_id)]
    return [t.c.created_at >= at, or_(t.c.created_at > at, t.c.id > last_id)]


def _driven_keys(ids: Any, rest: Selection, keyset: list[Any]) -> Any:
    """``(id, created_at)`` of each candidate workflow, ``created_at`` NULL if it does not match.

    One primary-key probe per candidate, forced: the created_at is a scalar sub-query, which
    no planner turns into a join. Written as a join (or the IN of ``conditions``), PostgreSQL
    walked the creation index testing each workflow against the waiting rows, 51,000 rows
    for a page of 50 at 1M workflows (77 ms), or hashed them against a scan of every
    workflow; the walk grows with the history, the probes follow the waiting rows only.
    MATERIALIZED (PostgreSQL, SQLite) evaluates each probe once, not once per reference. The
    candidates are not made DISTINCT here: SQLite then read them off the (workflow_id, state)
    index, in id order, instead of the partial one; the caller dedupes the keys.
    """
    t = workflows_table
    candidates = ids.subquery("candidates")
    created = (
        select(t.c.created_at)
        .where(t.c.id == candidates.c.workflow_id, *conditions(rest), *keyset)
        .scalar_subquery()
    )
    keys = select(candidates.c.workflow_id.label("id"), created.label("created_at"))
    return _materialized(keys.cte("keys"))


def _materialized(cte: Any) -> Any:
    """``WITH … AS MATERIALIZED`` where the database has it (not MariaDB): computed once."""
    return cte.prefix_with("MATERIALIZED", dialect="postgresql").prefix_with(
        "MATERIALIZED", dialect="sqlite"
    )


def _driven_page(
    session: Session,
    ids: Any,
    rest: Selection,
    cols: list[Any],
    newest_first: bool,
    limit: int,
    after: tuple[datetime, int] | None,
) -> Sequence[Any]:
    """The page of ``workflow_page`` among the candidates ``ids``: sorted, then joined."""
    t = workflows_table
    keys = _driven_keys(ids, rest, _keyset(t, newest_first, after))
    by = (
        (keys.c.created_at.desc(), keys.c.id.desc())
        if newest_first
        else (keys.c.created_at, keys.c.id)
    )
    top = (
        select(keys.c.id, keys.c.created_at)
        .distinct()  # a workflow with several failed rows is a candidate once per row
        .where(keys.c.created_at.is_not(None))
        .order_by(*by)
        .limit(limit)
        .subquery("top")
    )
    order = (
        (top.c.created_at.desc(), top.c.id.desc()) if newest_first else (top.c.created_at, top.c.id)
    )
    stmt = select(*cols).select_from(top).join(t, t.c.id == top.c.id).order_by(*order)
    return session.execute(stmt).all()


def capped_count(session: Session, where: Selection, cap: int) -> int:
    """How many workflows match, counting no further than ``cap + 1``."""
    t = workflows_table
    driver = _driver(where)
    if driver is not None and not conditions(driver[1]):
        # Nothing else to test: every candidate is a workflow (the foreign key), no probes.
        # Materialized first: asked for DISTINCT workflow ids, SQLite reads them in order off
        # the whole (workflow_id, state) index instead of the partial one.
        candidates = _materialized(driver[0].cte("candidates"))
        matching = select(candidates.c.workflow_id).distinct()
    elif driver is not None:
        keys = _driven_keys(*driver, [])
        matching = select(keys.c.id).distinct().where(keys.c.created_at.is_not(None))
    else:
        matching = select(t.c.id).where(*conditions(where))
    limited = matching.limit(cap + 1).subquery()
    return int(session.execute(select(func.count()).select_from(limited)).scalar_one())


def waits_of(session: Session, workflow_ids: Sequence[int]) -> dict[int, tuple[Any, Any, Any]]:
    """``{workflow id: (awaiting_signal, wait_deadline, waiting_since)}`` of their waiting
    executions."""
    if not workflow_ids:
        return {}
    stmt = select(
        StepExecution.workflow_id,
        StepExecution.awaiting_signal,
        StepExecution.wait_deadline,
        StepExecution.waiting_since,
    ).where(
        StepExecution.workflow_id.in_(workflow_ids),
        in_state(StepExecution.state, ExecutionState.WAITING),
    )
    return {row[0]: (row[1], row[2], row[3]) for row in session.execute(stmt)}


def last_errors_of(session: Session, workflow_ids: Sequence[int]) -> dict[int, str | None]:
    """``{workflow id: error_class_name}`` of each one's newest failed execution."""
    if not workflow_ids:
        return {}
    stmt = (
        select(StepExecution.workflow_id, StepExecution.error_class_name)
        .where(StepExecution.workflow_id.in_(workflow_ids), _failed())
        .order_by(StepExecution.created_at, StepExecution.id)
    )
    return {row[0]: row[1] for row in session.execute(stmt)}  # the newest wins


# -- one workflow's timeline -----------------------------------------------------------------


def workflow_row(session: Session, workflow_id: int) -> Any:
    t = workflows_table
    columns = (
        *(t.c[name] for name in WORKFLOW_COLUMNS),
        t.c.metadata,
        t.c.trace_context,
        t.c.input,
    )
    return session.execute(select(*columns).where(t.c.id == workflow_id)).first()


def timeline_executions(session: Session, workflow_id: int, limit: int) -> Sequence[Any]:
    """The newest ``limit`` executions' rows (plain rows, not instances), newest first."""
    return _newest_of_workflow(session, StepExecution.__table__, "created_at", workflow_id, limit)


def timeline_signals(session: Session, workflow_id: int, limit: int) -> Sequence[Any]:
    return _newest_of_workflow(session, Signal.__table__, "created_at", workflow_id, limit)


def timeline_actions(session: Session, workflow_id: int, limit: int) -> Sequence[Any]:
    return _newest_of_workflow(session, OperatorAction.__table__, "at", workflow_id, limit)


def _newest_of_workflow(
    session: Session, table: Any, at: str, workflow_id: int, limit: int
) -> Sequence[Any]:
    """One workflow's newest ``limit`` rows of ``table``, by ``at`` then id."""
    stmt = (
        select(table)
        .where(table.c.workflow_id == workflow_id)
        .order_by(table.c[at].desc(), table.c.id.desc())
        .limit(limit)
    )
    return session.execute(stmt).all()


# -- acting ----------------------------------------------------------------------------------


def make_due(session: Session, execution: StepExecution, now: datetime) -> bool:
    """Bring a scheduled execution's due time forward to ``now`` (workflow lock held).

    Only while it is still scheduled: a worker may have claimed it since it was read.
    """
    # Imported here: the ORM bypass is the engine's (~4 ms), and the other admin queries
    # read — a page of workflows needs none of it (issue 42).
    from geneva_drive.storage.queries.bypass import write_through

    return write_through(
        session,
        execution,
        {"scheduled_for": now, "updated_at": now},
        expect={"state": ExecutionState.SCHEDULED},
    )


def record_action(session: Session, values: dict[str, Any]) -> None:
    """Append one operator action (flushed with the session, in the caller's transaction)."""
    session.add(OperatorAction(**values))
    session.flush()


def hero_workflows(
    session: Session, model: Any, hero_type: str, hero_id: str, *, ongoing_only: bool
) -> Sequence[Any]:
    """``model``'s workflows (ORM instances) for one hero, oldest first: the hero index."""
    stmt = select(model).where(model.hero_type == hero_type, model.hero_id == hero_id)
    if ongoing_only:
        stmt = stmt.where(model.state.notin_((WorkflowState.FINISHED, WorkflowState.CANCELED)))
    return session.execute(stmt.order_by(model.created_at, model.id)).scalars().all()


# -- stats -----------------------------------------------------------------------------------


def overdue_by_queue(session: Session, now: datetime) -> Sequence[Any]:
    """(queue, count, oldest due time) of scheduled rows past due, paused workflows aside.

    A range of the partial "due" index (scheduled rows only); a paused workflow's scheduled
    row waits for resume() on purpose, so it is no backlog. That is a primary-key probe per
    row (a correlated NOT EXISTS), never a join the planner could turn into a scan of every
    workflow when its generic plan overestimates the overdue rows.
    """
    wf = workflows_table
    paused = exists().where(wf.c.id == StepExecution.workflow_id, _workflow_in(wf, _PAUSED))
    stmt = (
        select(StepExecution.queue, func.count(), func.min(StepExecution.scheduled_for))
        .where(
            in_state(StepExecution.state, ExecutionState.SCHEDULED),
            StepExecution.scheduled_for < now,
            ~paused,
        )
        .group_by(StepExecution.queue)
        .order_by(StepExecution.queue)
    )
    return session.execute(stmt).all()


_PAUSED = (WorkflowState.PAUSED,)
_ONGOING = (WorkflowState.READY, WorkflowState.PERFORMING, WorkflowState.PAUSED)
_ENDED = (WorkflowState.FINISHED, WorkflowState.CANCELED)


def _workflow_in(wf: Any, states: tuple[WorkflowState, ...]) -> Any:
    """``state IN ('ready', …)`` with the states as literals, as ``in_state`` does for
    executions: a generic plan then still knows how few rows they are (a parameter looks
    like a third of the table, and the ongoing counts became a scan of every workflow)."""
    literals = [literal_column(f"'{WorkflowState(s).value}'", String) for s in states]
    return wf.c.state == literals[0] if len(literals) == 1 else wf.c.state.in_(literals)


def workflow_counts(session: Session, ended_since: datetime) -> Sequence[Any]:
    """(type, state, count) of every ongoing workflow, and of those ended since ``ended_since``.

    Both halves are ranges of ``(state, transitioned_at)``: the ongoing states a prefix, the
    ended ones bounded by time; the cost follows the work in flight and the last hour.
    """
    wf = workflows_table
    columns = (wf.c.type, wf.c.state, func.count())
    # Grouped by (state, type), not (type, state): grouped by type first, SQLite walks the
    # whole type index to save the GROUP BY a sort, and the cost follows the history.
    ongoing = select(*columns).where(_workflow_in(wf, _ONGOING)).group_by(wf.c.state, wf.c.type)
    ended = (
        select(*columns)
        .where(_workflow_in(wf, _ENDED), wf.c.transitioned_at >= ended_since)
        .group_by(wf.c.state, wf.c.type)
    )
    return session.execute(ongoing.union_all(ended)).all()


def waiting_totals(session: Session, now: datetime) -> tuple[int, int]:
    """(waiting rows, those past their deadline): the partial index over waiting rows."""
    overdue = case((StepExecution.wait_deadline < now, 1), else_=0)
    stmt = select(func.count(), func.coalesce(func.sum(overdue), 0)).where(
        in_state(StepExecution.state, ExecutionState.WAITING)
    )
    waiting, past = session.execute(stmt).one()
    return int(waiting), int(past)


def expired_lease_count(session: Session, now: datetime) -> int:
    """In-progress rows whose lease ran out: the partial lease index."""
    stmt = select(func.count()).where(
        in_state(StepExecution.state, ExecutionState.IN_PROGRESS),
        StepExecution.lease_expires_at < now,
    )
    return int(session.execute(stmt).scalar_one())


def recent_outcomes(session: Session, since: datetime, edges: Sequence[datetime]) -> Sequence[Any]:
    """(type, step, state, outcome, bucket, count) of the executions ended since ``since``.

    ``bucket`` is the number of ``edges`` (ascending times after ``since``) at or before the
    row's ``finished_at``: 0 before the first edge, ``len(edges)`` after the last (rows stamped
    after "now", by a clock a little ahead, land there too). One range of the ``finished_at``
    index for the whole hour, bucketed by a CASE: the cost follows the throughput of the last
    hour, not the history, and the sparkline costs no second pass. Each row's workflow type
    is a primary-key probe (a correlated sub-query, as in ``housekeeping.waiting_counts``):
    joined instead, a generic plan that overestimates the hour's rows hashed every workflow
    of the table.
    """
    wf = workflows_table
    type_ = select(wf.c.type).where(wf.c.id == StepExecution.workflow_id).scalar_subquery()
    # Literal bucket numbers: bound ones would leave PostgreSQL guessing the CASE's type.
    bucket = case(
        *(
            (StepExecution.finished_at < edge, literal_column(str(n)))
            for n, edge in enumerate(edges)
        ),
        else_=literal_column(str(len(edges))),
    )
    ended = (
        select(
            type_.label("workflow_type"),
            StepExecution.step_name,
            StepExecution.state,
            StepExecution.outcome,
            bucket.label("bucket"),
        )
        .where(StepExecution.finished_at >= since)
        .subquery()
    )
    columns = (
        ended.c.workflow_type,
        ended.c.step_name,
        ended.c.state,
        ended.c.outcome,
        ended.c.bucket,
    )
    return session.execute(select(*columns, func.count()).group_by(*columns)).all()

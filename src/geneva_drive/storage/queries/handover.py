"""A workflow's last step completed, and the next workflow's step claimed and started, in one
PostgreSQL statement.

A worker with a backlog finishes a workflow and at once claims the next due execution in the
same transaction (``chaining.claim_next``): a BEGIN, the completion, the claim, the start and
a COMMIT, five round trips. When the claimed step is one that phase 1 is certain to start —
its class needs no hero, and has no ``cancel_if``; the step is defined, not removed, has no
``skip_if`` and no signal gate; the row is not a signal timeout's timer — nothing of the
application's code must run between the claim and the start, so both can be written by the
database itself, in the completion's statement. Which steps those are is worked out from the
loaded classes and bound as two arrays (``direct_types``/``direct_steps``, pairwise).

When the claimed row is not such a step, the statement locks it but starts nothing. Run as a
transaction of its own, the lock goes with it and the worker's next ordinary claim finds the
same row first, so the order of claims is kept; otherwise the transaction goes on and the
executor claims the row again there, where its phase 1 runs as usual.

In a thread whose next claim is a key's turn (``engine.fair_turns``), the statement takes
that turn (``NextClaim.keyed``): it locks the key served least recently with a due row
(``FOR UPDATE SKIP LOCKED``, ``queries.fairness``), claims from that key's first due rows
only, and stamps the key served if it started the claimed row — so a keyed backlog is handed
over in one statement too. A row it claimed but did not start is claimed again by a key's
turn, which stamps it then; a miss (every key with a due row locked by another claim, or the
key's first rows unclaimable) leaves the claim to the thread's next key's turn, which tries
every window, the next keys and the shared turn.

After a step that holds a concurrency slot (``NextClaim.held_key``), the claimed row may also
be the first step of a class whose only obstacle is its concurrency limit (``Limited``: no
rate limit, nothing else to check): the statement then passes the slot on to it when its key
— stored with the execution, or the class's constant — is the same and nobody waits for one
(:func:`_passed_slot`), stores a constant key with it, and starts it. Such a statement is
never run alone: unless it passed the slot on, the caller frees it after, in the same
transaction. After a step that holds none, no limit table is named.

Its claim comes in two widths. Narrow (``NextClaim.wide`` false), it tries only the first
due rows (the first of the claim's windows, 16), not the wider windows behind them that the
worker's ordinary claim falls back on: every window is a dozen plan nodes that PostgreSQL
initialises and tears down at every run of the statement, used or not, and on a backlog the
two fallback windows were 13 % of the server's instructions per step, the widest alone 8 %
(``benchmarks/server_instructions.py``). When none of those 16 rows can be claimed (paused
workflows at the head of the queue, classes this worker has not loaded, rows other workers
are claiming at that moment), it claims nothing, the chain ends, and the worker's next
claim, an ordinary one, goes past them; when that one finds a row, the executor makes its
next handovers wide, with every window, as the ordinary claim is, for a while
(``chaining.WIDE_HANDOVERS``) before it tries a narrow one again.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Integer,
    String,
    and_,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal_column,
    or_,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from geneva_drive.core.states import WorkflowState
from geneva_drive.storage.models import (
    TIMEOUT_FOR,
    FairKey,
    LimitSlot,
    LimitWaiter,
    StepExecution,
    WorkflowColumns,
)
from geneva_drive.storage.queries._sql import as_array, mapped_class, text_array, workflow_model
from geneva_drive.storage.queries.bypass import (
    as_loaded,
    connection_of,
    driver_in_transaction,
    execute_alone,
    execute_direct,
    mark_written,
)
from geneva_drive.storage.queries.claims import (
    CLAIM_WINDOWS,
    EVERY_WINDOW,
    ClaimScope,
    _claim_stmt,
    first_in_order,
    loaded_classes_in_arrays,
)
from geneva_drive.storage.queries.executions import completion_ctes, completion_params
from geneva_drive.storage.queries.fairness import least_recently_served_key, shared_key
from geneva_drive.storage.queries.limits import CONCURRENCY, KEYS, PARKED


@dataclass(frozen=True)
class NextClaim:
    """What to claim after the completion, and how to start it: the worker's ``scope``; the
    clock's ``now``; the execution's columns as ``writer.start`` writes them (``started``);
    the (workflow type, step name) pairs it may start (``direct``, two tuples); whether
    the statement may run as a transaction of its own (``alone``); and whether its claim
    tries every window of due rows or only the first (``wide``, see the module docstring)."""

    scope: ClaimScope
    now: datetime
    started: dict[str, Any]
    direct: tuple[tuple[str, ...], tuple[str, ...]]
    alone: bool
    wide: bool = False
    limited: Limited | None = None
    held_key: str | None = None
    # A key's turn (``engine.fair_turns``): the due rows of the key served least recently,
    # which the statement stamps served if it starts one (see the module's docstring).
    keyed: bool = False
    # Of the caller's key turns, how many found every key locked (``fair_turns``): where a
    # shared turn starts in the keys' order.
    shared_turns: int = 0


@dataclass(frozen=True)
class Limited:
    """The steps it may start holding a concurrency slot (see the module's docstring), as
    four text arrays, pairwise: workflow types, step names, each step's limit ``n``, and its
    key when it is a constant (else None: the key stored with the execution is used)."""

    types: tuple[str, ...]
    steps: tuple[str, ...]
    ns: tuple[int, ...]
    keys: tuple[str | None, ...]

    def params(self) -> dict[str, str]:
        return {
            "limited_types": text_array(self.types),
            "limited_steps": text_array(self.steps),
            "limited_ns": "{" + ",".join(str(n) for n in self.ns) + "}",
            "limited_keys": _text_array_with_nulls(self.keys),
        }


def _text_array_with_nulls(values: tuple[str | None, ...]) -> str:
    """:func:`text_array` where None is SQL's NULL (unquoted)."""
    return "{" + ",".join("NULL" if v is None else text_array((v,))[1:-1] for v in values) + "}"


@dataclass(frozen=True)
class Handover:
    """What :func:`finish_and_start_next` did: the completion's two guarded writes; whether
    it claimed a row (``claimed``) and the workflow and execution it started (``started``;
    None: nothing was due, or not a step it may start); whether the statement ran as a
    transaction of its own (``committed``: then no lock it took is held any more)."""

    wrote_workflow: bool
    wrote_execution: bool
    claimed: bool
    started: tuple[WorkflowColumns, StepExecution] | None
    committed: bool
    # The concurrency key whose slot the started step holds (taken, or passed on from the
    # completed step: ``passed``), if it holds one.
    holds: str | None = None
    passed: bool = False
    # A key's turn that served a key without its lock or stamp (every key locked).
    shared: bool = False


def finish_and_start_next(
    session: Session,
    workflow: WorkflowColumns,
    navigation: dict[str, Any],
    as_started: dict[str, Any],
    execution: StepExecution,
    done: dict[str, Any],
    claim: NextClaim,
) -> Handover:
    """The completion of ``execution`` (as :func:`executions.complete_in_one_statement`
    writes it), the claim of the next due execution in ``claim.scope`` (as
    :func:`claims.claim_due_execution` makes it, only if the completion was written), and its
    start if its (workflow type, step name) is one of ``claim.direct``'s pairs and it is not
    a timer.

    Every write depends on the one before it, and the claimed rows are locked ``FOR UPDATE
    … SKIP LOCKED`` by the statement itself, so it writes all of it, only the completion, or
    nothing: with ``claim.alone`` it may run as a transaction of its own (``execute_alone``).
    Nothing pending on either instance (the caller checks).
    """
    base = mapped_class(workflow).__mapper__.base_mapper
    scope = claim.scope
    stmt = _statement(
        base,
        tuple(navigation),
        tuple(as_started),
        tuple(done),
        tuple(claim.started),
        scope.loaded_only,
        bool(scope.queues),
        claim.wide,
        claim.limited is not None and claim.held_key is not None,
        claim.keyed,
    )
    params: dict[str, Any] = {
        **completion_params(workflow, navigation, as_started, execution, done),
        **{f"s_v_{key}": value for key, value in claim.started.items()},
        "now": claim.now,
        "direct_types": text_array(claim.direct[0]),
        "direct_steps": text_array(claim.direct[1]),
        "performing": WorkflowState.PERFORMING,
    }
    if scope.loaded_only:
        params.update(scope.array_params)
    if scope.queues:
        params["queues"] = list(scope.queues)
    limited = claim.limited is not None and claim.held_key is not None
    if limited:
        assert claim.limited is not None  # for mypy
        params.update(claim.limited.params())
        params["held_key"] = claim.held_key
    if claim.keyed:
        params["shared"] = claim.shared_turns
    connection = connection_of(session)
    row = (execute_alone if claim.alone else execute_direct)(connection, stmt, params)
    committed = not driver_in_transaction(connection)
    wrote_workflow, wrote_execution, claimed = bool(row[0]), bool(row[1]), row[2] is not None
    # The key of the slot passed on, in the statement that may pass one (only there: the
    # others are the statements they were).
    holds = row[3] if limited else None
    assert not (limited and claim.keyed)  # a key's turn passes no slot on (chaining)
    if wrote_workflow:
        mark_written(session, workflow, navigation)
    if wrote_execution:
        mark_written(session, execution, done)
    execution_values, workflow_values = _split(row, 4 if limited or claim.keyed else 3)
    if execution_values["id"] is None:
        return Handover(wrote_workflow, wrote_execution, claimed, None, committed)
    if claim.keyed:  # started: its key stamped, unless the turn was shared
        return Handover(
            wrote_workflow,
            wrote_execution,
            claimed,
            (
                _loaded(session, base.polymorphic_map[workflow_values["type"]], workflow_values),
                _loaded(session, StepExecution.__mapper__, execution_values),
            ),
            committed,
            shared=not row[3],
        )
    next_execution = _loaded(session, StepExecution.__mapper__, execution_values)
    # The row's own class: only loaded classes have steps among the direct pairs.
    next_workflow = _loaded(session, base.polymorphic_map[workflow_values["type"]], workflow_values)
    return Handover(
        wrote_workflow,
        wrote_execution,
        claimed,
        (next_workflow, next_execution),
        committed,
        holds,
        passed=holds is not None,
    )


def _split(row: Any, start: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The started execution's and workflow's values by attribute name, from their columns'
    places in the row (from ``start``: after the two counts, the claimed id and, where a slot
    may pass on, its key)."""
    execution_keys, workflow_keys = _attribute_keys()
    values = row[start:]
    return (
        dict(zip(execution_keys, values[: len(execution_keys)], strict=True)),
        dict(zip(workflow_keys, values[len(execution_keys) :], strict=True)),
    )


@functools.cache
def _attribute_keys() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Per column of each table, in the table's order (RETURNING's), its attribute's name."""

    def keys(mapper: Any) -> tuple[str, ...]:
        by_column = {attr.columns[0].key: attr.key for attr in mapper.column_attrs}
        return tuple(by_column[column.key] for column in mapper.local_table.c)

    return keys(StepExecution.__mapper__), keys(workflow_model().__mapper__)


def _loaded(session: Session, mapper: Any, values: dict[str, Any]) -> Any:
    """An instance holding the row as the statement returned it: a new one, or the one the
    session already holds (a body may have loaded another workflow's rows), refreshed."""
    key = mapper.identity_key_from_primary_key((values["id"],))
    held = session.identity_map.get(key)
    if held is None:
        return as_loaded(session, mapper, values, from_select=True)
    for name, value in values.items():
        set_committed_value(held, name, value)
    return held


@functools.lru_cache(maxsize=32)
def _statement(
    workflow_mapper: Any,
    navigation: tuple[str, ...],
    as_started: tuple[str, ...],
    done: tuple[str, ...],
    started: tuple[str, ...],
    loaded_only: bool,
    queued: bool,
    wide: bool,
    limited: bool = False,
    keyed: bool = False,
) -> Any:
    """Kept short: the claim selects only what the start needs, the classes are bound as two
    arrays, and the rows come back by position, unlabelled. (Still over the 4,096 characters
    psycopg caches the parsing of: ``bypass`` numbers its placeholders once instead.)"""
    w, e = completion_ctes(workflow_mapper, navigation, as_started, done)
    executions: Any = StepExecution.__table__
    workflows: Any = workflow_mapper.local_table
    pairs = select(func.unnest(as_array("direct_types")), func.unnest(as_array("direct_steps")))
    startable = and_(
        tuple_(workflows.c.type, executions.c.step_name).in_(pairs),
        executions.c.metadata.op("->>", return_type=String)(literal_column(f"'{TIMEOUT_FOR}'")).is_(
            None
        ),
    )

    def claim_of(row: Any) -> Any:
        # The worker's own claim, on the condition that the completion was written.
        claim = _claim_stmt(by_id=False, queued=queued, candidates_first=False, row=row)
        claim = claim.where(select(e.c.id).exists())
        if loaded_only:
            claim = claim.where(loaded_classes_in_arrays(workflows.c))
        columns = [
            executions.c.id,
            executions.c.workflow_id,
            executions.c.step_name,
            startable.label("go"),
        ]
        if limited:
            stored = executions.c.metadata.op("->", return_type=JSONB)(literal_column(f"'{KEYS}'"))
            columns += [
                workflows.c.type,
                stored.op("->>", return_type=String)(literal_column(f"'{CONCURRENCY}'")).label(
                    "stored_key"
                ),
                executions.c.metadata.op("->>", return_type=String)(
                    literal_column(f"'{PARKED}'")
                ).label("parked"),
                executions.c.metadata.op("->>", return_type=String)(
                    literal_column(f"'{TIMEOUT_FOR}'")
                ).label("timer"),
            ]
        return claim.with_only_columns(*columns)

    # The due rows in claim order, each tried by primary key (claims.first_in_order): every
    # window, or only the first (see the module's docstring).
    windows = EVERY_WINDOW if wide else CLAIM_WINDOWS[:1]
    key = None
    if keyed:
        # A key's turn: the key served least recently with a due row, locked (k), and the
        # first due rows of that key, as queries.fairness claims them.
        k = least_recently_served_key(queued).cte("k")
        # None locked (other claims hold every key with a due row): a shared turn's key.
        served = select(
            func.coalesce(select(k.c.key).scalar_subquery(), shared_key(queued)).label("key")
        ).cte("kk")
        key = select(served.c.key).scalar_subquery()
    c = first_in_order(
        claim_of, queued=queued, due=True, windows=windows, keyed=keyed, key=key
    ).cte("c")
    # The claimed row's values as scalars, not a join with c: each start then finds its row
    # by primary key whatever the planner believes of the tables. (Joined, on tables planned
    # while empty, it hash-joined c with a read of every execution and every workflow.)
    claimed_id, claimed_workflow, claimed_step, direct_go = (
        select(column).scalar_subquery()
        for column in (c.c.id, c.c.workflow_id, c.c.step_name, c.c.go)
    )
    go: Any = direct_go
    passed_key: list[Any] = []
    x = executions.alias("x")
    execution_columns = StepExecution.__mapper__.column_attrs
    values: dict[Any, Any] = {
        x.c[execution_columns[key].columns[0].key]: bindparam(f"s_v_{key}") for key in started
    }
    if limited:
        slot_ctes = _passed_slot(c, claimed_id, claimed_workflow)
        taken = select(slot_ctes.c.key).scalar_subquery()
        go = or_(go, select(slot_ctes.c.key).exists())
        passed_key.append(taken.label("h"))
        # A first step's key may not be stored yet (a constant one, from the class): stored
        # now, as phase 1 stores it, for phase 3 and the lease recovery to find the slot.
        stored = case(
            (func.jsonb_typeof(x.c.metadata) == "object", x.c.metadata),
            else_=cast(literal_column("'{}'"), JSONB),
        )
        values[x.c.metadata] = case(
            (
                and_(taken.is_not(None), select(c.c.stored_key).scalar_subquery().is_(None)),
                stored.op("||")(
                    func.jsonb_build_object(KEYS, func.jsonb_build_object(CONCURRENCY, taken))
                ),
            ),
            else_=x.c.metadata,
        )
    # Aliased, for a shorter text: each returns every column of its row.
    y = workflows.alias("y")
    s = update(x).where(x.c.id == claimed_id, go).values(values).returning(*x.c).cte("s")
    # What writer.start writes to the workflow, in SQL: performing, at the claimed step.
    v = (
        update(y)
        .where(y.c.id == claimed_workflow, go)
        .values(
            state=bindparam("performing", type_=workflows.c.state.type),
            current_step_name=claimed_step,
            started_at=func.coalesce(y.c.started_at, bindparam("now")),
            updated_at=bindparam("now"),
        )
        .returning(*y.c)
        .cte("v")
    )
    stamped: list[Any] = []
    if keyed:
        # The key stamped served, only if its row was started: a row claimed but not
        # started is claimed again by a key's turn (chaining), which stamps it then.
        keys: Any = FairKey.__table__
        t = (
            update(keys)
            .where(keys.c.key == select(k.c.key).scalar_subquery(), select(s.c.id).exists())
            .values(served_at=bindparam("now"))
            .returning(keys.c.key)
            .cte("kt")
        )
        stamped.append(select(func.count()).select_from(t).scalar_subquery().label("f"))
    counts = select(
        select(func.count()).select_from(w).scalar_subquery().label("w"),
        select(func.count()).select_from(e).scalar_subquery().label("e"),
        select(c.c.id).scalar_subquery().label("c"),
        *passed_key,
        *stamped,
    ).subquery("n")
    return select(*counts.c, *s.c, *v.c).select_from(
        counts.outerjoin(s, true()).outerjoin(v, true())
    )


def _passed_slot(c: Any, claimed_id: Any, claimed_workflow: Any) -> Any:
    """The completed step's slot (of ``held_key``), passed on to the claimed row when its
    step is one of the limited pairs (``Limited``) with the same key, and nobody waits for a
    slot of the key: a CTE of at most one row (its ``key``). Otherwise the claimed row
    is not started, and the caller frees the completed step's slot after the statement,
    looking for a waiter with a snapshot of its own (``engine.limits``).

    A waiter that parks while this statement passes the slot on is not seen here (it committed
    after the statement's snapshot), and waits for the next holder's end, whose statement
    sees it: late by one holder, never left behind. No free slot is taken here: the
    statement would then wait to free the completed step's slot after it took one, against
    the lock order (a taker never waits once it took) — and after a step that holds none, a
    statement naming no limit table is what costs workflows without limits nothing.
    """
    limits = (
        func.unnest(
            as_array("limited_types"),
            as_array("limited_steps"),
            as_array("limited_ns"),
            as_array("limited_keys"),
        )
        .table_valued("t", "s", "n", "k")
        .render_derived()
    )
    key = func.coalesce(c.c.stored_key, limits.c.k)
    m = (
        select(cast(limits.c.n, Integer).label("n"), key.label("k"))
        .select_from(c.join(limits, and_(limits.c.t == c.c.type, limits.c.s == c.c.step_name)))
        .where(c.c.parked.is_(None), c.c.timer.is_(None), key.is_not(None))
        .cte("m")
    )
    slots: Any = LimitSlot.__table__
    waiters: Any = LimitWaiter.__table__
    return (
        update(slots)
        .where(
            slots.c.execution_id == bindparam("x_pk"),
            slots.c.key == bindparam("held_key"),
            slots.c.key == select(m.c.k).scalar_subquery(),
            slots.c.slot < select(m.c.n).scalar_subquery(),
            ~exists().where(waiters.c.key == bindparam("held_key")),
        )
        .values(execution_id=claimed_id, workflow_id=claimed_workflow, taken_at=bindparam("now"))
        .returning(slots.c.key)
        .cte("p")
    )

"""Starting workflows — ``create()``, ``create_many()`` — and the wake-up that rides the commit.

A start is paid for by a web request, so it costs its inserts and nothing else: the workflow
row is inserted already pointing at its first step (``next_step_name``), the first execution
beside it, with no savepoint, no lock and no read. On PostgreSQL ``create()`` is one statement
(see ``queries.starting``). What a new workflow's rows hold is decided by :func:`plan_start`,
with no database; the strategies of ``queries.starting`` write them.

**The wake-up.** A step due now needs idle workers woken once the row is visible. On
PostgreSQL with the database backend, the caller's transaction issues ``NOTIFY`` itself: it
is delivered at that commit, and dropped with a rollback — so no second connection, commit or
round trip after it, and no window in which a crash loses it. Once per queue per transaction:
a transaction starting 10,000 workflows sends one. (The price: PostgreSQL serialises the
commits of notifying transactions on one lock. A start is one such commit; the worker's own
transactions, which chain their next step on the same thread, never notify.)

Everywhere else the wake-up is sent after commit as before (``backends.base``): other
dialects, other backends, and a worker's own step threads, where the thread may take the
row it scheduled itself and nobody needs waking.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import InstanceState, Session, configure_mappers, object_session

from geneva_drive.core import text
from geneva_drive.core.errors import (
    InputTooLargeError,
    StepConfigurationError,
    WorkflowAlreadyOngoing,
)
from geneva_drive.core.ports import EnqueuedStep
from geneva_drive.core.settings import settings_of
from geneva_drive.core.states import ExecutionState, WorkflowState
from geneva_drive.definition.fairness import fair_key, is_fair
from geneva_drive.definition.job_options import checked_step_job_options
from geneva_drive.definition.limits import limits_of
from geneva_drive.definition.ports import StartResult
from geneva_drive.definition.workflow import Workflow, check_job_options
from geneva_drive.engine import limits, tracing, writer
from geneva_drive.engine.outcomes import moved_columns
from geneva_drive.engine.wakeups import enqueue_after_commit, note_woken, wake_for_start
from geneva_drive.storage import queries, serialization
from geneva_drive.storage.heroes import checked_hero_type, hero_type_of
from geneva_drive.storage.limits import MAX_HERO_ID, MAX_HERO_TYPE
from geneva_drive.storage.queries.bypass import as_inserted, connection_of, remember_workflow_lock
from geneva_drive.storage.queries.fairness import register_keys
from geneva_drive.storage.queries.starting import (
    Hero,
    Started,
    execution_row,
    starter_for,
    workflow_row,
)
from geneva_drive.storage.queries.starting import ongoing_heroes as _ongoing_heroes
from geneva_drive.storage.values import stored_value

if TYPE_CHECKING:
    from geneva_drive.definition.steps import StepDefinition

W = TypeVar("W", bound="Workflow")
log = logging.getLogger("geneva_drive")


# -- what a new workflow's rows hold (pure) -------------------------------------------------


@dataclass(frozen=True)
class Start:
    """The rows of one new workflow of a class, before it has an id or a hero."""

    workflow: dict[str, Any]  # every column but id, hero_type and hero_id
    first: dict[str, Any] | None  # its first execution's columns but id and workflow_id
    options: dict[str, Any]  # the first step's merged job options (its wake-up carries them)
    first_step: StepDefinition | None

    @property
    def due(self) -> datetime | None:
        return None if self.first is None else self.first["scheduled_for"]

    @property
    def queue(self) -> str:
        return str(self.options.get("queue") or "default")


def plan_start(
    cls: type[Workflow],
    now: datetime,
    *,
    allow_multiple: bool,
    step_job_options: dict[str, Any] | None,
) -> Start:
    """A new workflow of ``cls``: ``ready`` at its first step in positional order (the gem's
    H-2), that step scheduled after its ``wait``. A class without steps gets no execution
    (``create`` then finishes it through the writer)."""
    first = cls.steps.next_after(None)
    identity = cls.__mapper_args__["polymorphic_identity"]
    workflow = workflow_row(
        {
            "type": identity,
            **moved_columns(
                None, WorkflowState.READY, now, next_step=first.name if first else None
            ),
            "allow_multiple": allow_multiple,
            "metadata_json": _metadata(step_job_options),
            "created_at": now,
            "updated_at": now,
        }
    )
    del workflow["hero_type"], workflow["hero_id"]
    if first is None:
        return Start(workflow, None, {}, None)
    options = {**cls._job_options, **(step_job_options or {}), **(first.job_options or {})}
    wait: timedelta | None = first.delay(now)
    execution = execution_row(
        {
            "step_name": first.name,
            "state": ExecutionState.SCHEDULED,
            "scheduled_for": now + wait if wait else now,
            "queue": options.get("queue") or "default",
            "priority": options.get("priority") or 0,
            "created_at": now,
            "attempt": 1,  # a new workflow's first run of any step
        }
    )
    del execution["workflow_id"]
    return Start(workflow, execution, options, first)


@dataclass(frozen=True)
class StartKeys:
    """What a workflow's own code decides about its rows, worked out before they are
    written: its fairness key and its first step's limit keys (as that execution's
    metadata). Both None for a class without either — the usual case, no callable run."""

    fair: str | None = None
    limits: dict[str, Any] | None = None

    def applied(self, start: Start) -> Start:
        """``start`` with these keys in its rows (itself when there are none)."""
        if (self.fair is None and self.limits is None) or start.first is None:
            return start
        first = dict(start.first)
        if self.fair is not None:
            first["fair_key"] = self.fair
        if self.limits is not None:
            first["metadata_json"] = self.limits
        workflow = (
            start.workflow if self.fair is None else {**start.workflow, "fair_key": self.fair}
        )
        return replace(start, workflow=workflow, first=first)

    def group(self) -> tuple[str | None, str | None]:
        """Equal for workflows whose rows may share one bulk insert's values."""
        return self.fair, None if self.limits is None else _canonical(self.limits)


NO_KEYS = StartKeys()


def keys_before_start(
    cls: type[Workflow],
    start: Start,
    hero_object: Any,
    hero: Hero,
    stored_input: Any,
    *,
    item: str = "",
    known: dict[str, Any] | None = None,
) -> StartKeys:
    """:class:`StartKeys` of a workflow of ``cls`` about to start.

    The callables get a transient workflow (no id yet, never added to a session) holding the
    hero, the input, the metadata and the ``known`` columns (a schedule's tick, a child's
    parent) it will be inserted with — what create() can know — so an error (a
    ``StepConfigurationError`` naming the class, the step, the hero and ``item``, its place
    in a create_many() call) leaves nothing written. A key that reads what the application
    writes *after* create() cannot work: pass it as ``input=`` (or read it from the hero).
    """
    step_def = start.first_step
    limited = step_def is not None and limits_of(cls, step_def) is not None
    if not limited and not is_fair(cls):
        return NO_KEYS  # the usual case: two look-ups, nothing made
    workflow = cls()
    workflow.hero_type, workflow.hero_id = hero
    workflow.input_json = stored_input
    workflow.metadata_json = start.workflow.get("metadata_json")
    for column, value in (known or {}).items():
        setattr(workflow, column, value)
    if hero_object is not None:
        workflow.__dict__["_gd_hero"] = hero_object
    whose = _whose(hero[1], hero[0], item)
    fair = fair_key(cls, workflow, whose)
    workflow.fair_key = fair
    keys = limits.keys_at_start(workflow, step_def, whose) if step_def is not None else None
    return StartKeys(fair, keys)


def _whose(hero_id: str | None, hero_type: str | None = None, item: str = "") -> str:
    """How errors name a workflow not inserted yet: by its hero, and its place in a call."""
    who = "workflow without a hero" if hero_id is None else f"hero {hero_type} {hero_id!r}"
    return f"{who}, {item}" if item else who


def _metadata(step_job_options: dict[str, Any] | None) -> dict[str, Any] | None:
    if not step_job_options:
        return None
    return {"step_job_options": serialization.encode(step_job_options)}


# -- create() ---------------------------------------------------------------------------


def create(
    cls: type[W],
    session: Session,
    *,
    hero: Any,
    allow_multiple: bool,
    step_job_options: dict[str, Any] | None,
    scheduled_tick: datetime | None = None,
    parent: tuple[int, str] | None = None,
    find_child: Callable[[], W | None] | None = None,
    input: Any = None,
    input_of: str | None = None,
) -> W:
    """``Workflow.create``: everything checked first, then one INSERT per row (PostgreSQL:
    one statement), the wake-up queued with the caller's commit.

    ``scheduled_tick``: the schedule tick it is created for (``engine.schedules``), in its
    uniquely indexed column. ``parent``: (parent id, key) of a child
    (``children.start_child``). A child refused by the unique index over them was started by a
    concurrent run of the same step, which ``find_child`` returns (the database waited for it
    to commit). ``input_of``: who passes ``input``, as its errors name them (by default
    ``Cls.create(input=...)``).
    """
    _check_creatable(cls, session)
    encoded = _input(cls, session, input, input_of or f"{cls.__name__}.create(input=...)")
    hero_type, hero_id = hero_key(cls, session, hero)
    start, now = _planned(cls, session, allow_multiple, step_job_options)
    row = {**start.workflow, "hero_type": hero_type, "hero_id": hero_id, "input_json": encoded}
    known: dict[str, Any] = {}  # what else a key may read: the tick, the parent
    if scheduled_tick is not None:
        known["scheduled_tick"] = scheduled_tick
    if parent is not None:
        known["parent_id"], known["child_key"] = parent
    row.update(known)
    keys = keys_before_start(cls, start, hero, (hero_type, hero_id), encoded, known=known)
    if keys.fair is not None:  # stored on the workflow and its executions (queries.fairness)
        register_keys(session, [keys.fair])
        row["fair_key"] = keys.fair
    start = keys.applied(start)
    connection = connection_of(session)
    notify, notified = wake_for_start(session, start.queue, start.due)
    ids = starter_for(connection).insert_one(connection, row, start.first, notify)
    if ids is None:
        found = find_child() if find_child is not None else None
        if found is not None:
            return found
        raise _already_ongoing(cls, session, row)
    if notify is not None:
        note_woken(session, notify)
    workflow_id, execution_id = ids
    mapper = sa_inspect(cls)
    if not mapper.configured:  # a class defined since the last ORM use: set it up first
        configure_mappers()
    # The counters' server default, known without reading it back.
    fresh = {"id": workflow_id, "children_started": 0, "children_ended": 0, "children_failed": 0}
    workflow: W = as_inserted(session, mapper, {**row, **fresh})
    if hero is not None:
        workflow.__dict__["_gd_hero"] = hero
    # The new row is ours alone until commit: a later lock in this transaction (a signal()
    # right after create()) needs no round trip.
    remember_workflow_lock(session, workflow_id, workflow)
    if start.first is None:
        writer.begin(session, workflow, now)  # no steps: finished at once, by the writer
    else:
        assert execution_id is not None and start.first_step is not None
        step = EnqueuedStep(
            execution_id,
            workflow_id,
            start.first["step_name"],
            start.first["scheduled_for"],
            start.options,
            notified=notified,
        )
        enqueue_after_commit(session, step)
    if log.isEnabledFor(logging.INFO):
        workflow.logger.info("created with %d step(s)", len(cls.steps))
    return workflow


def _planned(
    cls: type[Workflow],
    session: Session,
    allow_multiple: bool,
    step_job_options: dict[str, Any] | None,
) -> tuple[Start, datetime]:
    """The rows of a start of ``cls`` now, its job options checked against the session's
    backend; and that now."""
    config = settings_of(session)
    options = (
        checked_step_job_options(cls, step_job_options, config.backend)
        if step_job_options
        else None
    )
    now = config.clock.now()
    start = plan_start(cls, now, allow_multiple=allow_multiple, step_job_options=options)
    traceparent = tracing.current_traceparent(config)
    if traceparent is not None:  # the trace the workflow's steps continue
        start = replace(start, workflow={**start.workflow, "trace_context": traceparent})
    return start, now


def _input(cls: type[Workflow], session: Session, value: Any, what: str) -> Any:
    """A workflow's input as stored (typed JSON within ``max_value_size``), checked before
    anything is written."""
    limit = settings_of(session).max_value_size
    return stored_value(value, limit=limit, what=what, too_large=InputTooLargeError)


def _inputs(
    cls: type[Workflow], session: Session, inputs: Sequence[Any] | None, count: int
) -> list[Any] | None:
    """``create_many(inputs=...)``: one stored input per workflow to start, in order."""
    if inputs is None:
        return None
    name = cls.__name__
    if isinstance(inputs, str | bytes | dict) or not isinstance(inputs, Sequence):
        raise TypeError(
            f"{name}.create_many(inputs=...): expected a list with one input per workflow, "
            f"got {type(inputs).__name__}; for one input shared by all, pass [value] * n"
        )
    if len(inputs) != count:
        raise ValueError(
            f"{name}.create_many(): got {len(inputs)} inputs for {count} workflows; pass one "
            "input per hero (or per hero-less workflow), in the same order"
        )
    return [
        _input(cls, session, value, f"{name}.create_many(inputs[{i}])")
        for i, value in enumerate(inputs)
    ]


def _check_creatable(cls: type[Workflow], session: Session) -> None:
    if cls is Workflow:
        raise StepConfigurationError(
            "Workflow.create(): create a subclass of Workflow that declares steps"
        )
    check_job_options(cls, settings_of(session).backend)


def _already_ongoing(cls: type[Workflow], session: Session, row: dict[str, Any]) -> Exception:
    # The unique index refused the row; name the holder when it can still be seen (it may
    # have finished since, or be another transaction's, not yet committed).
    existing = queries.find_ongoing_duplicate(
        session, row["type"], row["hero_type"], row["hero_id"]
    )
    return ongoing_error(cls, row["hero_type"], row["hero_id"], existing)


def ongoing_error(
    cls: type[Workflow], hero_type: str | None, hero_id: str | None, existing_id: int | None
) -> WorkflowAlreadyOngoing:
    which = f" (id={existing_id})" if existing_id is not None else ""
    return WorkflowAlreadyOngoing(
        f"{cls.__name__}: an ongoing workflow{which} already exists for hero "
        f"{hero_type} id={hero_id}; wait for it to finish, cancel it, or pass "
        "allow_multiple=True"
    )


# -- create_many() ----------------------------------------------------------------------


def create_many(
    cls: type[Workflow],
    session: Session,
    *,
    heroes: Iterable[Any] | None = None,
    count: int | None = None,
    allow_multiple: bool = False,
    step_job_options: dict[str, Any] | None = None,
    raise_on_conflict: bool = False,
    inputs: Sequence[Any] | None = None,
) -> StartResult:
    """Start one workflow per hero (or ``count`` hero-less ones) in the caller's transaction.

    A few multi-row INSERTs per thousand workflows; heroes that already have an ongoing
    workflow of this class are reported in ``conflicts`` (``raise_on_conflict``: raise
    ``WorkflowAlreadyOngoing`` for the first instead, having written nothing). No ORM
    instances are made: load the ones you need by id.
    """
    _check_creatable(cls, session)
    if heroes is None and count is None and isinstance(inputs, Sequence):
        count = len(inputs)  # hero-less workflows, one per input
    if heroes is not None and not isinstance(heroes, Sequence):
        heroes = list(heroes)  # counted against the inputs, then iterated
    planned = len(heroes) if heroes is not None else count
    encoded = _inputs(cls, session, inputs, planned if isinstance(planned, int) else 0)
    keyed = _keyed_heroes(cls, session, heroes, count, encoded)
    start, _ = _planned(cls, session, allow_multiple, step_job_options)
    if start.first is None:
        raise StepConfigurationError(
            f"{cls.__name__}.create_many(): {cls.__name__} has no steps, so each workflow "
            "would finish at once; use create() for it"
        )
    unique, repeated = _split_repeats(keyed)
    if raise_on_conflict and repeated:
        raise _conflict_error(cls, (repeated[0][0], None))
    if not raise_on_conflict:
        return _start_keyed(cls, session, start, unique, repeated, allow_multiple)
    with session.begin_nested():  # all or nothing: a conflict undoes every row of the call
        result = _start_keyed(cls, session, start, unique, repeated, allow_multiple)
        if result.conflicts:
            raise _conflict_error(cls, result.conflicts[0])
    return result


def _start_keyed(
    cls: type[Workflow],
    session: Session,
    start: Start,
    unique: list[tuple[Any, Keyed]],
    repeated: list[tuple[Any, Keyed]],
    allow_multiple: bool,
) -> StartResult:
    """:func:`_start_all`, per :class:`StartKeys` of the workflows when ``cls`` has a
    fairness key or its first step a limit: every key is computed (and checked) before
    anything is written; the rows of one group share their values, so each group's workflows
    start together. A class with neither starts all of them at once, as before."""
    assert start.first_step is not None
    if not is_fair(cls) and limits_of(cls, start.first_step) is None:
        return _start_all(session, start, unique, repeated, allow_multiple)
    groups: dict[tuple[str | None, str | None], tuple[StartKeys, list[int]]] = {}
    for i, (hero, stored) in enumerate(unique):
        item = f"{stored.item} of create_many()"
        keys = keys_before_start(cls, start, hero, stored.hero, stored.input, item=item)
        groups.setdefault(keys.group(), (keys, []))[1].append(i)
    fair_keys = [k.fair for k, _ in groups.values() if k.fair is not None]
    if fair_keys:  # (a class with limits alone has none to register)
        register_keys(session, fair_keys)
    result = StartResult(conflicts=[(hero, None) for hero, _ in repeated])
    created: list[tuple[int, tuple[Any, int]]] = []  # (place in ``unique``, created)
    for keys, places in groups.values():
        members = [unique[i] for i in places]
        part = _start_all(session, keys.applied(start), members, [], allow_multiple)
        # ``part.created`` follows ``members``, less the heroes refused (hero-less workflows
        # are never refused, and all have the hero None: hence placed by position).
        refused = {id(hero) for hero, _ in part.conflicts}
        kept = [i for i in places if unique[i][0] is None or id(unique[i][0]) not in refused]
        created += zip(kept, part.created, strict=True)
        result.conflicts += part.conflicts
    result.created += [c for _, c in sorted(created, key=lambda placed: placed[0])]
    return result


def _start_all(
    session: Session,
    start: Start,
    unique: list[tuple[Any, Keyed]],
    repeated: list[tuple[Any, Keyed]],
    allow_multiple: bool,
) -> StartResult:
    assert start.first is not None and start.first_step is not None
    result = StartResult(conflicts=[(hero, None) for hero, _ in repeated])
    if not unique:
        return result
    connection = connection_of(session)
    notify, notified = wake_for_start(session, start.queue, start.due)
    with_inputs = any(key.input is not None for _, key in unique)
    started = starter_for(connection).start_many(
        connection,
        start.workflow,
        [key.hero for _, key in unique],
        start.first,
        notify,
        [key.input for _, key in unique] if with_inputs else None,
    )
    if notify is not None and started:
        note_woken(session, notify)
    executions = _collect(result, unique, started, allow_multiple, connection, start)
    due, name = start.first["scheduled_for"], start.first["step_name"]
    for _, workflow_id in result.created:
        step = EnqueuedStep(
            executions[workflow_id], workflow_id, name, due, start.options, notified=notified
        )
        enqueue_after_commit(session, step)
    return result


@dataclass(frozen=True)
class Keyed:
    """One workflow of a ``create_many()`` call: its hero as stored and its stored input."""

    hero: Hero
    input: Any = None
    item: str = ""  # where the call gave it, as errors name it: heroes[3], inputs[0]


def _keyed_heroes(
    cls: type[Workflow],
    session: Session,
    heroes: Iterable[Any] | None,
    count: int | None,
    inputs: list[Any] | None,
) -> list[tuple[Any, Keyed]]:
    name = cls.__name__
    if (heroes is None) == (count is None):
        raise TypeError(
            f"{name}.create_many(): pass heroes=[...] (one workflow each) or count=N "
            "(hero-less workflows), not both nor neither"
        )
    if count is not None:
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"{name}.create_many(count={count!r}): expected an int >= 0")
        if count and not cls.may_proceed_without_hero:
            hero_key(cls, session, None)  # raises the hero-less refusal of create()
        given = inputs if inputs is not None else [None] * count
        where = "inputs" if inputs is not None else "count"
        return [(None, Keyed((None, None), v, f"{where}[{i}]")) for i, v in enumerate(given)]
    keyed = [(hero, hero_key(cls, session, hero, verb="create_many")) for hero in heroes or ()]
    given = inputs if inputs is not None else [None] * len(keyed)
    return [
        (hero, Keyed(key, value, f"heroes[{i}]"))
        for i, ((hero, key), value) in enumerate(zip(keyed, given, strict=True))
    ]


def _split_repeats(
    keyed: Sequence[tuple[Any, Keyed]],
) -> tuple[list[tuple[Any, Keyed]], list[tuple[Any, Keyed]]]:
    """Each hero's first listing, and the later ones (a hero is started at most once per
    call). Hero-less entries are never repeats."""
    seen: set[Hero] = set()
    unique, repeated = [], []
    for hero, key in keyed:
        if key.hero[1] is not None and key.hero in seen:
            repeated.append((hero, key))
            continue
        seen.add(key.hero)
        unique.append((hero, key))
    return unique, repeated


def _conflict_error(cls: type[Workflow], conflict: tuple[Any, int | None]) -> Exception:
    hero, existing = conflict
    state = sa_inspect(hero)
    return ongoing_error(cls, hero_type_of(type(hero)), str(state.identity[0]), existing)


def _collect(
    result: StartResult,
    unique: list[tuple[Any, Keyed]],
    started: list[Started],
    allow_multiple: bool,
    connection: Any,
    start: Start,
) -> dict[int, int]:
    """Fill ``result`` in the order given; returns the first execution's id by workflow id."""
    # Rows come back by hero. Hero-less ones are told apart by their input only: each takes a
    # row that holds its input (two with equal inputs are alike, so either will do).
    heroless = _HeroLess([(w, stored) for w, key, _, stored in started if key[1] is None])
    ids = {key: w for w, key, _, _ in started if key[1] is not None}
    refused = [
        {"type": start.workflow["type"], "hero_type": key.hero[0], "hero_id": key.hero[1]}
        for _, key in unique
        if key.hero[1] is not None and key.hero not in ids
    ]
    holders = _ongoing_heroes(connection, refused) if refused and not allow_multiple else {}
    for hero, key in unique:
        if key.hero[1] is None:
            result.created.append((hero, heroless.take(key.input)))
        elif key.hero in ids:
            result.created.append((hero, ids[key.hero]))
        else:
            result.conflicts.append((hero, holders.get(key.hero)))
    return {w: x for w, _, x, _ in started}


class _HeroLess:
    """The inserted hero-less workflows, handed out by input.

    A row's input comes back as the database stores it, which may spell a number otherwise
    (JSONB keeps ``1e20`` as ``100000000000000000000``): an input without an exact match takes
    the first row no other input matches.
    """

    def __init__(self, rows: list[tuple[int, Any]]) -> None:
        self._by_input: dict[str, list[int]] = {}
        for workflow_id, stored in rows:
            self._by_input.setdefault(_canonical(stored), []).append(workflow_id)
        self._taken: set[int] = set()

    def take(self, value: Any) -> int:
        exact = [w for w in self._by_input.get(_canonical(value), []) if w not in self._taken]
        pool = exact or [w for ids in self._by_input.values() for w in ids if w not in self._taken]
        self._taken.add(pool[0])
        return pool[0]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# -- the hero -----------------------------------------------------------------------------


def hero_key(
    cls: type[Workflow], session: Session, hero: Any, *, verb: str = "create"
) -> tuple[str | None, str | None]:
    """(hero_type, hero_id) as stored, or a ``StepConfigurationError`` saying what to pass."""
    name = cls.__name__
    if hero is None:
        if not cls.may_proceed_without_hero:
            # Its first step's hero check would cancel it straight away, for no stated
            # reason: refuse here, where the cause is.
            raise StepConfigurationError(
                f"{name}.{verb}(hero=None): {name} needs a hero — without one it would be "
                f"canceled at its first step; pass hero=<a mapped instance>, or set "
                f"may_proceed_without_hero = True on {name} for a workflow without a hero"
            )
        return None, None
    state = _hero_state(name, hero, verb)
    hero_type = stored_hero_type(type(hero), f"{name}.{verb}(hero=...)")
    if state.identity is None:
        _flush_new_hero(session, name, hero)
    if state.identity is None:  # pragma: no cover - a flush always assigns the key
        raise StepConfigurationError(f"{name}.{verb}(hero=...): {hero!r} has no primary key")
    hero_id = str(state.identity[0])
    for what, value, limit in (
        ("class name", hero_type, MAX_HERO_TYPE),
        ("primary key", hero_id, MAX_HERO_ID),
    ):
        text.check(value, f"{name}.{verb}(hero=...): the hero's {what}")
        if len(value) > limit:
            raise StepConfigurationError(
                f"{name}.{verb}(hero=...): the hero's {what} {value[:40]!r}… is {len(value)} "
                f"characters long, over the limit of {limit} (the length of the column "
                "that stores it); use a hero with a shorter key, or a shorter class name"
            )
    return hero_type, hero_id


def stored_hero_type(hero_class: type[Any], where: str) -> str:
    """What ``hero_type`` stores for the hero's class; refused if another class shares it."""
    try:
        return checked_hero_type(hero_class)
    except StepConfigurationError as error:  # AmbiguousHeroType, or a bad __hero_type__
        raise type(error)(f"{where}: {error}") from None


def _hero_state(name: str, hero: Any, verb: str) -> InstanceState[Any]:
    """The ORM state of a hero passed to ``create()``; refuses what cannot be one."""
    where = f"{name}.{verb}(hero=...)"
    if isinstance(hero, type):
        raise StepConfigurationError(
            f"{where}: got the class {hero.__name__} itself; pass an instance, e.g. "
            f"hero=session.get({hero.__name__}, id)"
        )
    try:
        state = sa_inspect(hero)
        state.mapper  # noqa: B018 — raises for objects that are inspectable but not instances
    except Exception:
        raise StepConfigurationError(
            f"{where}: the hero must be an instance of a mapped SQLAlchemy class, got {hero!r}"
        ) from None
    if not isinstance(state, InstanceState):
        raise StepConfigurationError(
            f"{where}: the hero must be an instance of a mapped SQLAlchemy class, got {hero!r}"
        )
    if len(state.mapper.primary_key) != 1:
        raise StepConfigurationError(
            f"{where}: {type(hero).__name__} has a composite primary key; heroes need a "
            "single-column key (int, str or UUID)"
        )
    if state.deleted or state.was_deleted:
        raise StepConfigurationError(
            f"{where}: {type(hero).__name__} {hero!r} has been deleted in this session; a "
            "workflow needs a hero that exists"
        )
    return state


def _flush_new_hero(session: Session, name: str, hero: Any) -> None:
    """Give a hero that was never saved its primary key: add it to ``session`` and flush.

    In a savepoint, so that a hero the database refuses leaves the caller's transaction as it
    was (nothing written, still usable).
    """
    other = object_session(hero)
    if other is not None and other is not session:
        raise StepConfigurationError(
            f"{name}.create(hero=...): the hero {hero!r} is new (no primary key yet) and "
            "belongs to another session; flush it there first, or create the workflow in that "
            "session"
        )
    try:
        with session.begin_nested():
            session.add(hero)
            session.flush()
    except Exception as error:
        raise StepConfigurationError(
            f"{name}.create(hero=...): the hero {hero!r} had no primary key yet, so it was "
            f"added to the session and flushed, which failed: {type(error).__name__}: {error}; "
            "save the hero yourself first (session.add(hero); session.flush())"
        ) from error

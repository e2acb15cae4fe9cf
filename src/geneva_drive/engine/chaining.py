"""Chaining: starting the next step in the transaction that completes the one before it.

When a completed step's successor is due now and the worker takes its queue, that
successor's phase 1 runs under the lock phase 3 holds, and one commit records the outcome
and the start (:func:`hand_on`). When a step finishes its workflow, the same transaction
claims the next due execution instead (:func:`claim_next`) — on PostgreSQL in the one
statement that completes the step (the handover, :func:`hand_over`). Phase 3's fast path
(``finalize``) decides with :func:`after_completion` what follows before it writes anything.

The handover's claim tries the first due rows only, unless a recent narrow one missed:
that memory (:class:`Handovers`) is this module's own, kept between runs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy.orm import Session

from geneva_drive.core import events
from geneva_drive.core.settings import Settings
from geneva_drive.core.states import WorkflowState
from geneva_drive.definition.limits import limits_of
from geneva_drive.engine import limits, outcomes, prepare, scheduling, tracing, writer
from geneva_drive.engine.fair_turns import turns_of
from geneva_drive.engine.prepare import Prepared, execution_payload
from geneva_drive.engine.run_options import RunOptions
from geneva_drive.engine.step_errors import STEP_ERRORS
from geneva_drive.engine.wakeups import enqueue_after_commit, enqueued_step
from geneva_drive.storage import queries
from geneva_drive.storage.models import StepExecution
from geneva_drive.storage.queries._sql import workflow_model
from geneva_drive.storage.queries.claims import ClaimScope

if TYPE_CHECKING:
    from geneva_drive.definition.steps import StepDefinition
    from geneva_drive.definition.workflow import Workflow


# After a handover whose narrow claim found nothing where the ordinary claim that followed
# found a row (the head of the queue full of rows it could not claim), this many handovers
# claim as widely as the ordinary claim, then a narrow one tries again: behind paused rows one
# narrow miss (one transaction more) per this many workflows.
WIDE_HANDOVERS = 64


@dataclass
class Handovers:
    """How wide the next handovers claim: what one run learns for the ones after it.

    ``wide``: how many of the next handovers claim with every window of due rows rather than
    only the first; ``narrow_missed``: whether the last narrow one claimed nothing (see
    :func:`hand_over`). Hints, whose races cost at most a handover's width.
    """

    wide: int = 0
    narrow_missed: bool = False


_HANDOVERS = "_gd_handovers"


def handovers_of(options: RunOptions) -> Handovers:
    """The handover state of the runs made with ``options``, created at its first use.

    Kept on the options object, the one thing that lives as long as a worker's runs: each
    step thread passes its own copy to every ``claim_and_run`` (``Worker._loop``), so each
    thread has its own. Not a field of ``RunOptions``, which holds what the caller decides;
    a copy made with ``dataclasses.replace`` starts afresh.
    """
    state = vars(options).get(_HANDOVERS)
    if not isinstance(state, Handovers):
        state = vars(options)[_HANDOVERS] = Handovers()
    return state


def after_narrow_miss(options: RunOptions, *, claimed: bool) -> None:
    """After a narrow handover that claimed nothing, the ordinary claim that follows tells
    why: it found a row (the first due rows could not be claimed: widen the next handovers,
    see hand_over), or none (nothing was due)."""
    handovers = handovers_of(options)
    if handovers.narrow_missed:
        handovers.narrow_missed = False
        if claimed:
            handovers.wide = WIDE_HANDOVERS


@dataclass(frozen=True)
class _AfterCompletion:
    """What follows a completed step on the fast path, decided before anything is written.

    ``chain``: the next step starts in this transaction and runs on this thread. ``direct``:
    nothing can keep it from starting, so its row is inserted already in progress.
    ``inherits``: a direct start of a step with the concurrency key whose slot the completed
    step holds: the slot passes to it (``limits.pass_on``) instead of being freed and taken.
    """

    step: StepDefinition | None
    navigation: dict[str, Any]
    row: dict[str, Any] | None
    job_options: dict[str, Any]
    chain: bool = False
    direct: bool = False
    inherits: bool = False


def after_completion(
    workflow: Workflow, options: RunOptions, now: datetime, holds: str | None = None
) -> _AfterCompletion:
    """``holds``: the concurrency key whose slot the completed step holds, if any."""
    following = type(workflow).steps.next_after(workflow.current_step_name)
    if following is None:
        finished = {
            **outcomes.moved_columns(WorkflowState.PERFORMING, WorkflowState.FINISHED, now),
            "updated_at": now,
        }
        return _AfterCompletion(None, finished, None, {})
    job_options = workflow.merged_job_options(following)
    queue = str(job_options.get("queue") or "default")
    wait = following.delay(now)
    chain = (
        options.chain is not None
        and not wait
        and _chainable(type(workflow), following)
        and options.chain(queue)
    )
    keys = limits.scheduled_keys(workflow, following)  # the next step's, computed once
    inherits = chain and limits.inherits_slot(holds, keys, limits_of(type(workflow), following))
    direct = chain and _nothing_to_check(type(workflow), following, inherits=inherits)
    navigation = {
        **outcomes.moved_columns(
            WorkflowState.PERFORMING,
            WorkflowState.PERFORMING if direct else WorkflowState.READY,
            now,
            current_step=following.name if direct else None,
            next_step=following.name,
        ),
        "updated_at": now,
    }
    started = writer.lease_columns(now, options.worker_id, options.lease) if direct else None
    row = scheduling.execution_values(
        workflow,
        following,
        now=now,
        wait=wait,
        started=started,
        options=job_options,
        keys=keys,
    )
    return _AfterCompletion(
        following, navigation, row, job_options, chain, direct, inherits and direct
    )


def hand_on(
    session: Session,
    workflow: Workflow,
    created: StepExecution,
    after: _AfterCompletion,
    options: RunOptions,
    now: datetime,
) -> Prepared | None:
    """The next step, just inserted: run it here next (chaining), or wake a worker for it."""
    assert after.step is not None
    if after.direct:
        return _started_directly(workflow, created, after.step)
    if after.chain:
        return _start_chained(session, workflow, created, after.step, options, now)
    enqueue_after_commit(session, enqueued_step(workflow, created, after.job_options))
    return None


def _chainable(cls: type[Workflow], step_def: StepDefinition) -> bool:
    """Whether ``step_def`` may start in a transaction that did other work — which may have
    freed a slot, and must then wait for no lock (``engine.limits``): not a rate-limited step
    (its key's row is waited for); a concurrency-limited one only if a slot is free at once
    (else it is left to an ordinary claim)."""
    found = limits_of(cls, step_def)
    return found is None or found.rate is None


def _nothing_to_check(cls: type[Workflow], step_def: StepDefinition, *, inherits: bool) -> bool:
    """Whether phase 1 of ``step_def`` is certain to start it: no guard could decide otherwise,
    and no limit could keep it waiting (none, or it inherits the slot of the step before)."""
    return (
        cls.may_proceed_without_hero
        and _no_preconditions(cls, step_def)
        and (inherits or limits_of(cls, step_def) is None)
    )


def _no_preconditions(cls: type[Workflow], step_def: StepDefinition) -> bool:
    """No cancel_if, skip_if, wait_until callable, signal or fan-in gate: nothing of the
    application's runs in phase 1, and nothing can park the step."""
    return (
        not cls._cancel_conditions
        and step_def.skip_if is None
        and (step_def.wait_until is None or step_def.until is not None)
        and not step_def.waits_for_signal
        and not step_def.waits_for_children
    )


def _started_directly(
    workflow: Workflow, execution: StepExecution, step_def: StepDefinition
) -> Prepared:
    # Phase 1's event for a step whose preconditions had nothing to say.
    payload = execution_payload(workflow, execution)
    with events.instrument("precondition", payload):
        payload["outcome"] = "passed"
    return Prepared(workflow, execution, step_def, None)


def hand_over(
    session: Session,
    completer: writer.Completer,
    prepared: Prepared,
    after: _AfterCompletion,
    as_started: dict[str, Any],
    done: dict[str, Any],
    scope: ClaimScope,
    options: RunOptions,
    config: Settings,
    now: datetime,
) -> queries.Handover | None:
    """A workflow's last completion, the next claim and, when phase 1 is certain to start
    the claimed step, its start: one statement (``queries.handover``), where the completer
    can send it. None, having written nothing, otherwise: the caller completes, then
    :func:`claim_next` claims in the same transaction.

    Only within a worker's scope (the classes it has loaded): the steps it may start so are
    worked out from those classes.

    Whether the statement runs as a transaction of its own is a guess at what it will
    claim. Alone, it costs one round trip instead of three — but the lock on a row it could
    not start goes with it, and an ordinary claim must take that row again in a transaction
    of its own. So it runs alone after a workflow whose own class starts directly: a backlog
    tends to hold many workflows of one class, and after one of them the next is likely
    such a step. After any other, the transaction goes on, and a row it claimed but could
    not start is run from there (the caller).

    Its claim tries only the first due rows, unless a recent narrow one claimed nothing
    where the ordinary claim after it found a row (``Handovers.wide``,
    ``queries.handover``): a claim with every window costs the server 13 % more per step on
    a backlog, where the first rows always do.
    """
    if not (completer.hands_over and scope.loaded_only):
        return None
    turns = turns_of(options) if scope.takes_turns else None
    # A key's turn (engine.fair_turns) is taken in the statement too, but not after a step
    # that holds a slot (its statement passes the slot on, and claims in the ordinary order),
    # nor when the last key turn found no key due (the look every IDLE_ORDINARY_TURNS claims
    # of an unkeyed backlog: in claim_next's transaction, as before).
    keyed = turns is not None and turns.keys_next
    if turns is not None and keyed and (prepared.holds is not None or not turns.keys_were_due):
        return None  # claim_next's key turn
    if options.should_exit is not None and options.should_exit():
        return None
    # Limited steps only after a step that holds a slot, to pass on: the statement after any
    # other names no limit table (its cost to workflows without limits is nothing, measured:
    # taking a free slot there cost every unlimited handover 6 % more server instructions).
    direct = _direct_steps(scope)
    limited = _limited_steps(scope) if prepared.holds is not None else None
    if not direct[0] and limited is None:
        return None
    handovers = handovers_of(options)
    # A key's turn tries the key's first due rows only; a miss leaves the claim to the next
    # key's turn (queries.fairness), which tries every window and the next keys.
    wide = handovers.wide > 0 and not keyed
    if wide:
        handovers.wide -= 1
    claim = queries.NextClaim(
        scope=scope,
        now=now,
        started=writer.lease_columns(now, options.worker_id, options.lease),
        direct=direct,
        # Not while the completed step holds a slot: unless the statement passes it on, it
        # is freed after it, and the waiter looked for, in this transaction.
        alone=_starts_directly(type(prepared.workflow)) and prepared.holds is None,
        wide=wide,
        limited=limited,
        held_key=prepared.holds,
        keyed=keyed,
        shared_turns=turns.shared if turns is not None else 0,
    )
    with tracing.claim_span(config) as span:
        handover = completer.finish_and_start_next(
            session,
            prepared.workflow,
            after.navigation,
            as_started,
            prepared.execution,
            done,
            claim,
        )
        span.handed_over(handover)
    # Counted as claims are once started here; a row it claimed but may not start is counted
    # by the ordinary claim that takes it.
    if handover is not None and handover.started is not None:
        if keyed:
            assert turns is not None  # for mypy
            turns.took_key_turn(keys_due=True, shared=handover.shared)
        elif turns is not None:
            # The ordinary claim's turn. A row it claimed but may not start is claimed again
            # by claim_next, a turn of the same kind: counted there.
            turns.took_ordinary_turn()
        if events.active("claim"):
            events.emit("claim", {})
    if handover is not None and not wide and not keyed and not handover.claimed:
        handovers.narrow_missed = True
    return handover


def _starts_directly(cls: type[Workflow]) -> bool:
    """Whether phase 1 is certain to start the first step of ``cls``."""
    runnable = cls.steps.runnable()
    return bool(runnable) and _nothing_to_check(cls, runnable[0], inherits=False)


def claim_next(
    session: Session, scope: ClaimScope, options: RunOptions, config: Settings, now: datetime
) -> Prepared | None:
    """Claim the next due execution in the transaction that has just finished a workflow.

    A worker with a backlog would otherwise commit this transaction and at once open
    another for its next claim: one commit per workflow saved (four become three for a
    three-step workflow). The claim is the usual one — same scope, same SKIP LOCKED, same
    order — and its phase 1 runs as a chained step's does (:func:`_start_chained`), so an
    application error there never costs the finished workflow its outcome. Nothing is
    claimed once the worker is stopping. A timer row or a step the code does not define is
    left to an ordinary claim (declined: its lock goes with this commit), whose phase 1
    resolves it as always; so is a rate-limited step (see :func:`_chainable`).
    """
    if options.should_exit is not None and options.should_exit():
        return None
    claimed = prepare.claim(session, config, scope, None, options)
    if claimed is None:
        return None
    locked = prepare.lock_both(session, claimed[0], claimed[1], config)
    assert locked is not None  # both rows were just claimed and locked
    workflow, execution = locked
    step_def = type(workflow).steps.named(execution.step_name)
    if step_def is None or execution.is_timer or not _chainable(type(workflow), step_def):
        return None
    started = _start_chained(session, workflow, execution, step_def, options, now)
    if started is not None:
        started.claimed = True
    return started


def claimed_directly(handover: queries.Handover) -> Prepared | None:
    """The step :func:`hand_over` claimed and started, to run here next."""
    if handover.started is None:
        return None
    row, execution = handover.started
    workflow = cast("Workflow", row)  # the query layer types it by its columns
    step_def = type(workflow).steps.named(execution.step_name)
    assert step_def is not None  # one of the direct steps of its class
    started = _started_directly(workflow, execution, step_def)
    started.claimed = True
    started.holds = handover.holds
    return started


def _limited_steps(scope: ClaimScope) -> queries.Limited | None:
    """Every step of a class in ``scope`` whose phase 1 would start it but for a slot of
    its concurrency limit (no rate limit, nothing else to check): the handover starts it on
    the slot passed on in its statement (``queries.handover``). None if there is none."""
    classes = workflow_model().__mapper__.polymorphic_map
    return _limited_of(
        tuple((name, classes[name].class_) for name in scope.workflow_types if name in classes)
    )


@functools.lru_cache(maxsize=64)
def _limited_of(classes: tuple[tuple[str, type[Workflow]], ...]) -> queries.Limited | None:
    found = []
    for name, cls in classes:
        for step_def in cls.steps.runnable():
            step_limits = limits_of(cls, step_def)
            if (
                step_limits is None
                or step_limits.concurrency is None
                or step_limits.rate is not None
                or not (cls.may_proceed_without_hero and _no_preconditions(cls, step_def))
            ):
                continue
            n = step_limits.concurrency.n
            found.append((name, str(step_def.name), n, limits.constant_key(step_limits)))
    if not found:
        return None
    types, steps, ns, keys = zip(*found, strict=True)
    return queries.Limited(types, steps, ns, keys)


def _direct_steps(scope: ClaimScope) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(workflow types, step names), pairwise: every step of a class in ``scope`` whose
    phase 1 is certain to start it (see :func:`_nothing_to_check`)."""
    classes = workflow_model().__mapper__.polymorphic_map
    return _direct_pairs(
        tuple((name, classes[name].class_) for name in scope.workflow_types if name in classes)
    )


@functools.lru_cache(maxsize=64)
def _direct_pairs(
    classes: tuple[tuple[str, type[Workflow]], ...],
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    pairs = [
        (name, str(step_def.name))
        for name, cls in classes
        for step_def in cls.steps.runnable()
        if _nothing_to_check(cls, step_def, inherits=False)
    ]
    return tuple(name for name, _ in pairs), tuple(step for _, step in pairs)


def _start_chained(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition,
    options: RunOptions,
    now: datetime,
) -> Prepared | None:
    """Phase 1 of a step inside the transaction that completed another one: its
    predecessor's, or (claimed there) the last step of another workflow.

    Should anything fail unexpectedly here, only this step's start is undone: the
    predecessor's outcome and its body's writes still commit, and the step is left
    scheduled for an ordinary claim, whose phase 1 records the failure as it always does.
    The hero is read before anything is written for the next step; guards that run
    application code or a signal gate run in a savepoint.
    """
    cls = type(workflow)
    # The guards read the hero and may query: let them find the rows as a claim's phase 1
    # would, with the predecessor's writes in place.
    session.flush()
    # Not the hero the predecessor saw (it may have deleted it), but the row as it is now.
    workflow.__dict__.pop("_gd_hero", None)
    if not cls.may_proceed_without_hero:
        try:
            workflow.hero  # noqa: B018 — loads and caches it for the guard
        except STEP_ERRORS as error:
            _leave_scheduled(session, workflow, execution, step_def, error)
            return None
    if _no_preconditions(cls, step_def):
        started = prepare.guards_and_start(session, workflow, execution, options, now, chained=True)
        return started if isinstance(started, Prepared) else None
    try:
        with session.begin_nested():
            started = prepare.guards_and_start(
                session, workflow, execution, options, now, chained=True
            )
        return started if isinstance(started, Prepared) else None
    except STEP_ERRORS as error:
        # Instances may hold values the savepoint's rollback took back from the rows.
        session.expire(workflow)
        session.expire(execution)
        _leave_scheduled(session, workflow, execution, step_def, error)
        return None


def _leave_scheduled(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition,
    error: BaseException,
) -> None:
    if queries.is_transient(error):
        raise error  # the whole transaction is lost: finalize.finalize hands the predecessor back
    events.execution_logger(workflow, execution).warning(
        "could not start step %r right after its predecessor (%s: %s); "
        "leaving it scheduled for a worker to claim",
        step_def.name,
        type(error).__name__,
        error,
    )
    enqueue_after_commit(session, enqueued_step(workflow, execution))

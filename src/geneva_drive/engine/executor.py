"""Running one step execution, in three phases.

Phase 1 (prepare, ``prepare.py``) — one short transaction holding the workflow row lock:
guards in a fixed order, preconditions, the signal gate, then ``scheduled → in_progress``
and commit.
Phase 2 (perform, here) — the step body runs with no lock held, in the same ``Session`` that
phase 3 commits: the body's writes are part of the step's unit of work.
Phase 3 (finalize, ``finalize.py``) — re-lock the workflow row *in the body's transaction*,
record the outcome, create the next execution and commit — one commit for the body's writes,
the outcome and the next step together. A failed body is rolled back first, so its writes
never land. Where it can, phase 3 starts the next step in that same transaction, to run here
next (``chaining.py``).

Two commits per plain step in total. Everything here is safe to run twice for one execution:
the second run finds the row no longer ``scheduled`` and does nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session

from geneva_drive.core import events, text
from geneva_drive.core.awaiting import settle
from geneva_drive.core.errors import ResultTooLargeError
from geneva_drive.core.settings import Settings, settings
from geneva_drive.definition.flow import Action, FlowControl
from geneva_drive.engine import chaining, tracing, unit_of_work
from geneva_drive.engine.body_results import Completed, Failed, Interrupted
from geneva_drive.engine.finalize import Result, finalize
from geneva_drive.engine.iteration import run_resumable
from geneva_drive.engine.prepare import Ended, NotClaimed, PhaseOne, Prepared, phase1
from geneva_drive.engine.run_options import RunOptions
from geneva_drive.engine.step_errors import STEP_ERRORS
from geneva_drive.storage import serialization
from geneva_drive.storage.db import session_factory
from geneva_drive.storage.models import StepExecution
from geneva_drive.storage.queries.bypass import begin_on_held_connection, hold_connection
from geneva_drive.storage.queries.claims import EVERY_CLASS_ANY_QUEUE, ClaimScope
from geneva_drive.storage.values import stored_value

if TYPE_CHECKING:
    from geneva_drive.definition.steps import StepDefinition
    from geneva_drive.definition.workflow import Workflow

__all__ = ["RunOptions", "claim_and_run", "run_execution"]


def run_execution(
    execution_id: int,
    *,
    reraise: bool = True,
    options: RunOptions | None = None,
    config: Settings | None = None,
) -> StepExecution | None:
    """Run one execution by id. Returns it (detached) or None when there was nothing to run.

    With ``reraise`` the step's own exception is raised after its outcome has been committed,
    so a job framework sees the failure; the database is already consistent by then.
    """
    config = config or settings()
    options = options or RunOptions()
    with _step_session(config, hold=options.hold_connection) as session:
        started = phase1(session, options, config, execution_id=execution_id)
        return _continue(session, started, options, config, reraise=reraise)


def claim_and_run(
    scope: ClaimScope | None,
    options: RunOptions,
    config: Settings | None = None,
    *,
    execution_id: int | None = None,
) -> bool:
    """Claim the next due execution (or, eagerly, the given one) and run it. False if none.

    ``scope`` says which queues and classes may be claimed (None: any row). The claim and
    phase 1 share one transaction (one commit): the claim query locks the workflow row with
    SKIP LOCKED, and phase 1 runs under that lock.
    """
    config = config or settings()
    scope = scope or EVERY_CLASS_ANY_QUEUE
    # Chaining goes on across workflows: the transaction that finishes one claims the next
    # (the same claim, within the same scope), saving a transaction per workflow.
    then_claim = scope if options.chain is not None else None
    with _step_session(config, hold=options.hold_connection) as session:
        started = phase1(session, options, config, scope=scope, claim_id=execution_id)
        chaining.after_narrow_miss(options, claimed=not isinstance(started, NotClaimed))
        if isinstance(started, NotClaimed):
            return False
        _continue(session, started, options, config, reraise=False, then_claim=then_claim)
        return True


@contextmanager
def _step_session(config: Settings, *, hold: bool = True) -> Iterator[Session]:
    """The session of one run, holding one connection for all its transactions: the claim's
    and every chained step's (see ``queries.bypass.hold_connection``). Without ``hold``, a
    connection per transaction, taken at its first statement (``RunOptions.hold_connection``).
    """
    factory = session_factory(config)
    if not hold:
        with factory() as session:
            yield session
        return
    # The factory's own bind, not a new engine_for_workers(): the session finds the held
    # connection under the engine it is bound to, which must be this very object.
    with factory.kw["bind"].connect() as connection, factory() as session:
        hold_connection(session, connection)
        yield session


def _continue(
    session: Session,
    started: PhaseOne,
    options: RunOptions,
    config: Settings,
    *,
    reraise: bool,
    then_claim: ClaimScope | None = None,
) -> StepExecution | None:
    """Phases 2 and 3 of a started step, then of each step chained after it.

    ``then_claim``: when a step finishes its workflow, claim the next execution in that
    scope in the same transaction, and run it here next.
    """
    if isinstance(started, Ended) and started.error is not None and reraise:
        raise started.error
    if not isinstance(started, Prepared):
        return None
    prepared = started
    while True:
        if options.on_started is not None:
            options.on_started(prepared.execution_id)
        result = _perform(session, prepared, options, config)
        error, chained = finalize(session, prepared, result, config, options, then_claim)
        if error is not None and reraise:
            raise error
        if chained is None:
            return prepared.execution
        if options.on_chained is not None:
            options.on_chained(not chained.claimed)
        prepared = chained


# -- phase 2 ---------------------------------------------------------------------------------


def _perform(session: Session, prepared: Prepared, options: RunOptions, config: Settings) -> Result:
    workflow, execution, step_def = prepared.workflow, prepared.execution, prepared.step_def
    payload = dict(prepared.identity)
    begin_on_held_connection(session)  # the body's queries, then phase 3, on that connection
    workflow.__dict__["_gd_received_signal"] = prepared.signal
    hero = workflow.__dict__.get("_gd_hero")
    if hero is not None:
        if sa_inspect(hero).persistent:
            # Loaded by phase 1's hero guard in an earlier transaction: let the body read it
            # fresh in its own, so `hero.counter += 1` does not write back a stale value.
            session.expire(hero)
        else:  # deleted by a step chained before this one: look it up again if asked
            workflow.__dict__.pop("_gd_hero", None)

    def body() -> Result:
        span = tracing.step_span(session, prepared, config, payload)
        with events.instrument("step", payload), span:
            try:
                if step_def.resumable:
                    outcome: Result = run_resumable(
                        session, workflow, execution, step_def, options, config
                    )
                else:
                    returned = step_def.run(workflow)
                    outcome = Completed(_stored_result(workflow, step_def, returned, config))
            except FlowControl as flow:
                outcome = flow
            except STEP_ERRORS as error:
                outcome = Failed(error)
            payload["outcome"] = _describe(outcome)
            if isinstance(outcome, Failed):
                payload["exception"] = outcome.error
            return outcome

    try:
        # Payload references (mapped instances) load in the step's own session.
        with (
            workflow._in_step_context(),
            serialization.decoding_session(session),
            unit_of_work.guard(session, step_def, prepared.execution_id),  # commit() refused
        ):
            # Hook errors count as step errors (the gem let them escape and strand the row).
            try:
                settle(workflow.before_step_execution(execution))  # awaited if async def
                returned = workflow.around_step_execution(execution, body)
                result: Result = (
                    returned
                    if isinstance(returned, Completed | Interrupted | FlowControl | Failed)
                    else Completed()  # an around hook that returned something else
                )
                settle(workflow.after_step_execution(execution))
            except FlowControl as flow:
                result = flow
            except STEP_ERRORS as error:
                result = Failed(error)
    finally:
        workflow.__dict__.pop("_gd_received_signal", None)
    if isinstance(result, Failed):
        raised = result.error
        prepared.log.warning("step raised %s: %s", type(raised).__name__, text.message_of(raised))
    return result


def _stored_result(
    workflow: Workflow, step_def: StepDefinition, returned: Any, config: Settings
) -> Any:
    """What the body returned, as its execution stores it; a value that cannot be stored
    (not JSON, over ``max_value_size``) is the step's error, raised inside the body's run so
    that it fails like any other: its writes roll back and the exception policies decide."""
    if returned is None:
        return None
    what = (
        f"{type(workflow).__name__}.step {step_def.name!r} (workflow id={workflow.id}) "
        "returned a value that cannot be stored as its result"
    )
    limit = config.max_value_size
    return stored_value(returned, limit=limit, what=what, too_large=ResultTooLargeError)


def _describe(result: Result) -> str:
    if isinstance(result, Completed):
        return "completed"
    if isinstance(result, Interrupted):
        return "interrupted"
    if isinstance(result, Failed):
        return "exception"
    return "finished" if result.action is Action.FINISH else str(result.action)

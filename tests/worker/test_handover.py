"""A workflow's last completion, the next claim and that step's start in one statement
(PostgreSQL, ``queries.handover``).

On a backlog, the transaction that finishes a workflow claims the next one's step. When
phase 1 is certain to start that step (a class without a hero or ``cancel_if``, a step
without ``skip_if`` or a signal gate), the database writes the start itself, in the
completion's statement, and the statement runs as a transaction of its own: one round trip
where a BEGIN, the completion, the claim, the start and a COMMIT were five. Any other row it
claims is left to phase 1 as before.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from sqlalchemy import Engine, select, text

# A class with a fairness_key is loaded in this process: its claims are unkeyed classes' claims
# in a process that has a keyed one, which must claim and hand over as in one that has none.
import tests.fairness.apps  # noqa: F401
from geneva_drive import StepExecution, Workflow, step
from geneva_drive.core import events
from geneva_drive.engine.executor import RunOptions, claim_and_run
from geneva_drive.runtime.loaded import claim_scope
from geneva_drive.storage.models import TIMEOUT_FOR
from tests.engine._support import reload
from tests.worker._support import trail
from tests.worker.apps import WorkerScaleThreeSteps
from tests.worker.test_alone_completion import protocol_trace, sent

pytestmark = pytest.mark.postgres

THREE_DONE = [
    ("one", "completed", "success"),
    ("two", "completed", "success"),
    ("three", "completed", "success"),
]


@pytest.fixture(autouse=True)
def _postgresql_only(db_backend: str) -> None:
    if db_backend != "postgresql":
        pytest.skip("the handover is one PostgreSQL statement (data-modifying CTEs)")


def _options(**kwargs: Any) -> RunOptions:
    return RunOptions(worker_id="w", chain=lambda queue: True, **kwargs)


def _due_after(clock: Any, cls: type[Workflow], session: Any) -> Workflow:
    """Due a second after those made before it: the claim's order is then the test's."""
    clock.advance(seconds=1)
    return cls.create(session)


def test_the_next_workflows_first_step_starts_within_the_finishing_statement(
    gd, session, clock, tmp_path
):
    first = WorkerScaleThreeSteps.create(session)
    second = _due_after(clock, WorkerScaleThreeSteps, session)
    session.commit()
    trace = tmp_path / "libpq.trace"
    chained: list[bool] = []

    with protocol_trace(gd.engine, trace):
        assert claim_and_run(claim_scope(None), _options(on_chained=chained.append), gd)

    assert trail(session, first) == THREE_DONE
    assert trail(session, second) == THREE_DONE
    # The first claim is a transaction of its own (BEGIN, COMMIT); every completion after it
    # is one statement run alone, the first workflow's last one with the second's claim and
    # start. Claimed and started apart, that transaction would add a BEGIN and a COMMIT.
    assert sent(trace, "BEGIN") == 1
    assert sent(trace, "COMMIT") == 1
    # Two chained steps per workflow, and one claimed by the finishing transaction.
    assert chained == [True, True, False, True, True]
    execution = session.scalars(
        select(StepExecution).where(
            StepExecution.workflow_id == second.id, StepExecution.step_name == "one"
        )
    ).one()
    # Started as phase 1 starts a step, at the clock's now (the workflow too).
    assert execution.started_at == clock.now()
    assert reload(session, second).started_at == clock.now()


def test_a_started_step_is_announced_as_phase_one_announces_it(gd, session, clock):
    WorkerScaleThreeSteps.create(session)
    second = _due_after(clock, WorkerScaleThreeSteps, session)
    session.commit()
    seen: list[tuple[int, str, Any]] = []

    def record(name: str, payload: dict[str, Any]) -> None:
        seen.append((payload["workflow_id"], payload["step_name"], payload.get("outcome")))

    unsubscribe = events.subscribe("precondition", record)
    try:
        assert claim_and_run(claim_scope(None), _options(), gd)
    finally:
        unsubscribe()

    assert (second.id, "one", "passed") in seen


class ChecksFirst(WorkerScaleThreeSteps):
    """Its steps are its parent's, but a ``cancel_if`` must run before each starts."""

    def cancel_if(self) -> bool:
        return False


def test_a_step_phase_one_must_check_is_left_to_an_ordinary_claim(gd, session, clock):
    first = WorkerScaleThreeSteps.create(session)
    second = _due_after(clock, ChecksFirst, session)
    session.commit()
    chained: list[bool] = []

    assert claim_and_run(claim_scope(None), _options(on_chained=chained.append), gd)

    # The first workflow's last statement claimed the second's step but could not start it,
    # and ran as a transaction of its own: the claim went with it.
    assert trail(session, first) == THREE_DONE
    assert trail(session, second) == [("one", "scheduled", None)]
    assert chained == [True, True]

    # An ordinary claim then finds it first, and phase 1 checks and starts it.
    assert claim_and_run(claim_scope(None), _options(on_chained=chained.append), gd)
    assert trail(session, second) == THREE_DONE


def test_after_a_class_that_checks_the_claimed_step_starts_in_the_same_transaction(
    gd, session, clock
):
    # A class whose steps are checked finishes in an ordinary transaction: a claimed row
    # stays locked there, and phase 1 runs on it at once, as before.
    first = ChecksFirst.create(session)
    second = _due_after(clock, ChecksFirst, session)
    session.commit()
    chained: list[bool] = []

    assert claim_and_run(claim_scope(None), _options(on_chained=chained.append), gd)

    assert trail(session, first) == THREE_DONE
    assert trail(session, second) == THREE_DONE
    assert chained == [True, True, False, True, True]


def test_a_stopping_worker_claims_nothing_with_the_finishing_statement(gd, session, clock):
    first = WorkerScaleThreeSteps.create(session)
    second = _due_after(clock, WorkerScaleThreeSteps, session)
    session.commit()

    assert claim_and_run(claim_scope(None), _options(should_exit=lambda: True), gd)

    assert trail(session, first) == THREE_DONE
    assert trail(session, second) == [("one", "scheduled", None)]


class OnAnotherQueue(Workflow):
    may_proceed_without_hero = True
    job_options: ClassVar[dict[str, Any]] = {"queue": "elsewhere"}

    @step
    def only(self) -> None:
        pass


def test_a_worker_on_named_queues_claims_only_from_them(gd, session, clock):
    first = WorkerScaleThreeSteps.create(session)
    elsewhere = _due_after(clock, OnAnotherQueue, session)
    second = _due_after(clock, WorkerScaleThreeSteps, session)
    session.commit()

    assert claim_and_run(claim_scope(["default"]), _options(), gd)

    assert trail(session, first) == THREE_DONE
    assert trail(session, second) == THREE_DONE
    assert trail(session, elsewhere) == [("only", "scheduled", None)]


class TakesItsOwnExecution(Workflow):
    """Its one step's execution is taken from it while the body runs (see
    test_alone_completion.TakenFromItself): the finishing statement must write nothing,
    and claim nothing."""

    may_proceed_without_hero = True

    @step
    def only(self) -> None:
        engine = self.session.get_bind()
        assert isinstance(engine, Engine)
        with engine.connect() as other, other.begin():
            other.execute(
                text(
                    "UPDATE geneva_drive_step_executions SET state = 'completed', "
                    "outcome = 'recovered' WHERE workflow_id = :id AND state = 'in_progress'"
                ),
                {"id": self.id},
            )


def test_a_finish_whose_execution_was_taken_claims_nothing(gd, session, clock):
    first = TakesItsOwnExecution.create(session)
    second = _due_after(clock, WorkerScaleThreeSteps, session)
    session.commit()

    assert claim_and_run(claim_scope(None), _options(), gd)

    assert trail(session, first) == [("only", "completed", "recovered")]
    assert reload(session, first).state == "performing"
    assert trail(session, second) == [("one", "scheduled", None)]


def test_a_timer_row_of_a_step_that_no_longer_waits_is_not_started(gd, session, clock):
    # A step that waited for a signal with a timeout, deployed without the wait: its timer
    # row names a step the handover could start. Phase 1 resolves a timer instead.
    first = WorkerScaleThreeSteps.create(session)
    second = _due_after(clock, WorkerScaleThreeSteps, session)
    session.commit()
    timer = session.scalars(
        select(StepExecution).where(StepExecution.workflow_id == second.id)
    ).one()
    timer.write_metadata(TIMEOUT_FOR, -1)
    session.commit()
    chained: list[bool] = []

    assert claim_and_run(claim_scope(None), _options(on_chained=chained.append), gd)

    # The first workflow's steps only: the timer row was claimed, and not started.
    assert chained == [True, True]
    assert trail(session, first) == THREE_DONE
    assert reload(session, second).state == "ready"


def test_the_claim_in_a_completion_is_counted_and_with_trace_claims_is_a_span(gd, session, clock):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from prometheus_client import CollectorRegistry

    from geneva_drive.runtime import metrics
    from geneva_drive.runtime.configure import configured

    first = WorkerScaleThreeSteps.create(session)
    second = _due_after(clock, WorkerScaleThreeSteps, session)
    session.commit()
    second_one = second.current_execution.id
    exporter, provider, registry = InMemorySpanExporter(), TracerProvider(), CollectorRegistry()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    uninstall = metrics.install(registry)
    try:
        with configured(tracing=provider, trace_claims=True) as config:
            assert claim_and_run(claim_scope(None), _options(), config)
    finally:
        uninstall()

    assert trail(session, first) == trail(session, second) == THREE_DONE
    claims = [s for s in exporter.get_finished_spans() if s.name == "geneva_drive.claim"]
    handed = [
        dict(s.attributes) for s in claims if s.attributes["geneva_drive.claim.via"] == "handover"
    ]
    assert {
        "geneva_drive.claim.count": 1,
        "geneva_drive.claim.outcome": "claimed",
        "geneva_drive.execution.id": second_one,
        "geneva_drive.workflow.id": second.id,
    }.items() <= handed[0].items()
    # The first workflow's claim, then the second's, in the first one's last completion.
    assert registry.get_sample_value("geneva_drive_claims_total") == 2

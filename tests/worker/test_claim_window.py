"""A claim looks at the first due rows first, and past them when none of those can be claimed.

On PostgreSQL the worker's claim tries the due executions in claim order one by one, in
windows: the first 16, then the first 1,024, then every one, each only if the one before was
full and none of it could be claimed (``claims.first_in_order``); the handover, which claims
the next workflow as one finishes, tries the first window only. What it claims must not
change: the first claimable row in (priority, due time) order, whatever lies at the head of
the queue. The other backends claim as before; these tests hold them to the same.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

# A class with a fairness_key is loaded in this process: its claims are unkeyed classes' claims
# in a process that has a keyed one, which must claim and hand over as in one that has none.
import tests.fairness.apps  # noqa: F401
from geneva_drive.engine.chaining import handovers_of
from geneva_drive.engine.executor import RunOptions, claim_and_run
from geneva_drive.runtime.loaded import claim_scope
from geneva_drive.storage import queries
from geneva_drive.storage.queries.claims import CLAIM_WINDOWS
from tests.engine._support import reload
from tests.worker._support import trail
from tests.worker.apps import WorkerScaleThreeSteps

BEYOND_THE_WINDOW = CLAIM_WINDOWS[0] + 2
THREE_DONE = [
    ("one", "completed", "success"),
    ("two", "completed", "success"),
    ("three", "completed", "success"),
]


def _queued_one_second_apart(session: Session, clock: Any, count: int) -> list[Any]:
    """``count`` workflows whose first steps fall due in this order (a second apart)."""
    made = []
    for _ in range(count):
        made.append(WorkerScaleThreeSteps.create(session))
        clock.advance(seconds=1)
    session.commit()
    return made


def _paused_one_second_apart(session: Session, clock: Any, count: int) -> list[Any]:
    """:func:`_queued_one_second_apart`, each then paused: its next step stays due for
    ``resume()``, claimable by nobody."""
    paused = _queued_one_second_apart(session, clock, count)
    for workflow in paused:
        workflow.pause()
    session.commit()
    return paused


def _paused_at_the_head(session: Session, clock: Any, count: int) -> None:
    """``count`` paused workflows whose next steps are due before any other's."""
    created = WorkerScaleThreeSteps.create_many(session, count=count).created
    session.commit()
    ids = [workflow_id for _, workflow_id in created]
    for workflow in session.scalars(
        select(WorkerScaleThreeSteps).where(WorkerScaleThreeSteps.id.in_(ids))
    ):
        workflow.pause()
    session.commit()
    clock.advance(seconds=1)


def _claim(gd: Any, clock: Any) -> tuple[int, int] | None:
    with Session(gd.engine) as session, session.begin():
        return queries.claim_due_execution(session, clock.now(), claim_scope(None))


def test_a_claim_passes_over_more_paused_workflows_than_its_window_holds(gd, session, clock):
    # A paused workflow keeps its scheduled execution for resume(): due long ago, at the head
    # of the queue, claimable by nobody.
    _paused_one_second_apart(session, clock, BEYOND_THE_WINDOW)
    runnable, _later = _queued_one_second_apart(session, clock, 2)

    claimed = _claim(gd, clock)

    assert claimed is not None
    assert claimed[1] == runnable.id  # the first claimable, not merely any


def test_a_claim_passes_over_more_paused_workflows_than_every_window_holds(gd, session, clock):
    _paused_at_the_head(session, clock, CLAIM_WINDOWS[-1] + 2)
    runnable, _later = _queued_one_second_apart(session, clock, 2)

    claimed = _claim(gd, clock)

    assert claimed is not None
    assert claimed[1] == runnable.id


def test_a_claim_passes_over_more_rows_being_claimed_than_its_window_holds(
    gd, session, clock, db_backend
):
    # Other workers hold the head rows' workflows locked while they claim them (SKIP LOCKED).
    if db_backend != "postgresql":
        pytest.skip(
            "SQLite has one writer at a time; MariaDB's claim reads a fixed number of "
            "candidates without locks first (MYSQL_CLAIM_CANDIDATES)"
        )
    busy = _queued_one_second_apart(session, clock, BEYOND_THE_WINDOW)
    runnable, _later = _queued_one_second_apart(session, clock, 2)
    with gd.engine.connect() as other, other.begin():
        ids = ", ".join(str(workflow.id) for workflow in busy)
        locked = other.execute(
            text(f"SELECT id FROM geneva_drive_workflows WHERE id IN ({ids}) FOR UPDATE")
        ).all()
        assert len(locked) == BEYOND_THE_WINDOW

        claimed = _claim(gd, clock)

    assert claimed is not None
    assert claimed[1] == runnable.id


def test_a_claim_within_the_window_takes_the_first_claimable_row_and_locks_no_other(
    gd, session, clock, db_backend
):
    # The window's rows are tried one by one, in order, and the claim stops at the first:
    # a claim that locked every claimable row of its window would hold them from every other
    # worker until it commits.
    if db_backend != "postgresql":
        pytest.skip("row locks held by a claim are PostgreSQL's and MariaDB's; this is the window")
    first_paused, first, second, third = _queued_one_second_apart(session, clock, 4)
    first_paused.pause()
    session.commit()

    with Session(gd.engine) as claiming, claiming.begin():
        claimed = queries.claim_due_execution(claiming, clock.now(), claim_scope(None))
        assert claimed is not None and claimed[1] == first.id
        with gd.engine.connect() as other, other.begin():
            free = other.execute(
                text(
                    "SELECT id FROM geneva_drive_workflows WHERE id IN (:a, :b, :c) "
                    "ORDER BY id FOR UPDATE SKIP LOCKED"
                ),
                {"a": first.id, "b": second.id, "c": third.id},
            ).scalars()
            assert list(free) == [second.id, third.id]  # the claimed one alone is locked


def test_a_finishing_workflow_past_a_full_window_leaves_the_next_to_an_ordinary_claim(
    gd, session, clock, db_backend, engine: Engine
):
    paused = _paused_one_second_apart(session, clock, BEYOND_THE_WINDOW)
    runnable, next_one = _queued_one_second_apart(session, clock, 2)

    options = RunOptions(worker_id="test", chain=lambda queue: True)
    runs = 0
    while claim_and_run(claim_scope(None), options, gd):
        runs += 1

    # PostgreSQL's handover, which finishes a workflow and claims the next in one statement,
    # tries only the first window: its claim finds nothing there, the chain ends, and the
    # next ordinary claim goes past the paused rows. Elsewhere the finishing transaction's
    # claim is an ordinary one, and the chain goes on.
    assert runs == (2 if db_backend == "postgresql" else 1)
    assert trail(session, runnable) == THREE_DONE
    assert trail(session, next_one) == THREE_DONE
    assert {reload(session, workflow).state for workflow in paused} == {"paused"}
    assert {state for workflow in paused for _, state, _ in trail(session, workflow)} == {
        "scheduled"
    }


def test_behind_a_full_window_of_paused_rows_the_next_handovers_claim_past_it(
    gd, session, clock, db_backend
):
    _paused_one_second_apart(session, clock, BEYOND_THE_WINDOW)
    queued = _queued_one_second_apart(session, clock, 4)

    options = RunOptions(worker_id="test", chain=lambda queue: True)
    runs = 0
    while claim_and_run(claim_scope(None), options, gd):
        runs += 1

    # The first handover's claim, narrow, finds the paused rows and nothing else: the chain
    # ends, and the worker's ordinary claim takes the second workflow. Having found a row
    # where the handover found none, it makes the next handovers claim with every window,
    # and the third and the fourth workflows run in that same chain (four runs, without the
    # widening).
    assert runs == (2 if db_backend == "postgresql" else 1)
    assert [trail(session, workflow) for workflow in queued] == [THREE_DONE] * 4


def test_wide_handovers_run_out(gd, session, clock, db_backend):
    queued = _queued_one_second_apart(session, clock, 3)

    options = RunOptions(worker_id="test", chain=lambda queue: True)
    handovers_of(options).wide = 2
    while claim_and_run(claim_scope(None), options, gd):
        pass

    # Three handovers on PostgreSQL: two wide, then a narrow one that finds nothing due; the
    # ordinary claim after it finds nothing either, so nothing widens. Elsewhere there is no
    # handover.
    assert handovers_of(options).wide == (0 if db_backend == "postgresql" else 2)
    assert [trail(session, workflow) for workflow in queued] == [THREE_DONE] * 3


def test_the_next_due_time_passes_over_more_paused_workflows_than_the_window_holds(
    gd, session, clock
):
    # Paused workflows' rows are due in the past; an idle worker timing its sleep on them
    # would spin. What it waits for is the first row it could claim.
    _paused_one_second_apart(session, clock, BEYOND_THE_WINDOW)
    start = clock.now()
    clock.advance(hours=1)
    (later,) = _queued_one_second_apart(session, clock, 1)
    clock.set(start)

    with Session(gd.engine) as reading, reading.begin():
        due = queries.next_claimable_due_time(reading, claim_scope(None))

    (first,) = reload(session, later).execution_history
    assert due == first.scheduled_for == start + timedelta(hours=1)

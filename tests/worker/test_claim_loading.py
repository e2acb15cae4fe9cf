"""A worker's claim builds its two instances from one Core row; they behave as ORM-loaded ones.

A fresh session (every worker claim) skips the ORM's loading machinery; a session that
already holds instances lets the ORM refresh them in place.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import text
from sqlalchemy.orm import Session, reconstructor
from sqlalchemy.orm.attributes import instance_state

from geneva_drive import StepExecution, Workflow, step
from geneva_drive.core.states import ExecutionState
from geneva_drive.engine.executor import RunOptions, claim_and_run
from geneva_drive.storage import queries
from geneva_drive.storage.queries import claims
from tests.engine._support import history


class ClaimLoadsHooks(Workflow):
    may_proceed_without_hero = True
    seen: ClassVar[list[tuple[Any, ...]]] = []

    @reconstructor
    def _on_load(self) -> None:
        self.loaded_by_orm = True

    @step
    def first(self) -> None:
        ClaimLoadsHooks.seen.append(
            (
                getattr(self, "loaded_by_orm", False),
                type(self).__name__,
                self.state,
                self.current_step_name,
                self.session.is_modified(self),
                self.created_at,  # read back through the column types' result processors
            )
        )


def _core_claims() -> int:
    """How often a Core claim was looked up (PostgreSQL's windowed one, or the plain one)."""
    return sum(
        info.hits + info.misses
        for info in (claims._core_claim.cache_info(), claims._windowed_core_claim.cache_info())
    )


def _claim_and_run(gd: Any) -> bool:
    return claim_and_run(None, RunOptions(worker_id="test"), gd)


def test_a_claimed_workflow_is_its_own_class_loaded_clean_with_its_load_hooks_run(
    gd, session, db_backend
):
    ClaimLoadsHooks.seen.clear()
    wf = ClaimLoadsHooks.create(session)
    session.commit()
    before = _core_claims()

    assert _claim_and_run(gd)

    after = _core_claims()
    if db_backend != "mariadb":  # MariaDB claims candidates first, then loads them by the ORM
        assert after > before  # the Core claim was the one that ran
    assert ClaimLoadsHooks.seen == [
        (True, "ClaimLoadsHooks", "performing", "first", False, wf.created_at)
    ]
    assert wf.created_at.tzinfo is not None  # what the ORM loads; the claim must match it
    assert history(session, wf) == [("first", "completed", "success")]


def test_a_claimed_row_of_a_vanished_class_loads_as_the_base_workflow(gd, session):
    """The base class needs a hero and this row has none: it is canceled, not crashed on."""
    wf = ClaimLoadsHooks.create(session)
    session.commit()
    session.execute(
        text("UPDATE geneva_drive_workflows SET type = 'ClaimDeletedInADeploy' WHERE id = :id"),
        {"id": wf.id},
    )
    session.commit()

    assert _claim_and_run(gd)

    row = session.execute(
        text(
            "SELECT w.state, e.state AS e_state FROM geneva_drive_workflows w "
            "JOIN geneva_drive_step_executions e ON e.workflow_id = w.id WHERE w.id = :id"
        ),
        {"id": wf.id},
    ).one()
    assert (row.state, row.e_state) == ("canceled", "canceled")


def test_a_claim_in_a_session_holding_the_rows_refreshes_those_instances(
    gd, session, clock, db_backend
):
    wf = ClaimLoadsHooks.create(session)
    session.commit()
    execution = session.get(StepExecution, wf.current_execution.id)
    assert execution is not None
    # Another transaction changes the row behind this session's back.
    with Session(gd.engine) as other:
        other.execute(
            text("UPDATE geneva_drive_step_executions SET priority = 5 WHERE id = :id"),
            {"id": execution.id},
        )
        other.commit()
    session.commit()  # a new transaction, as a claim has (the instances stay in the session)

    claimed = queries.claim_due_execution(session, clock.now())

    assert claimed == (execution.id, wf.id)
    if db_backend == "mariadb":
        return  # its claim locks by id only; phase 1 then re-reads the rows
    assert execution.priority == 5  # the same object, refreshed in place
    assert execution.state == ExecutionState.SCHEDULED
    assert not instance_state(execution).modified
    session.rollback()

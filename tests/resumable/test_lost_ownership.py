"""A resumable step whose execution was recovered from under it stops committing."""

from __future__ import annotations

from sqlalchemy import func, select, update

from geneva_drive import StepExecution, Workflow, resumable_step
from geneva_drive.engine.executor import RunOptions, run_execution
from tests.support.app import AuditEntry


class LostOwnershipCopy(Workflow):
    may_proceed_without_hero = True

    @resumable_step
    def copy(self, it) -> None:
        for index in it.iterate_over(range(10)):
            if index == 3:
                # Another worker's lease recovery lands while we are still running.
                with self.session.bind.connect() as other:  # type: ignore[union-attr]
                    other.execute(
                        update(StepExecution)
                        .where(StepExecution.workflow_id == self.id)
                        .where(StepExecution.state == "in_progress")
                        .values(state="completed", outcome="recovered")
                    )
                    other.commit()
            self.session.add(AuditEntry(note=f"item {index}"))


def test_a_recovered_execution_commits_no_further_checkpoints(session, gd):
    wf = LostOwnershipCopy.create(session)
    session.commit()
    execution_id = wf.current_execution.id
    session.commit()

    run_execution(execution_id, options=RunOptions(worker_id="stalled-worker"))

    notes = session.execute(select(func.count()).select_from(AuditEntry)).scalar_one()
    assert notes == 3  # items 0-2 were checkpointed before the recovery; nothing after
    row = session.execute(
        select(StepExecution).where(StepExecution.id == execution_id)
    ).scalar_one()
    assert (row.state, row.outcome) == ("completed", "recovered")
    assert row.cursor_value == 3

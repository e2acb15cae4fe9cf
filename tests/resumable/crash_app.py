"""The app for the crash test: ``geneva-drive worker --app tests.resumable.crash_app``.

One resumable step copies every source row into a result row, with a checkpoint commit every
20 rows. With ``RESUMABLE_CRASH_HOLD_AT=n`` in the environment the step stops after ``n``
rows (flushed but not committed), logs a line and blocks reading stdin — the test kills the
worker there, so the kill lands at a known place without any sleeping.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from sqlalchemy import ForeignKey, insert, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from geneva_drive import Workflow, create_engine, resumable_step, step
from geneva_drive.engine.recovery import recover_execution
from geneva_drive.runtime.configure import configured

log = logging.getLogger("geneva_drive")

SOURCE_ROWS = 10_000
CHECKPOINT_EVERY = 20
HOLD_LINE = "resumable_crash_app: holding"
DONE_LINE = "resumable_crash_app: done"


class CrashBase(DeclarativeBase):
    pass


class CrashSource(CrashBase):
    __tablename__ = "resumable_crash_sources"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)


class CrashResult(CrashBase):
    __tablename__ = "resumable_crash_results"

    id: Mapped[int] = mapped_column(primary_key=True)
    source_id: Mapped[int] = mapped_column(ForeignKey("resumable_crash_sources.id"), index=True)


class ResumableCrashCopy(Workflow):
    may_proceed_without_hero = True

    @resumable_step(checkpoint_every=CHECKPOINT_EVERY)
    def copy(self, it: Any) -> None:
        hold_at = int(os.environ.get("RESUMABLE_CRASH_HOLD_AT", "0"))
        rows = it.iterate_over_records(select(CrashSource), batch_size=500)
        for done, source in enumerate(rows, start=1):
            self.session.add(CrashResult(source_id=source.id))
            if done == hold_at:
                self.session.flush()  # uncommitted rows in the open transaction
                log.info(
                    "%s after %d checkpoint commits", HOLD_LINE, it.iterations // CHECKPOINT_EVERY
                )
                sys.stdin.readline()  # blocks until the test kills this process

    @step
    def report(self) -> None:
        log.info(DONE_LINE)


def prepare(url: str) -> int:
    """Create the app tables, the source rows and the workflow; returns the workflow id."""
    engine = create_engine(url)
    CrashBase.metadata.create_all(engine)
    with configured(engine=engine), Session(engine) as session:
        session.execute(insert(CrashSource), [{"id": i} for i in range(1, SOURCE_ROWS + 1)])
        wf = ResumableCrashCopy.create(session)
        session.commit()
        workflow_id = wf.id
    engine.dispose()
    return workflow_id


def recover_orphan(url: str, execution_id: int) -> None:
    """Recover the dead worker's ``in_progress`` execution as housekeeping would (F.4)."""
    engine = create_engine(url)
    with configured(engine=engine), Session(engine) as session:
        assert recover_execution(session, execution_id, "reattempt", reason="crash test")
        session.commit()
    engine.dispose()

"""Workflows for worker-process tests: `geneva-drive worker --app tests.support.worker_app`."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from geneva_drive import Workflow, create_engine, step
from geneva_drive.runtime.configure import configured

log = logging.getLogger("geneva_drive")


class WorkerAppTwoSteps(Workflow):
    may_proceed_without_hero = True

    @step
    def first(self) -> None:
        pass

    @step
    def second(self) -> None:
        log.info("worker_app: finished")


def create_schema_and_workflow(url: str) -> None:
    engine = create_engine(url)
    with configured(engine=engine), Session(engine) as session:
        WorkerAppTwoSteps.create(session)
        session.commit()
    engine.dispose()

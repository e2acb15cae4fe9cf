"""Workflows for the worker-process test: `geneva-drive worker --app tests.async_steps.lane_app`.

Each step waits until ``IN_FLIGHT`` of them are in their bodies at the same moment — which only
happens when one worker process runs more of them at once than it has step threads — and then
says so on the worker's log.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.orm import Session

from geneva_drive import Workflow, create_engine, step
from geneva_drive.runtime.configure import configured

log = logging.getLogger("geneva_drive")

IN_FLIGHT = 30
_waiting = 0
_all_in: asyncio.Event | None = None


class LaneCallsAGateway(Workflow):
    may_proceed_without_hero = True

    @step
    async def call(self) -> None:
        global _waiting, _all_in
        if _all_in is None:
            _all_in = asyncio.Event()  # created on the worker's event loop
        _waiting += 1
        if _waiting == IN_FLIGHT:
            log.info("lane_app: %d steps in flight", _waiting)
            _all_in.set()
        await asyncio.wait_for(_all_in.wait(), timeout=60)

    @step
    def record(self) -> None:
        pass


def create_workflows(url: str) -> None:
    engine = create_engine(url)
    with configured(engine=engine), Session(engine) as session:
        for _ in range(IN_FLIGHT):
            LaneCallsAGateway.create(session)
        session.commit()
    engine.dispose()

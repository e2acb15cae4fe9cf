"""The process-wide shutdown request (gem-spec E.3 rule 3): every runner's resumable step stops at
its next checkpoint and leaves a successor; non-interruptible runs ignore it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

import geneva_drive
from geneva_drive import Workflow, resumable_step
from geneva_drive.engine.executor import RunOptions, run_execution
from geneva_drive.testing import perform_next_step, speedrun
from tests.engine._support import current, reload
from tests.resumable._support import chain, notes, start
from tests.support.app import AuditEntry

ITEMS = list(range(6))


class ShutdownRequestWalk(Workflow):
    """Writes one audit row per item; asks for a shutdown while doing item ``stop_at``."""

    stop_at: ClassVar[int | None] = None

    @resumable_step
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(ITEMS):
            self.session.add(AuditEntry(order_id=self.hero.id, note=f"item {item}"))
            if item == type(self).stop_at:
                geneva_drive.request_shutdown()  # e.g. a SIGTERM arriving mid-item


@pytest.fixture(autouse=True)
def _no_shutdown_request() -> Iterator[None]:
    geneva_drive.clear_shutdown_request()
    ShutdownRequestWalk.stop_at = None
    yield
    geneva_drive.clear_shutdown_request()
    ShutdownRequestWalk.stop_at = None


def test_run_execution_stops_a_resumable_step_at_the_checkpoint_after_a_shutdown_request(session):
    ShutdownRequestWalk.stop_at = 2
    wf, _ = start(session, ShutdownRequestWalk)

    run_execution(current(session, wf).id)

    first, successor = chain(session, wf, "walk")
    assert (first.state, first.outcome, first.cursor_value) == ("completed", "continued", 3)
    assert (successor.state, successor.cursor_value) == ("scheduled", 3)
    assert successor.continues_from_id == first.id
    assert reload(session, wf).state == "ready"
    assert notes(session) == ["item 0", "item 1", "item 2"]


def test_a_step_started_after_the_request_stops_at_its_first_checkpoint(session):
    wf, _ = start(session, ShutdownRequestWalk)
    geneva_drive.request_shutdown()

    perform_next_step(wf)

    assert [(e.outcome, e.cursor_value) for e in chain(session, wf, "walk")] == [
        ("continued", 1),
        (None, 1),
    ]
    assert notes(session) == ["item 0"]


def test_clearing_the_request_lets_the_successor_run_to_the_end(session):
    ShutdownRequestWalk.stop_at = 0
    wf, _ = start(session, ShutdownRequestWalk)
    perform_next_step(wf)
    ShutdownRequestWalk.stop_at = None

    assert geneva_drive.shutdown_requested()
    geneva_drive.clear_shutdown_request()
    assert not geneva_drive.shutdown_requested()
    perform_next_step(wf)

    assert [e.outcome for e in chain(session, wf, "walk")] == ["continued", "success"]
    assert notes(session) == [f"item {i}" for i in ITEMS]
    assert reload(session, wf).state == "finished"


def test_a_request_from_another_thread_reaches_the_running_step(session):
    wf, _ = start(session, ShutdownRequestWalk)
    asked = threading.Thread(target=geneva_drive.request_shutdown)

    def should_exit() -> bool:  # the runner's own check, at the first checkpoint: it says no,
        if asked.ident is None:  # but meanwhile another thread asks the process to stop
            asked.start()
            asked.join()
        return False

    run_execution(current(session, wf).id, options=RunOptions(should_exit=should_exit))

    # Seen at the next checkpoint.
    assert [(e.outcome, e.cursor_value) for e in chain(session, wf, "walk")] == [
        ("continued", 2),
        (None, 2),
    ]
    assert notes(session) == ["item 0", "item 1"]


def test_a_non_interruptible_run_ignores_the_request(session):
    wf, _ = start(session, ShutdownRequestWalk)
    geneva_drive.request_shutdown()

    speedrun(wf)

    assert [e.outcome for e in chain(session, wf, "walk")] == ["success"]
    assert notes(session) == [f"item {i}" for i in ITEMS]

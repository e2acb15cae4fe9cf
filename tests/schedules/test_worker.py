"""The worker's part: its maintenance thread creates due ticks' workflows, and costs nothing
when no class it loads has a schedule."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from geneva_drive.runtime import worker as worker_module
from geneva_drive.runtime.worker import Worker
from geneva_drive.storage.db import engine_for_workers
from tests.schedules import apps  # noqa: F401  (defines the scheduled classes)
from tests.support.statements import first_words

START = datetime(2030, 1, 1, 12, tzinfo=UTC)
FIRST_TICK = datetime(2030, 1, 2, 2, tzinfo=UTC)  # 03:00 in Berlin


def test_a_worker_creates_the_workflow_of_a_due_tick_of_a_class_it_loads(gd: Any, clock: Any):
    worker = Worker(config=gd, concurrency=1)
    clock.set(START)
    assert worker.run_schedules() == 0  # every scheduled class it loads gets its row
    clock.set(FIRST_TICK + timedelta(seconds=3))
    assert worker.run_schedules() >= 1  # NightlyBackfill, and any other class due now
    assert worker.run_schedules() == 0


def test_a_worker_whose_classes_have_no_schedule_sends_no_statement(
    gd: Any, clock: Any, monkeypatch: pytest.MonkeyPatch
):
    worker = Worker(config=gd, concurrency=1)
    monkeypatch.setattr(worker_module, "scheduled_classes", lambda: [])
    with first_words(engine_for_workers(gd.engine)) as seen:
        assert worker.run_schedules() == 0
    assert seen == []


def test_a_worker_leaves_the_schedules_of_classes_it_does_not_load(
    gd: Any, clock: Any, monkeypatch: pytest.MonkeyPatch
):
    worker = Worker(config=gd, concurrency=1)
    monkeypatch.setattr(worker, "scope", replace(worker.scope, workflow_types=("SomethingElse",)))
    with first_words(engine_for_workers(gd.engine)) as seen:
        assert worker.run_schedules() == 0
    assert seen == []

"""Schedules against the database: one workflow per tick, missed ticks, pause and resume,
daylight-saving nights, and racing workers — on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from geneva_drive import Workflow, admin
from geneva_drive.engine.schedules import run_due_schedules
from geneva_drive.storage.models import Base, ScheduleRow
from geneva_drive.testing import speedrun
from tests.schedules import apps
from tests.schedules.apps import EveryFifteenMinutes, HalfPastTwo, NightlyBackfill

WORKFLOWS_TABLE = Base.metadata.tables["geneva_drive_workflows"]
REPO = Path(__file__).resolve().parents[2]
BERLIN = ZoneInfo("Europe/Berlin")
START = datetime(2030, 1, 1, 12, tzinfo=UTC)
FIRST_TICK = datetime(2030, 1, 2, 2, tzinfo=UTC)  # 03:00 in Berlin (CET)


def _workflows(engine: sa.Engine, cls: type[Workflow]) -> list[tuple[int, datetime]]:
    with Session(engine) as session:
        rows = session.execute(
            sa.select(Workflow.id, Workflow.scheduled_tick)
            .where(Workflow.type == cls.__name__)
            .order_by(Workflow.id)
        ).all()
    return [(row.id, row.scheduled_tick) for row in rows]


def _row(engine: sa.Engine, cls: type[Workflow]) -> ScheduleRow:
    with Session(engine) as session:
        return session.get_one(ScheduleRow, cls.__name__)


def test_the_first_pass_records_the_next_tick_and_creates_nothing(gd: Any, clock: Any):
    clock.set(START)
    assert run_due_schedules(gd, [NightlyBackfill]) == []
    row = _row(gd.engine, NightlyBackfill)
    assert (row.next_tick, row.last_tick, row.paused) == (FIRST_TICK, None, False)
    assert (row.cron, row.timezone) == ("0 3 * * *", "Europe/Berlin")


def test_a_due_tick_creates_one_workflow_that_reads_its_tick(gd: Any, clock: Any, session: Any):
    clock.set(START)
    run_due_schedules(gd, [NightlyBackfill])
    clock.set(FIRST_TICK + timedelta(seconds=10))
    [created] = run_due_schedules(gd, [NightlyBackfill])
    assert run_due_schedules(gd, [NightlyBackfill]) == []  # the tick is done
    apps.RAN.clear()
    speedrun(session.get(NightlyBackfill, created.id))
    assert apps.RAN == [FIRST_TICK]
    assert _workflows(gd.engine, NightlyBackfill) == [(created.id, FIRST_TICK)]
    row = _row(gd.engine, NightlyBackfill)
    assert (row.last_tick, row.last_workflow_id) == (FIRST_TICK, created.id)
    assert row.next_tick == FIRST_TICK + timedelta(days=1)


def test_ticks_missed_while_no_worker_ran_create_one_workflow_for_the_newest(gd: Any, clock: Any):
    clock.set(START)
    run_due_schedules(gd, [NightlyBackfill])  # missed="run_once"
    clock.set(FIRST_TICK + timedelta(days=4, hours=5))  # five ticks passed
    [created] = run_due_schedules(gd, [NightlyBackfill])
    assert created.scheduled_tick == FIRST_TICK + timedelta(days=4)
    assert _row(gd.engine, NightlyBackfill).next_tick == FIRST_TICK + timedelta(days=5)


def test_ticks_missed_with_skip_create_nothing_and_only_the_next_future_tick_runs(
    gd: Any, clock: Any
):
    clock.set(datetime(2030, 1, 1, 0, 1, tzinfo=UTC))
    run_due_schedules(gd, [EveryFifteenMinutes])  # missed="skip"
    clock.set(datetime(2030, 1, 1, 5, 7, tzinfo=UTC))  # 20 ticks passed, the last 7 min ago
    assert run_due_schedules(gd, [EveryFifteenMinutes]) == []
    assert _row(gd.engine, EveryFifteenMinutes).next_tick == datetime(2030, 1, 1, 5, 15, tzinfo=UTC)
    clock.set(datetime(2030, 1, 1, 5, 15, 30, tzinfo=UTC))
    [created] = run_due_schedules(gd, [EveryFifteenMinutes])
    assert created.scheduled_tick == datetime(2030, 1, 1, 5, 15, tzinfo=UTC)


def test_a_paused_schedule_creates_nothing_and_resume_follows_missed(
    gd: Any, clock: Any, session: Session
):
    clock.set(START)
    run_due_schedules(gd, [NightlyBackfill, EveryFifteenMinutes])
    with session.begin():
        admin.pause_schedule(session, NightlyBackfill)
        admin.pause_schedule(session, "EveryFifteenMinutes")
    clock.set(FIRST_TICK + timedelta(days=2, hours=1, minutes=7))  # the last 15' tick: 7' ago
    assert run_due_schedules(gd, [NightlyBackfill, EveryFifteenMinutes]) == []
    with session.begin():
        admin.resume_schedule(session, NightlyBackfill)  # run_once: one, for the newest tick
        admin.resume_schedule(session, EveryFifteenMinutes)  # skip: none until the next one
    created = run_due_schedules(gd, [NightlyBackfill, EveryFifteenMinutes])
    assert [(type(w), w.scheduled_tick) for w in created] == [
        (NightlyBackfill, FIRST_TICK + timedelta(days=2))
    ]
    assert _row(gd.engine, EveryFifteenMinutes).next_tick == FIRST_TICK + timedelta(
        days=2, hours=1, minutes=15
    )


def test_the_tick_column_refuses_a_second_workflow_for_one_tick(gd: Any, clock: Any):
    clock.set(START)
    run_due_schedules(gd, [NightlyBackfill])
    clock.set(FIRST_TICK)
    [created] = run_due_schedules(gd, [NightlyBackfill])
    with pytest.raises(IntegrityError), gd.engine.begin() as conn:
        conn.execute(
            sa.insert(WORKFLOWS_TABLE).values(
                type="NightlyBackfill",
                state="ready",
                allow_multiple=True,
                scheduled_tick=created.scheduled_tick,
                created_at=FIRST_TICK,
                updated_at=FIRST_TICK,
            )
        )


def test_a_schedule_row_recreated_by_hand_does_not_run_a_tick_again(gd: Any, clock: Any):
    clock.set(START)
    run_due_schedules(gd, [NightlyBackfill])
    clock.set(FIRST_TICK)
    [created] = run_due_schedules(gd, [NightlyBackfill])
    with gd.engine.begin() as conn:  # an operator resets the row to the tick that ran
        conn.execute(
            sa.update(ScheduleRow)
            .values(next_tick=FIRST_TICK, last_tick=None)
            .execution_options(synchronize_session=False)
        )
    assert run_due_schedules(gd, [NightlyBackfill]) == []
    assert [w for w, _ in _workflows(gd.engine, NightlyBackfill)] == [created.id]


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        # Fall back, 25 Oct 2026: 02:30 happens twice and runs once, at the first one (CEST).
        (
            datetime(2026, 10, 24, 12, tzinfo=UTC),
            datetime(2026, 10, 26, 12, tzinfo=UTC),
            [
                datetime(2026, 10, 25, 2, 30, tzinfo=BERLIN, fold=0),
                datetime(2026, 10, 26, 2, 30, tzinfo=BERLIN),
            ],
        ),
        # Spring forward, 28 Mar 2027: 02:30 does not exist and runs at 03:00 CEST.
        (
            datetime(2027, 3, 27, 12, tzinfo=UTC),
            datetime(2027, 3, 29, 12, tzinfo=UTC),
            [
                datetime(2027, 3, 28, 3, 0, tzinfo=BERLIN),
                datetime(2027, 3, 29, 2, 30, tzinfo=BERLIN),
            ],
        ),
    ],
    ids=["fall-back", "spring-forward"],
)
def test_daylight_saving_nights_run_each_tick_once(
    gd: Any, clock: Any, start: datetime, end: datetime, expected: list[datetime]
):
    clock.set(start)
    while clock.now() < end:  # a worker looking every five minutes, through the night
        run_due_schedules(gd, [HalfPastTwo])
        clock.advance(minutes=5)
    assert [tick for _, tick in _workflows(gd.engine, HalfPastTwo)] == [
        e.astimezone(UTC) for e in expected
    ]


def test_concurrent_passes_for_one_tick_create_one_workflow(gd: Any, clock: Any):
    clock.set(START)
    run_due_schedules(gd, [NightlyBackfill])
    clock.set(FIRST_TICK + timedelta(seconds=1))
    racers = 6
    barrier = threading.Barrier(racers)
    created: list[int] = []
    errors: list[BaseException] = []

    def race() -> None:
        try:
            barrier.wait(timeout=60)
            created.append(len(run_due_schedules(gd, [NightlyBackfill])))
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=race) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert sorted(created) == [0] * (racers - 1) + [1]
    assert [tick for _, tick in _workflows(gd.engine, NightlyBackfill)] == [FIRST_TICK]


def test_worker_processes_racing_for_one_tick_create_one_workflow(
    gd: Any, clock: Any, installed_database_url: str
):
    clock.set(START)
    run_due_schedules(gd, [NightlyBackfill])
    at = (FIRST_TICK + timedelta(seconds=1)).isoformat()
    command = [sys.executable, "-m", "tests.schedules.race", installed_database_url, at]
    racers = [
        subprocess.Popen(
            command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    try:
        for racer in racers:
            assert racer.stdout is not None and racer.stdout.readline().strip() == "ready"
        for racer in racers:  # the start line, to all at once
            assert racer.stdin is not None
            racer.stdin.write("go\n")
            racer.stdin.flush()
        counts = []
        for racer in racers:
            out, _ = racer.communicate(timeout=120)
            assert racer.returncode == 0
            counts.append(int(out.strip()))
    finally:
        for racer in racers:
            if racer.poll() is None:
                racer.kill()
    assert sorted(counts) == [0, 0, 0, 1]
    assert [tick for _, tick in _workflows(gd.engine, NightlyBackfill)] == [FIRST_TICK]


def test_a_deploy_that_changes_the_expression_recomputes_the_next_tick(gd: Any, clock: Any):
    clock.set(START)
    run_due_schedules(gd, [NightlyBackfill])
    with gd.engine.begin() as conn:  # as written by an older version of the class
        conn.execute(
            sa.update(ScheduleRow)
            .values(cron="0 5 * * *", next_tick=datetime(2030, 1, 2, 4, tzinfo=UTC))
            .execution_options(synchronize_session=False)
        )
    assert run_due_schedules(gd, [NightlyBackfill]) == []
    row = _row(gd.engine, NightlyBackfill)
    assert (row.cron, row.next_tick) == ("0 3 * * *", FIRST_TICK)

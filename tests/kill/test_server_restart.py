"""Worker processes on PostgreSQL, steps in flight, and the server restarted or gone for 10 s.

Every workflow finishes, each step's database effect lands exactly once, nothing is left in
progress, and the steps the outage cut off are recovered within lease + heartbeat of the
server being back. Three real ``geneva-drive worker`` processes of two threads each; the
server is the kill tests' own (tests/kill/_server.py), restarted with ``pg_ctl``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

import geneva_drive
from geneva_drive import SystemClock
from geneva_drive.runtime.configure import configured
from tests.kill._server import RestartableServer
from tests.kill._support import Workers, rows, scalar
from tests.kill.apps import KillBase, KillCounted
from tests.support.postgres import PostgresServer, unique_database_name

pytestmark = pytest.mark.postgres

LEASE = 3.0
HEARTBEAT = LEASE / 3  # how often a worker renews its leases and recovers expired ones
WORKFLOWS = 40
STEPS = ("one", "two", "three")
# A loaded 2-core machine runs a worker's heartbeat late: what recovery may take beyond
# lease + heartbeat before we call it slow. Minutes (the stuck threshold) would be a failure.
SCHEDULING_SLACK = 3.0


@pytest.fixture(scope="module")
def server(postgres_server: PostgresServer) -> Iterator[RestartableServer]:
    # postgres_server only for its verdict: skipped (or failed in CI) when PostgreSQL is not.
    restartable = RestartableServer(PostgresServer.start())
    try:
        yield restartable
    finally:
        restartable.close()


@pytest.fixture
def url(server: RestartableServer) -> Iterator[str]:
    name = unique_database_name("gd_kill")
    url = server.server.create_database(name)
    engine = geneva_drive.create_engine(url)
    try:
        geneva_drive.install(engine)
        KillBase.metadata.create_all(engine)
    finally:
        engine.dispose()
    yield url
    if not server.running:
        server.start()
    server.server.drop_database(name)


@pytest.fixture
def workers(url: str, tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(url, tmp_path)
    try:
        yield pool
    finally:
        pool.kill_all()


def _in_progress(engine: sa.Engine) -> set[int]:
    sql = "SELECT id FROM geneva_drive_step_executions WHERE state = 'in_progress'"
    return {int(row[0]) for row in rows(engine, sql)}


def _effects(engine: sa.Engine) -> Counter[tuple[Any, ...]]:
    return Counter(rows(engine, "SELECT workflow_id, step_name FROM kill_effects"))


def _run(server: RestartableServer, url: str, workers: Workers, outage: float | None) -> None:
    # The test's own reads open a fresh connection each: none is left dead by the outage.
    engine = geneva_drive.create_engine(url, poolclass=NullPool)
    started = [workers.start("--concurrency", "2", "--lease", str(LEASE)) for _ in range(3)]
    workers.wait_started(*started)
    with configured(engine=engine, clock=SystemClock()), Session(engine) as session:
        ids = [int(KillCounted.create(session).id) for _ in range(WORKFLOWS)]
        session.commit()
    workers.wait_until(
        lambda: sum(_effects(engine).values()) >= 20 and len(_in_progress(engine)) >= 3,
        "work under way, with steps in flight",
    )
    in_flight = _in_progress(engine)

    if outage is None:
        server.restart_immediately()
    else:
        server.stop()
        time.sleep(outage)  # the outage itself: how long the database stays away
        server.start()
    back = time.monotonic()
    workers.wait_until(
        lambda: not (_in_progress(engine) & in_flight), "the steps cut off to be recovered"
    )
    recovered_after = time.monotonic() - back
    finished = "SELECT count(*) FROM geneva_drive_workflows WHERE state = 'finished'"
    workers.wait_until(lambda: scalar(engine, finished) == WORKFLOWS, "every workflow to finish")

    effects = _effects(engine)
    assert set(effects) == {(i, name) for i in ids for name in STEPS}
    assert set(effects.values()) == {1}, "a step's database effect landed more than once"
    assert _in_progress(engine) == set()
    assert recovered_after <= LEASE + HEARTBEAT + SCHEDULING_SLACK, recovered_after
    for process in started:
        assert process.poll() is None, workers.logs()  # they rode it out
        assert workers.stop(process) == 0, workers.logs()
    engine.dispose()


def test_workers_ride_out_an_immediate_server_restart_mid_run(server, url, workers):
    _run(server, url, workers, outage=None)


def test_workers_ride_out_a_ten_second_outage_mid_run(server, url, workers):
    _run(server, url, workers, outage=10.0)

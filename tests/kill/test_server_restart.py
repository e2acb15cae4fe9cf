"""Worker processes on PostgreSQL, steps in flight, and the server restarted or gone for 10 s.

Every workflow finishes, each step's database effect lands exactly once, nothing is left in
progress, and the steps the outage cut off are recovered within lease + heartbeat of the
server being back. Three real ``geneva-drive worker`` processes of two threads each; the
server is the kill tests' own (tests/kill/_server.py), restarted with ``pg_ctl``.
"""

from __future__ import annotations

import functools
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
from tests.kill.apps import KillBase, KillCounted, KillMixed
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


def _under_way(engine: sa.Engine, effects: int, in_flight: int) -> bool:
    return sum(_effects(engine).values()) >= effects and len(_in_progress(engine)) >= in_flight


def _recovered(engine: sa.Engine, cut_off: set[int]) -> bool:
    return not (_in_progress(engine) & cut_off)


def _run(
    server: RestartableServer,
    url: str,
    workers: Workers,
    outage: float | None,
    *,
    workflows: int = WORKFLOWS,
    restart_after: tuple[int, ...] = (20,),
    step_seconds: float = 0.2,
    in_flight: int = 3,
    workflow_class: type[KillCounted] | type[KillMixed] = KillCounted,
) -> None:
    """``workflows`` three-step workflows on a backlog; after each count of step effects in
    ``restart_after`` (with at least ``in_flight`` steps in progress), the server restarts
    (or goes away for ``outage`` seconds)."""
    # The test's own reads open a fresh connection each: none is left dead by the outage.
    engine = geneva_drive.create_engine(url, poolclass=NullPool)
    env = {"GD_KILL_STEP_SECONDS": str(step_seconds)}
    started = [workers.start("--concurrency", "2", "--lease", str(LEASE), **env) for _ in range(3)]
    workers.wait_started(*started)
    with configured(engine=engine, clock=SystemClock()), Session(engine) as session:
        started_many = workflow_class.create_many(session, count=workflows, allow_multiple=True)
        ids = started_many.workflow_ids
        session.commit()
    recovered_after = []
    for effects_before in restart_after:
        workers.wait_until(
            functools.partial(_under_way, engine, effects_before, in_flight),
            f"{effects_before} step effects, with steps in flight",
        )
        cut_off = _in_progress(engine)
        if outage is None:
            server.restart_immediately()
        else:
            server.stop()
            time.sleep(outage)  # the outage itself: how long the database stays away
            server.start()
        back = time.monotonic()
        workers.wait_until(
            functools.partial(_recovered, engine, cut_off), "the steps cut off to be recovered"
        )
        recovered_after.append(time.monotonic() - back)
    finished = "SELECT count(*) FROM geneva_drive_workflows WHERE state = 'finished'"
    workers.wait_until(lambda: scalar(engine, finished) == workflows, "every workflow to finish")

    effects = _effects(engine)
    written = [name for name in STEPS if workflow_class is KillCounted or name != "two"]
    assert set(effects) == {(i, name) for i in ids for name in written}
    assert set(effects.values()) == {1}, "a step's database effect landed more than once"
    assert _in_progress(engine) == set()
    assert max(recovered_after) <= LEASE + HEARTBEAT + SCHEDULING_SLACK, recovered_after
    for process in started:
        assert process.poll() is None, workers.logs()  # they rode it out
        assert workers.stop(process) == 0, workers.logs()
    engine.dispose()


def test_workers_ride_out_an_immediate_server_restart_mid_run(server, url, workers):
    _run(server, url, workers, outage=None)


def test_workers_ride_out_a_ten_second_outage_mid_run(server, url, workers):
    _run(server, url, workers, outage=10.0)


@pytest.mark.parametrize("workflow_class", [KillCounted, KillMixed])
def test_fast_chained_steps_ride_out_restarts_at_several_moments(
    server, url, workers, workflow_class
):
    # Steps of a few milliseconds: most of a worker's time goes to phase 3 and the chained
    # start of the next step in one commit, so the restarts land there — the hand-back paths
    # (chained completion, handover, the general path) rather than step bodies. KillMixed's
    # middle step writes nothing: its completion and the next start are one statement.
    _run(
        server,
        url,
        workers,
        outage=None,
        workflows=600,
        restart_after=(100, 500, 900),
        step_seconds=0.005,
        in_flight=1,
        workflow_class=workflow_class,
    )

"""A worker and a database that goes away: waited for at startup, retried quietly while running.

The database sits behind a TCP proxy (tests/worker/_outage.py) that the test cuts and restores:
to the worker that is a server restart, every connection dropped and new ones refused.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.orm import Session

from geneva_drive import DatabaseBackend, SystemClock, create_engine
from geneva_drive.runtime.configure import configured
from geneva_drive.runtime.worker import Worker
from tests.support.postgres import unique_database_name
from tests.worker._outage import DatabaseProxy
from tests.worker._support import finished, wait_until_true
from tests.worker.apps import WorkerScaleThreeSteps

pytestmark = pytest.mark.postgres


@pytest.fixture
def proxied(postgres_server: Any, _postgres_template: str) -> Iterator[tuple[Any, Any]]:
    """(proxy, engine straight to the server) for a fresh installed database."""
    name = unique_database_name()
    direct_url = postgres_server.create_database(name, template=_postgres_template)
    proxy = DatabaseProxy(postgres_server.socket_dir)
    proxy.database = name  # type: ignore[attr-defined]
    direct = create_engine(direct_url)
    try:
        yield proxy, direct
    finally:
        proxy.cut()
        direct.dispose()
        postgres_server.drop_database(name)


def _create(engine: Any) -> int:
    with Session(engine) as session:
        wf = WorkerScaleThreeSteps.create(session)
        session.commit()
        return int(wf.id)


def _start(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    return thread


def _messages(caplog: Any, level: int, needle: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("geneva_drive") and r.levelno == level and needle in r.getMessage()
    ]


def test_a_worker_started_while_the_database_is_down_waits_for_it_then_runs(proxied, caplog):
    proxy, direct = proxied
    workflow_id = _create(direct)  # the proxy is not listening yet: its port refuses
    engine = create_engine(proxy.url(proxy.database))
    with (
        caplog.at_level(logging.INFO),
        configured(engine=engine, clock=SystemClock(), backend=DatabaseBackend()) as gd,
    ):
        worker = Worker(config=gd, concurrency=1, poll_interval=0.05, startup_wait=120)
        thread = _start(worker)
        try:
            wait_until_true(
                lambda: bool(_messages(caplog, logging.WARNING, "unreachable")),
                "the worker to say it is waiting for the database",
            )
            assert worker.steps_run == 0
            proxy.restore()
            wait_until_true(finished(gd, workflow_id), "the workflow to finish")
        finally:
            worker.stop()
            thread.join(timeout=60)
        engine.dispose()
    (waiting,) = _messages(caplog, logging.WARNING, "unreachable")
    assert f"127.0.0.1:{proxy.port}" in waiting and "retrying for up to 120 s" in waiting


def test_an_outage_while_running_is_one_line_each_way_and_the_worker_carries_on(proxied, caplog):
    proxy, _ = proxied
    proxy.restore()
    engine = create_engine(proxy.url(proxy.database))
    with (
        caplog.at_level(logging.INFO),
        configured(engine=engine, clock=SystemClock(), backend=DatabaseBackend()) as gd,
    ):
        worker = Worker(config=gd, concurrency=2, poll_interval=0.05, lease=3)
        thread = _start(worker)
        try:
            wait_until_true(finished(gd, _create(engine)), "the first workflow to finish")
            proxy.cut()
            wait_until_true(lambda: worker.outages.ongoing, "the worker to notice the outage")
            # Several failed attempts (every thread's, the heartbeat's, LISTEN's), said once.
            wait_until_true(lambda: worker.outages.failures >= 5, "a few failed attempts")
            proxy.restore()
            after = _create(engine)
            wait_until_true(finished(gd, after), "a workflow created after the outage to finish")
            wait_until_true(lambda: not worker.outages.ongoing, "the worker to say it is back")
        finally:
            worker.stop()
            thread.join(timeout=60)
        engine.dispose()
    assert len(_messages(caplog, logging.WARNING, "database unavailable")) == 1
    assert len(_messages(caplog, logging.INFO, "database is back after")) == 1
    tracebacks = [r for r in caplog.records if r.name.startswith("geneva_drive") and r.exc_info]
    assert tracebacks == []
    assert worker.outages.count == 1


def test_an_attempt_begun_before_the_database_came_back_that_fails_late_is_no_new_outage(caplog):
    # Thread A's claim starts during the outage on a dead connection; thread B sees the
    # database back; A's attempt then fails. That is the old outage's tail: one line each way.
    from geneva_drive.runtime.startup import Outages

    outages = Outages(logging.getLogger("geneva_drive.test_outages"))
    error = ConnectionError("server closed the connection unexpectedly")
    with caplog.at_level(logging.INFO, logger="geneva_drive.test_outages"):
        outages.failed(error, started=0.0)
        begun_during_outage = time.monotonic()
        outages.ok()
        outages.failed(error, started=begun_during_outage)
        assert not outages.ongoing
        outages.failed(error, started=time.monotonic())  # begun after: a new outage
    assert outages.count == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2


def test_a_success_of_an_attempt_begun_before_the_outage_does_not_end_it(caplog):
    # A claim in flight on a connection the cut has not reached yet finishes fine after
    # another thread's failure started the outage: that is no sign the database is back.
    from geneva_drive.runtime.startup import Outages

    outages = Outages(logging.getLogger("geneva_drive.test_outages"))
    begun_before = time.monotonic()
    with caplog.at_level(logging.INFO, logger="geneva_drive.test_outages"):
        outages.failed(ConnectionError("server closed the connection unexpectedly"))
        outages.ok(started=begun_before)
        assert outages.ongoing
        outages.ok(started=time.monotonic())  # a retry begun during the outage succeeds
    assert not outages.ongoing
    assert [r.getMessage().split(" after")[0] for r in caplog.records if r.levelno == 20] == [
        "database is back"
    ]

"""The worker and its connection pool: a pool that fits its threads, a heartbeat that never
waits for a connection, renewal intervals that fit the lease."""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import ClassVar

import pytest
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import QueuePool

import geneva_drive
from geneva_drive import Workflow, step
from geneva_drive.cli.options import engine as cli_engine
from geneva_drive.engine import leases
from geneva_drive.runtime.pool import connections_needed
from geneva_drive.runtime.worker import Worker
from tests.worker._support import DEADLINE, wait_until_true


class PoolGatedStep(Workflow):
    may_proceed_without_hero = True
    gate: ClassVar[threading.Event] = threading.Event()
    entered: ClassVar[threading.Event] = threading.Event()

    @step
    def gated(self) -> None:
        type(self).entered.set()
        assert type(self).gate.wait(DEADLINE)


def _small(gd, **pool):
    """``gd`` on an engine of its own with the given pool arguments."""
    small = geneva_drive.create_engine(gd.engine.url, **pool)
    return dataclasses.replace(gd, engine=small)


def test_a_worker_refuses_a_pool_smaller_than_its_threads_need(gd):
    config = _small(gd, pool_size=2, max_overflow=0)
    try:
        with pytest.raises(ValueError) as refused:
            Worker(config=config, concurrency=4)
    finally:
        config.engine.dispose()
    message = str(refused.value)
    assert "concurrency=4" in message
    assert "at most 2 connection(s)" in message
    assert f"needs {connections_needed(4, listen=Worker(config=gd).listen)}" in message
    assert "pool_size=" in message


def test_a_heartbeat_interval_longer_than_a_third_of_the_lease_is_refused(gd):
    with pytest.raises(ValueError, match=r"heartbeat_interval=2, lease=3\).*lease / 3 = 1.0s"):
        Worker(config=gd, lease=3, heartbeat_interval=2)
    with pytest.raises(ValueError, match="heartbeat_interval=0"):
        Worker(config=gd, lease=3, heartbeat_interval=0)
    assert Worker(config=gd, lease=3, heartbeat_interval=1).heartbeat_interval.total_seconds() == 1


def test_the_cli_sizes_a_workers_pool_for_its_threads(gd):
    url = gd.engine.url.render_as_string(hide_password=False)
    built = cli_engine(url, worker=True, worker_threads=16)
    try:
        needed = connections_needed(16, listen=Worker(config=gd).listen)
        pool = built.pool
        assert not isinstance(pool, QueuePool) or pool.size() >= needed
    finally:
        built.dispose()


def test_the_heartbeat_renews_while_every_other_connection_is_taken(gd, session, monkeypatch):
    # The step threads (and, here, the test) hold every connection the pool has: the
    # heartbeat still renews, on the connection it reserved when the worker started. Before,
    # it queued for a connection until the pool's timeout and the leases ran out.
    config = _small(
        gd, pool_size=connections_needed(1, listen=True), max_overflow=0, pool_timeout=0.2
    )
    renewed = threading.Event()
    real_renew = leases.renew

    def renew(*args, **kwargs):
        count = real_renew(*args, **kwargs)
        if count:
            renewed.set()
        return count

    monkeypatch.setattr(leases, "renew", renew)
    PoolGatedStep.gate.clear()
    PoolGatedStep.entered.clear()
    PoolGatedStep.create(session)
    session.commit()
    worker = Worker(
        config=config, concurrency=1, lease=3, heartbeat_interval=0.05, poll_interval=0.05
    )
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    held = []
    thread.start()
    try:
        assert PoolGatedStep.entered.wait(DEADLINE)
        while True:  # take every connection the pool still hands out
            try:
                held.append(config.engine.connect())
            except PoolTimeout:
                break
        renewed.clear()
        wait_until_true(renewed.is_set, "a lease renewal while the pool is exhausted")
    finally:
        for connection in held:
            connection.close()
        PoolGatedStep.gate.set()
        worker.stop()
        thread.join(DEADLINE)
        config.engine.dispose()


def test_a_failed_renewal_names_the_executions_whose_leases_are_at_risk(gd, caplog, monkeypatch):
    worker = Worker(config=gd, concurrency=1, lease=3, heartbeat_interval=1)
    worker.running._by_thread[threading.get_ident()] = 4242  # a step this thread runs

    def broken(*_args, **_kwargs):
        raise RuntimeError("renewal broke")

    monkeypatch.setattr(leases, "renew", broken)
    with (
        caplog.at_level(logging.WARNING, logger="geneva_drive.worker"),
        pytest.raises(RuntimeError, match="renewal broke"),
    ):
        worker.heartbeat()
    [record] = [r for r in caplog.records if "lease renewal failed" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "4242" in record.getMessage()


def test_a_worker_built_on_a_user_s_configured_engine_checks_its_pool(gd):
    # configure() cannot know how many threads will run steps; the Worker built from the
    # settings does, and refuses the application's own too-small engine the same way.
    from geneva_drive.runtime.configure import configured

    small = geneva_drive.create_engine(gd.engine.url, pool_size=3, max_overflow=0)
    try:
        with configured(engine=small), pytest.raises(ValueError, match="at most 3 connection"):
            Worker(concurrency=8)
    finally:
        small.dispose()

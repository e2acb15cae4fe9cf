"""Every error the worker logs carries its exception (``exc_info``), at each logging site.

A record logged with ``log.exception`` after its ``except`` block has ended carries
"NoneType: None" instead of the traceback (issue 41 found the claim loop's doing so); each
site here gets an injected error and the test checks the record holds that very error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from geneva_drive.core.errors import WorkerCrashed
from geneva_drive.runtime import housekeeping
from geneva_drive.runtime.worker import Worker
from geneva_drive.storage import queries
from tests.worker._support import DEADLINE
from tests.worker.apps import WorkerScaleThreeSteps  # noqa: F401  (a class to claim)

# Injected where each site catches: (what to patch, the message the record starts with).
SITES: dict[str, tuple[Callable[[Worker, Any, Callable[[], Any]], None], str]] = {
    "heartbeat": (
        lambda worker, monkeypatch, fail: monkeypatch.setattr(worker, "heartbeat", fail),
        "worker maintenance (fail) failed",
    ),
    "lease recovery": (
        lambda worker, monkeypatch, fail: monkeypatch.setattr(
            worker, "recover_expired_leases", fail
        ),
        "worker maintenance (fail) failed",
    ),
    "housekeeping": (
        lambda worker, monkeypatch, fail: monkeypatch.setattr(
            housekeeping, "run_exclusive", lambda config: fail()
        ),
        "housekeeping failed",
    ),
    "idle survey": (
        # Not the survey run() makes before the threads start: the idle threads' ones.
        lambda worker, monkeypatch, fail: monkeypatch.setattr(
            worker, "_survey", lambda force=False: None if force else fail()
        ),
        "worker loop error",
    ),
}


@pytest.mark.parametrize("site", sorted(SITES))
def test_each_logged_error_carries_its_exception(gd, monkeypatch, caplog, site):
    patch, message = SITES[site]
    worker = Worker(
        config=gd,
        concurrency=1,
        poll_interval=0.05,
        lease=0.3,  # a heartbeat every 0.1 s
        housekeeping_interval=0.1,
        listen=False,
    )
    injected = RuntimeError(f"injected failure at the {site}")
    calls: list[int] = []

    def fail(*_args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise injected
        return 0

    patch(worker, monkeypatch, fail)

    def logged() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith(message)]

    with caplog.at_level(logging.WARNING, logger="geneva_drive"):
        # The deadline is the way out if the record never comes (the assertion then fails).
        deadline = time.monotonic() + DEADLINE
        worker.run(
            until=lambda: bool(logged()) or time.monotonic() > deadline, install_signals=False
        )

    [record] = logged()
    assert record.exc_info is not None and record.exc_info[1] is injected


def test_a_failed_listen_connection_logs_its_exception(gd, db_backend, monkeypatch, caplog):
    if db_backend != "postgresql":
        pytest.skip("LISTEN is PostgreSQL's")
    injected = RuntimeError("injected failure of LISTEN")
    calls: list[int] = []

    def listen_statement() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise injected
        return real()

    real = queries.listen_statement
    monkeypatch.setattr(queries, "listen_statement", listen_statement)
    worker = Worker(config=gd, concurrency=1, poll_interval=0.05)
    assert worker.listen

    def logged() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith("LISTEN connection failed")]

    with caplog.at_level(logging.WARNING, logger="geneva_drive"):
        deadline = time.monotonic() + DEADLINE
        worker.run(
            until=lambda: (bool(logged()) and worker.listening) or time.monotonic() > deadline,
            install_signals=False,
        )

    [record] = logged()
    assert record.exc_info is not None and record.exc_info[1] is injected


def test_a_dead_worker_thread_logs_its_exception_and_the_worker_says_so(gd, monkeypatch, caplog):
    injected = RuntimeError("injected failure outside any step")

    def die(*_args: Any) -> Any:
        raise injected

    worker = Worker(config=gd, concurrency=1, poll_interval=0.05, listen=False)
    monkeypatch.setattr(worker.running, "finished", die)  # after each claim, outside any step
    with caplog.at_level(logging.WARNING, logger="geneva_drive"), pytest.raises(WorkerCrashed):
        worker.run(install_signals=False)

    [record] = [r for r in caplog.records if r.getMessage().startswith("worker thread")]
    assert record.levelno == logging.CRITICAL
    assert record.exc_info is not None and record.exc_info[1] is injected

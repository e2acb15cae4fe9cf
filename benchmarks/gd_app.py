"""The geneva-drive workflows the benchmarks run (``geneva-drive worker --app gd_app``).

The worker subprocesses run with ``benchmarks/`` as their working directory, so this module
imports as ``gd_app`` there and in the scripts beside it.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import BigInteger, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from geneva_drive import ConcurrencyLimit, Workflow, resumable_step, step

# The wait of BenchWaited's second step; latency.py measures start − scheduled_for.
WAIT_SECONDS = 0.2
RESUMABLE_BATCH = 1000


# Body-level trace, for the step gap as a user sees it: the time from one step's body
# returning to the next step's body starting (database stamps cannot show it once a next step
# is started in the transaction that completes its predecessor). With GD_BENCH_TRACE set, each
# process appends (workflow id, step, body start, body end) in epoch seconds and writes them,
# one JSON list per line, to "$GD_BENCH_TRACE.<pid>" when it exits.
TRACE: list[tuple[int, str, float, float]] = []
_TRACE_PATH = os.environ.get("GD_BENCH_TRACE")
if _TRACE_PATH:

    def _write_trace() -> None:
        with open(f"{_TRACE_PATH}.{os.getpid()}", "w") as out:
            out.writelines(json.dumps(entry) + "\n" for entry in TRACE)

    atexit.register(_write_trace)


# The connection pool's peak: with GD_BENCH_POOL set, each process counts the connections its
# pools have checked out at once (every pool, the heartbeat's and LISTEN's included) and
# writes {"peak_checkouts": n} to "$GD_BENCH_POOL.<pid>" when it exits.
_POOL_PATH = os.environ.get("GD_BENCH_POOL")
if _POOL_PATH:
    import threading

    from sqlalchemy import event
    from sqlalchemy.pool import Pool

    _pool_lock = threading.Lock()  # checkouts and checkins come from every step thread
    _pool_now = [0, 0]  # checked out now, the most at once

    @event.listens_for(Pool, "checkout")
    def _out(*_: Any) -> None:
        with _pool_lock:
            _pool_now[0] += 1
            _pool_now[1] = max(_pool_now)

    @event.listens_for(Pool, "checkin")
    def _in(*_: Any) -> None:
        with _pool_lock:
            _pool_now[0] -= 1

    def _write_pool_peak() -> None:
        with open(f"{_POOL_PATH}.{os.getpid()}", "w") as out:
            out.write(json.dumps({"peak_checkouts": _pool_now[1]}))

    atexit.register(_write_pool_peak)


class BenchThreeSteps(Workflow):
    """Three no-op steps: the throughput and step-gap workload (same as the peers')."""

    may_proceed_without_hero = True

    def around_step_execution(self, execution: Any, proceed: Callable[[], Any]) -> Any:
        started = time.time()
        try:
            return proceed()
        finally:
            TRACE.append((self.id, execution.step_name, started, time.time()))

    @step
    def one(self) -> None:
        pass

    @step
    def two(self) -> None:
        pass

    @step
    def three(self) -> None:
        pass


# limits.py: the same three no-op steps under a class-level concurrency limit (one global key).
class BenchLimitNeverBinds(BenchThreeSteps):
    concurrency = ConcurrencyLimit(1000)


class BenchLimit8(BenchThreeSteps):
    concurrency = ConcurrencyLimit(8)


class BenchLimit1(BenchThreeSteps):
    concurrency = ConcurrencyLimit(1)


class BenchWaited(Workflow):
    may_proceed_without_hero = True

    @step
    def first(self) -> None:
        pass

    @step(wait=timedelta(seconds=WAIT_SECONDS))
    def after_wait(self) -> None:
        pass


class BenchSignaled(Workflow):
    may_proceed_without_hero = True

    @step
    def first(self) -> None:
        pass

    @step(wait_for="go")
    def woken(self) -> None:
        pass


class _ItemsBase(DeclarativeBase):
    pass


class BenchItem(_ItemsBase):
    """The rows resumable.py walks over (created with ``BenchItem.__table__.create``)."""

    __tablename__ = "bench_items"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    payload: Mapped[str] = mapped_column(String(64))


ITEMS = select(BenchItem)


class BenchResumablePerItem(Workflow):
    """A checkpoint — a commit of the cursor — after every item."""

    may_proceed_without_hero = True

    @resumable_step(max_runtime=timedelta(hours=2))
    def walk(self, it) -> None:  # type: ignore[no-untyped-def]
        for _item in it.iterate_over_records(ITEMS, batch_size=RESUMABLE_BATCH):
            pass


class BenchResumableEvery(Workflow):
    """Items one by one, a commit every ``RESUMABLE_BATCH`` checkpoints (checkpoint_every)."""

    may_proceed_without_hero = True

    @resumable_step(max_runtime=timedelta(hours=2), checkpoint_every=RESUMABLE_BATCH)
    def walk(self, it) -> None:  # type: ignore[no-untyped-def]
        for _item in it.iterate_over_records(ITEMS, batch_size=RESUMABLE_BATCH):
            pass


class BenchResumableBatches(Workflow):
    """Whole pages: one checkpoint per batch of ``RESUMABLE_BATCH`` rows."""

    may_proceed_without_hero = True

    @resumable_step(max_runtime=timedelta(hours=2))
    def walk(self, it) -> None:  # type: ignore[no-untyped-def]
        for _batch in it.iterate_over_batches(ITEMS, batch_size=RESUMABLE_BATCH):
            pass

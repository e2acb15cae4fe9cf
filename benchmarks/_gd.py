"""geneva-drive side of the benchmarks: schema, seeding, running workers, reading executions."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from _common import BENCH_DIR, REPO, log, tree_gauges
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import geneva_drive
from geneva_drive.core.settings import Settings
from geneva_drive.engine.executor import RunOptions, claim_and_run
from geneva_drive.runtime.configure import configure
from geneva_drive.runtime.loaded import claim_scope
from geneva_drive.runtime.worker import Worker

# Seconds between "are we done?" polls: the same 20 ms as the Celery script's, so neither side
# gains up to a poll interval at the end. Each poll is one read-only transaction (rolled back,
# so never in the commit counts).
POLL = 0.02


def prepare(url: str) -> tuple[Engine, Settings]:
    engine = geneva_drive.create_engine(url, pool_size=20, max_overflow=20)
    geneva_drive.install(engine)
    return engine, configure(engine=engine)


def seed(config: Settings, cls: type, count: int, batch: int = 500) -> None:
    """Create ``count`` workflows of ``cls`` (no worker running yet), ``batch`` per commit."""
    made = 0
    while made < count:
        with Session(config.require_engine()) as session:
            for _ in range(min(batch, count - made)):
                cls.create(session)
            session.commit()
        made += min(batch, count - made)


def drain_with_one_step_thread(config: Settings, worker_id: str) -> None:
    """Run every due step in this thread, as one of a worker's step threads does (chaining
    on), until nothing is left to claim: what instructions.py and server_instructions.py
    count."""
    scope = claim_scope(None)
    options = RunOptions(worker_id=worker_id, chain=lambda queue: True)
    while claim_and_run(scope, options, config):
        pass


class Driver(threading.Thread):
    """Throughput mode's driver: ``count`` workflows of ``cls``, one transaction each, as a
    web application starts them. ``cpu_s``: this thread's CPU (``time.thread_time``)."""

    def __init__(self, config: Settings, cls: type, count: int) -> None:
        super().__init__(name="bench-driver", daemon=True)
        self.config, self.cls, self.count = config, cls, count
        self.cpu_s = self.seconds = 0.0

    def run(self) -> None:
        cpu0, t0 = time.thread_time(), time.perf_counter()
        with Session(self.config.require_engine()) as session:
            for _ in range(self.count):
                self.cls.create(session)
                session.commit()
        self.cpu_s, self.seconds = time.thread_time() - cpu0, time.perf_counter() - t0


def poll_engine(engine: Engine) -> Engine:
    """The "are we done?" polls' own engine: one connection, apart from the measured system's.

    A poll is a read-only transaction that rolls back, and psycopg forgets every statement it
    has prepared on a connection when that connection rolls back (``DEALLOCATE ALL``). Sharing
    the pool of the driver, the polls had the driver's ``create()`` re-plan its statement on
    about three starts in four (``pg_stat_statements``: 1,543 plans in 2,000 calls).
    """
    return geneva_drive.create_engine(engine.url, pool_size=1, max_overflow=0)


def finished_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM geneva_drive_workflows WHERE state = 'finished'")
            ).scalar_one()
        )


# Whether any workflow is not yet finished: the first one the state index finds. Counting the
# finished ones instead reads every finished workflow at every poll (931 buffers per poll at
# 2,000 workflows in throughput mode, 2 % of the server's CPU per step), a cost no peer's poll
# has (Celery's reads a Redis counter, the bare loop's an in-process one). PostgreSQL: with a
# backlog's statistics (every workflow ready) the planner would scan the table, so the poll's
# own transaction turns sequential scans off.
_ANY_UNFINISHED = text(
    "SELECT 1 FROM geneva_drive_workflows WHERE state IN ('ready', 'performing', 'paused') LIMIT 1"
)


def done(engine: Engine, total: int, all_created: Callable[[], bool] | None = None) -> bool:
    """Whether ``total`` workflows have finished: a look for one unfinished first, and the count
    of the finished ones only to confirm (``all_created``: whether the driver is done)."""
    if all_created is not None and not all_created():
        return False
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SET LOCAL enable_seqscan = off"))
        if conn.execute(_ANY_UNFINISHED).first() is not None:
            return False
    return finished_count(engine) >= total


@dataclass
class Run:
    started: float  # time.time() when workers began
    seconds: float  # wall time until the last workflow finished
    polls: int  # "are we done?" polls (on an engine of their own, see poll_engine)
    gauges: list[dict[str, float]] = field(default_factory=list)


def run_in_process(
    config: Settings, total: int, concurrency: int | None, timeout: float = 600
) -> Run:
    """Run ``geneva_drive.worker.Worker`` on a thread of this process until ``total`` finish."""
    worker = Worker(config=config, concurrency=concurrency, poll_interval=1.0)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    polls = 0
    started = time.time()
    t0 = time.perf_counter()
    thread.start()
    polling = poll_engine(config.require_engine())
    deadline = t0 + timeout
    try:
        while True:
            polls += 1
            if done(polling, total):
                break
            if time.perf_counter() > deadline:
                worker.stop()
                raise TimeoutError(f"in-process worker: not done after {timeout}s")
            time.sleep(POLL)
    finally:
        polling.dispose()
    seconds = time.perf_counter() - t0
    worker.stop()
    thread.join(30)
    return Run(started, seconds, polls)


def worker_command(url: str, concurrency: int | None, app: str = "gd_app") -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "geneva_drive.cli",
        "worker",
        "--database-url",
        url,
        "--app",
        app,
        "--poll-interval",
        "1.0",
    ]
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency)]
    return argv


def start_worker_processes(
    url: str, count: int, concurrency: int | None, app: str = "gd_app"
) -> tuple[list[subprocess.Popen], float]:
    """Start ``count`` ``geneva-drive worker`` processes and wait until each has started.

    Returns once every worker has logged its ``started:`` line, with the ``perf_counter()`` of
    the first such line: where a run's clock starts, as Celery's does at its ``worker_ready``
    signal (interpreter start and imports are not the workload). Each process's CPU at that
    line is kept, for :func:`run_processes` to leave out.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO / "src")}
    procs = []
    for _ in range(count):
        proc = subprocess.Popen(
            worker_command(url, concurrency, app),
            cwd=BENCH_DIR,
            env=env,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        procs.append(proc)
    ready_at: float | None = None
    for proc in procs:
        assert proc.stderr is not None
        for line in proc.stderr:  # the worker's own log line, not a sleep
            if " started: " in line:
                ready_at = ready_at or time.perf_counter()
                _CPU_AT_START[proc.pid] = tree_gauges(proc.pid)["cpu_s"]
                break
        else:
            raise RuntimeError("geneva-drive worker exited before starting")
        # Keep draining stderr so a chatty worker never blocks on a full pipe.
        threading.Thread(target=_drain, args=(proc.stderr,), daemon=True).start()
    assert ready_at is not None
    return procs, ready_at


# A worker's CPU when it logged ``started:``, by pid: starting the interpreter, importing
# SQLAlchemy, psycopg and the app, and the startup checks cost a worker process about a second
# of CPU (0.8-1.2 s measured here), 0.1-0.2 ms per step of a 6,000-step run. Counted in, that
# is not the steps' cost; the bare loop, DBOS and Procrastinate start their counters after
# their setup too.
_CPU_AT_START: dict[int, float] = {}


def _drain(stream: Any) -> None:
    for _ in stream:
        pass


def stop_processes(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def run_processes(
    engine: Engine,
    procs: list[subprocess.Popen],
    total: int,
    started: float,
    t0: float,
    timeout: float = 600,
    all_created: Callable[[], bool] | None = None,
) -> Run:
    polls = 0
    polling = poll_engine(engine)
    try:
        while True:
            polls += 1
            if done(polling, total, all_created):
                break
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"worker processes: not done after {timeout}s")
            time.sleep(POLL)
    finally:
        polling.dispose()
    seconds = time.perf_counter() - t0
    gauges = gauges_of(procs)  # read while alive: /proc goes with them
    return Run(started, seconds, polls, gauges)


def gauges_of(procs: list[subprocess.Popen]) -> list[dict[str, float]]:
    """Each worker's CPU since it logged ``started:`` (see ``_CPU_AT_START``), and peak RSS."""
    gauges = [tree_gauges(p.pid) for p in procs]
    for proc, gauge in zip(procs, gauges, strict=True):
        gauge["cpu_s"] -= _CPU_AT_START.get(proc.pid, 0.0)
    return gauges


# -- reading what happened ----------------------------------------------------------------------


def executions(engine: Engine) -> list[tuple[int, str, datetime, datetime, datetime, int]]:
    """(workflow_id, step, scheduled_for, started_at, finished_at, id) of completed rows."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT workflow_id, step_name, scheduled_for, started_at, finished_at, id "
                "FROM geneva_drive_step_executions WHERE state = 'completed' "
                "ORDER BY workflow_id, created_at, id"
            )
        ).all()
    return [tuple(r) for r in rows]  # type: ignore[misc]


def _seconds(a: Any, b: Any) -> float:
    if isinstance(a, str):  # SQLite hands back strings through text()
        a, b = datetime.fromisoformat(a), datetime.fromisoformat(b)
    return (a - b).total_seconds()


def step_gaps(rows: list[tuple]) -> list[float]:
    """next.started_at − previous.finished_at within each workflow (seconds)."""
    gaps = []
    for prev, nxt in itertools.pairwise(rows):
        if prev[0] == nxt[0]:
            gaps.append(_seconds(nxt[3], prev[4]))
    return gaps


def body_gaps(trace: list[Any]) -> list[float]:
    """Next body start − previous body end within each workflow (seconds), from gd_app.TRACE."""
    ordered = sorted(trace, key=lambda entry: (entry[0], entry[2]))
    return [nxt[2] - prev[3] for prev, nxt in itertools.pairwise(ordered) if prev[0] == nxt[0]]


def read_traces(prefix: str) -> list[Any]:
    """The body traces the worker processes wrote at exit ("<prefix>.<pid>" files)."""
    entries: list[Any] = []
    for path in Path(prefix).parent.glob(Path(prefix).name + ".*"):
        entries.extend(json.loads(line) for line in path.read_text().splitlines() if line)
    return entries


def read_pool_peaks(prefix: str) -> list[int]:
    """The pools' peak checkouts the worker processes wrote at exit ("<prefix>.<pid>")."""
    return [
        int(json.loads(path.read_text())["peak_checkouts"])
        for path in Path(prefix).parent.glob(Path(prefix).name + ".*")
    ]


def first_step_latency(rows: list[tuple], started: float) -> list[float]:
    """Start of each workflow's first step − when the workers began (seconds)."""
    out, seen = [], set()
    for row in rows:
        if row[0] in seen:
            continue
        seen.add(row[0])
        start = row[3]
        if isinstance(start, str):
            start = datetime.fromisoformat(start)
        epoch = start.timestamp() if start.tzinfo else _naive_utc_epoch(start)
        out.append(epoch - started)
    return out


def lateness(rows: list[tuple], step_name: str) -> list[float]:
    """started_at − scheduled_for for executions of ``step_name``."""
    return [_seconds(r[3], r[2]) for r in rows if r[1] == step_name]


def busy_span(rows: list[tuple]) -> float:
    """Seconds from the first step's start to the last step's end, by the rows' own clocks."""
    starts = [r[3] for r in rows]
    ends = [r[4] for r in rows]
    return _seconds(max(ends), min(starts))


def _naive_utc_epoch(value: datetime) -> float:
    from datetime import UTC

    return value.replace(tzinfo=UTC).timestamp()


def sqlite_url(directory: Path) -> str:
    return f"sqlite:///{directory / 'bench.db'}"


__all__ = ["log"]

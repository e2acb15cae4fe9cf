"""A bare SQLAlchemy claim/complete loop: the floor of a database queue on this machine.

Run by ``benchmarks/peers.py`` (the project's venv: SQLAlchemy and psycopg only):
    .venv/bin/python benchmarks/peers/peer_bare.py --url URL --dsn DSN --dbname DB

None of geneva-drive's guarantees: no workflow row or lock, no guards, no leases, no audit
trail. One table of jobs; a workflow is three jobs, each inserted by the one before. A worker
thread claims with ``UPDATE … WHERE id = (SELECT … FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING``
and commits, then marks the job done and inserts the next one in a second transaction — two
commits per step — polling every 10 ms when it finds nothing. Threads: ``--threads`` (4, as
a ``geneva-drive worker``'s default), in one process.

Modes: ``backlog`` — every first job inserted before the threads start; ``throughput`` — one
driver thread inserts the first jobs one transaction each while the threads run.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import (
    callgrind_instrumentation,
    commits,
    emit,
    host_cores,
    host_jiffies,
    self_gauges,
)
from sqlalchemy import create_engine, text

SCHEMA = """
CREATE TABLE bare_jobs (
    id BIGSERIAL PRIMARY KEY,
    workflow INTEGER NOT NULL,
    step INTEGER NOT NULL,
    state TEXT NOT NULL DEFAULT 'queued',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX bare_jobs_queued ON bare_jobs (id) WHERE state = 'queued';
"""
CLAIM = text(
    "UPDATE bare_jobs SET state = 'running' WHERE id = ("
    "SELECT id FROM bare_jobs WHERE state = 'queued' ORDER BY id "
    "FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING id, workflow, step"
)
DONE = text("UPDATE bare_jobs SET state = 'done' WHERE id = :id")
NEXT = text("INSERT INTO bare_jobs (workflow, step) VALUES (:workflow, :step)")
FIRST = text("INSERT INTO bare_jobs (workflow, step) VALUES (:workflow, 1)")
STEPS = 3


def work(engine, finished: list[int], total: int, stop: threading.Event) -> None:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        while not stop.is_set():
            with conn.begin():
                job = conn.execute(CLAIM).first()
            if job is None:
                if finished[0] >= total:
                    return
                time.sleep(0.01)
                continue
            with conn.begin():  # the step body would run here
                conn.execute(DONE, {"id": job.id})
                if job.step < STEPS:
                    conn.execute(NEXT, {"workflow": job.workflow, "step": job.step + 1})
            if job.step == STEPS:
                with _lock:
                    finished[0] += 1


_lock = threading.Lock()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True, help="SQLAlchemy postgresql+psycopg:// URL")
    parser.add_argument("--dsn", required=True, help="libpq DSN for the commit counter")
    parser.add_argument("--dbname", required=True)
    parser.add_argument("--workflows", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--mode", choices=["backlog", "throughput"], default="backlog")
    parser.add_argument(
        "--analyze",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ANALYZE after seeding a backlog (default), as throughput.py does for geneva-drive",
    )
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="count instructions of the run only (instructions.py)",
    )
    args = parser.parse_args()
    engine = create_engine(args.url, pool_size=args.threads + 2)
    with engine.begin() as conn:
        for statement in SCHEMA.split(";"):
            if statement.strip():
                conn.execute(text(statement))
    if args.mode == "backlog":
        with engine.begin() as conn:
            conn.execute(FIRST, [{"workflow": i} for i in range(args.workflows)])
        if args.analyze:
            with engine.begin() as conn:
                conn.execute(text("ANALYZE bare_jobs"))
    engine.dispose()
    before = commits(args.dsn, args.dbname)
    cpu0 = self_gauges()["cpu_s"]
    finished, stop = [0], threading.Event()
    threads = [
        threading.Thread(target=work, args=(engine, finished, args.workflows, stop), daemon=True)
        for _ in range(args.threads)
    ]
    host0 = host_jiffies()
    if args.callgrind:
        callgrind_instrumentation(True)
    t0 = time.perf_counter()
    for thread in threads:
        thread.start()
    if args.mode == "throughput":
        with engine.connect() as conn:
            for i in range(args.workflows):
                with conn.begin():
                    conn.execute(FIRST, {"workflow": i})
    deadline = t0 + 600
    while finished[0] < args.workflows and time.perf_counter() < deadline:
        time.sleep(0.02)
    seconds = time.perf_counter() - t0
    if args.callgrind:
        callgrind_instrumentation(False)
    host = host_cores(host0)
    stop.set()
    for thread in threads:
        thread.join(10)
    cpu = self_gauges()["cpu_s"] - cpu0
    engine.dispose()
    time.sleep(0.5)
    after = commits(args.dsn, args.dbname)
    steps = STEPS * finished[0]
    emit(
        bench="throughput",
        system=f"bare SQLAlchemy loop ({args.mode})",
        mode=args.mode,
        workflows=args.workflows,
        steps=steps,
        seconds=round(seconds, 3),
        workflows_per_s=round(finished[0] / seconds, 1),
        steps_per_s=round(steps / seconds, 1),
        commits_per_step=round((after - before) / max(steps, 1), 2),
        # The whole process: the driver thread too in throughput mode.
        cpu_ms_per_step=round(cpu * 1000 / max(steps, 1), 3),
        **host,
        peak_rss_mb=round(self_gauges()["peak_rss_mb"], 1),
        config=f"{args.threads} threads, one process, 10 ms idle poll, two commits per step",
    )


if __name__ == "__main__":
    main()

"""Latency at light load, against one running ``geneva-drive worker`` process.

    .venv/bin/python benchmarks/latency.py --samples 200

Three measurements, one workflow at a time (the worker is otherwise idle):
- step gap: three-step no-op workflows; the next step's body start − the previous body's end,
  from the bodies' own trace (gd_app.TRACE; ``step_gap_stamps``: the same from the rows'
  started_at − finished_at, which chaining stamps in one transaction);
- waited-step lateness: a step with ``wait=0.2 s``; started_at − scheduled_for;
- signal → woken step: a ``wait_for="go"`` step, once it is parked (``waiting``); its
  started_at − the moment just before the signal's transaction committed (so the commit itself
  is counted against us).
Also the time from ``create()``'s commit to the first step's start (a new workflow, idle worker).
All times are the rows' own (``started_at`` is set when the worker claims the row); this
script's polling only decides when to send the next sample. A few unmeasured workflows warm up
the worker's connections first. The worker runs with its documented defaults
(``--poll-interval 1.0``). ``worker_cpu_ms_per_workflow``: the worker process's CPU time
(/proc) per workflow of each measurement.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from geneva_drive.storage.db import session_factory

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _gd
import gd_app
from _common import emit, log, machine, start_postgres, summary_ms
from sqlalchemy import text
from sqlalchemy.orm import Session

from geneva_drive.definition.workflow import Workflow


def _state(engine, workflow_id: int) -> str:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        return str(
            conn.execute(
                text("SELECT state FROM geneva_drive_workflows WHERE id = :id"), {"id": workflow_id}
            ).scalar_one()
        )


def _waiting(engine, workflow_id: int) -> bool:  # type: ignore[no-untyped-def]
    # Parked, not merely scheduled: a signal sent before the step reaches its gate is only
    # buffered (no wake-up; the gate picks it up), and its delivery locks the workflow row, so
    # a claim running at that moment skips the row and the step starts a retry later — a race
    # of this script's, not the signal → woken-step path being measured.
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM geneva_drive_step_executions WHERE workflow_id = :id "
                    "AND step_name = 'woken' AND state = 'waiting'"
                ),
                {"id": workflow_id},
            ).scalar_one()
        ) and _first_done(engine, workflow_id)


def _first_done(engine, workflow_id: int) -> bool:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM geneva_drive_step_executions WHERE workflow_id = :id "
                    "AND step_name = 'first' AND state = 'completed'"
                ),
                {"id": workflow_id},
            ).scalar_one()
        )


def _until(predicate, timeout: float = 30.0, interval: float = 0.005) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("latency.py: the worker did not get there in time")
        time.sleep(interval)


def _create(config, cls) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    with Session(config.require_engine()) as session:
        wf = cls.create(session)
        before_commit = time.time()
        session.commit()
        return wf.id, before_commit


def _started_epoch(engine, workflow_id: int, step: str) -> float:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        value = conn.execute(
            text(
                "SELECT started_at FROM geneva_drive_step_executions WHERE workflow_id = :id "
                "AND step_name = :step AND state = 'completed'"
            ),
            {"id": workflow_id, "step": step},
        ).scalar_one()
    if isinstance(value, str):  # SQLite hands back strings through text()
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        return _gd._naive_utc_epoch(value)
    return float(value.astimezone(UTC).timestamp())


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` (Linux /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200, help="workflows per measurement")
    parser.add_argument("--backend", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--durability", choices=["durable", "async"], default="async")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured workflows first")
    args = parser.parse_args(argv)
    server = start_postgres(args.durability) if args.backend == "postgresql" else None
    if server is not None:
        _, url = server.create_database("lat")
    else:
        url = _gd.sqlite_url(Path(tempfile.mkdtemp(prefix="gd-bench-sqlite-")))
    engine, config = _gd.prepare(url)
    trace_prefix = str(Path(tempfile.mkdtemp(prefix="gd-bench-trace-")) / "trace")
    os.environ["GD_BENCH_TRACE"] = trace_prefix  # the worker writes its body trace at exit
    try:
        procs, _ = _gd.start_worker_processes(url, 1, None)
    finally:
        del os.environ["GD_BENCH_TRACE"]
    result: dict = {"bench": "latency", "system": "geneva-drive", "backend": args.backend}
    cpu: dict[str, float] = {}
    three_step_ids: set[int] = set()
    try:
        emit(bench="machine", **machine())
        n = args.samples
        for _ in range(args.warmup):
            wf_id, _ = _create(config, gd_app.BenchThreeSteps)
            _until(lambda wf_id=wf_id: _state(engine, wf_id) == "finished")
        # This process is the application sending the commits: a full garbage collection of
        # its start-up objects between "before commit" and the commit would be timed against
        # the worker (see geneva_drive.runtime.worker.freeze_startup_objects, which the worker
        # does).
        gc.collect()
        gc.freeze()

        def measured(label: str, rows: list[tuple], ids: set[int]) -> list[tuple]:
            used = _cpu_seconds(procs[0].pid)
            if used is not None:
                cpu[label] = round((used - cpu.pop("_mark")) * 1000 / n, 2)
                cpu["_mark"] = used
            return [row for row in rows if row[0] in ids]

        cpu["_mark"] = _cpu_seconds(procs[0].pid) or 0.0
        log(f"latency: {n} three-step workflows one at a time")
        create_to_first = []
        for _ in range(n):
            wf_id, committed = _create(config, gd_app.BenchThreeSteps)
            three_step_ids.add(wf_id)
            _until(lambda wf_id=wf_id: _state(engine, wf_id) == "finished")
            create_to_first.append(_started_epoch(engine, wf_id, "one") - committed)
        rows = measured("three_steps", _gd.executions(engine), three_step_ids)
        result["step_gap"] = None  # from the body trace, once the worker has exited
        result["step_gap_stamps"] = summary_ms(_gd.step_gaps(rows))
        result["create_to_first_step"] = summary_ms(create_to_first)

        log(f"latency: {n} waited steps (wait={gd_app.WAIT_SECONDS}s)")
        ids = set()
        for _ in range(n):
            wf_id, _ = _create(config, gd_app.BenchWaited)
            ids.add(wf_id)
            _until(lambda wf_id=wf_id: _state(engine, wf_id) == "finished")
        rows = measured("waited", _gd.executions(engine), ids)
        result["waited_step_lateness"] = summary_ms(_gd.lateness(rows, "after_wait"))

        log(f"latency: {n} signals")
        woken = []
        for _ in range(n):
            wf_id, _ = _create(config, gd_app.BenchSignaled)
            _until(lambda wf_id=wf_id: _waiting(engine, wf_id))
            # geneva-drive's session factory: on SQLite its transactions BEGIN IMMEDIATE, so
            # the signal's write cannot fail upgrading a read lock while the worker writes.
            with session_factory(config)() as session:
                wf = session.get(Workflow, wf_id)
                assert wf is not None
                wf.signal("go")
                before_commit = time.time()
                session.commit()
            _until(lambda wf_id=wf_id: _state(engine, wf_id) == "finished")
            woken.append(_started_epoch(engine, wf_id, "woken") - before_commit)
        measured("signaled", [], set())
        result["signal_to_woken_step"] = summary_ms(woken)
        cpu.pop("_mark")
        if cpu:
            result["worker_cpu_ms_per_workflow"] = cpu
    finally:
        _gd.stop_processes(procs)
        engine.dispose()
        if server is not None:
            server.stop()
    trace = [entry for entry in _gd.read_traces(trace_prefix) if entry[0] in three_step_ids]
    result["step_gap"] = summary_ms(_gd.body_gaps(trace))
    emit(**result)
    return result


if __name__ == "__main__":
    main()

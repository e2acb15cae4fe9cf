"""Latency at light load, against one running ``geneva-drive worker`` process.

    .venv/bin/python benchmarks/latency.py --samples 200

Three measurements, one workflow at a time (the worker is otherwise idle):
- step gap: three-step no-op workflows; next.started_at − previous.finished_at (rows' clocks);
- waited-step lateness: a step with ``wait=0.2 s``; started_at − scheduled_for;
- signal → woken step: a ``wait_for="go"`` step; its started_at − the moment just before the
  signal's transaction committed (so the commit itself is counted against us).
Also the time from ``create()``'s commit to the first step's start (a new workflow, idle worker).
The worker runs with its documented defaults (``--poll-interval 1.0``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _gd
import gd_app
from _common import emit, log, machine, start_postgres, summary_ms
from sqlalchemy import text
from sqlalchemy.orm import Session

from geneva_drive.workflow import Workflow


def _state(engine, workflow_id: int) -> str:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        return str(
            conn.execute(
                text("SELECT state FROM geneva_drive_workflows WHERE id = :id"), {"id": workflow_id}
            ).scalar_one()
        )


def _waiting(engine, workflow_id: int) -> bool:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM geneva_drive_step_executions WHERE workflow_id = :id "
                    "AND step_name = 'woken' AND state IN ('waiting', 'scheduled')"
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
    if value.tzinfo is None:
        return _gd._naive_utc_epoch(value)
    return float(value.astimezone(UTC).timestamp())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200, help="workflows per measurement")
    parser.add_argument("--backend", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--durability", choices=["durable", "async"], default="async")
    args = parser.parse_args(argv)
    server = start_postgres(args.durability) if args.backend == "postgresql" else None
    if server is not None:
        _, url = server.create_database("lat")
    else:
        url = _gd.sqlite_url(Path(tempfile.mkdtemp(prefix="gd-bench-sqlite-")))
    engine, config = _gd.prepare(url)
    procs = _gd.start_worker_processes(url, 1, None)
    result: dict = {"bench": "latency", "system": "geneva-drive", "backend": args.backend}
    try:
        emit(bench="machine", **machine())
        n = args.samples
        log(f"latency: {n} three-step workflows one at a time")
        create_to_first = []
        for _ in range(n):
            wf_id, committed = _create(config, gd_app.BenchThreeSteps)
            _until(lambda wf_id=wf_id: _state(engine, wf_id) == "finished")
            create_to_first.append(_started_epoch(engine, wf_id, "one") - committed)
        rows = _gd.executions(engine)
        result["step_gap"] = summary_ms(_gd.step_gaps(rows))
        result["create_to_first_step"] = summary_ms(create_to_first)

        log(f"latency: {n} waited steps (wait={gd_app.WAIT_SECONDS}s)")
        for _ in range(n):
            wf_id, _ = _create(config, gd_app.BenchWaited)
            _until(lambda wf_id=wf_id: _state(engine, wf_id) == "finished")
        rows = _gd.executions(engine)
        result["waited_step_lateness"] = summary_ms(_gd.lateness(rows, "after_wait"))

        log(f"latency: {n} signals")
        woken = []
        for _ in range(n):
            wf_id, _ = _create(config, gd_app.BenchSignaled)
            _until(lambda wf_id=wf_id: _waiting(engine, wf_id))
            with Session(engine) as session:
                wf = session.get(Workflow, wf_id)
                assert wf is not None
                wf.signal("go")
                before_commit = time.time()
                session.commit()
            _until(lambda wf_id=wf_id: _state(engine, wf_id) == "finished")
            woken.append(_started_epoch(engine, wf_id, "woken") - before_commit)
        result["signal_to_woken_step"] = summary_ms(woken)
        emit(**result)
    finally:
        _gd.stop_processes(procs)
        engine.dispose()
        if server is not None:
            server.stop()
    return result


if __name__ == "__main__":
    main()

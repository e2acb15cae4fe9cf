"""Async steps: 1,000 workflows whose one step awaits a second of I/O, on one worker process.

    .venv/bin/python benchmarks/async_io.py                       # everything, one round
    .venv/bin/python benchmarks/async_io.py --systems async --io sleep --async-concurrency 100

Issue 37's target: one ``geneva-drive worker`` process runs 1,000 such steps in at most 15 s
of wall time and 300 MB of resident memory at its default ``--async-concurrency`` (100).
Systems, run one after the other on the same embedded PostgreSQL server (durable commits,
loopback TCP, a fresh database each), their order rotated each round:

* ``async``: ``gd_async_app`` on one worker process at each ``--async-concurrency`` value,
  for each I/O kind — ``asyncio.sleep(1)``, and a GET to a slow local HTTP server (uvicorn,
  started by this script in a process of its own) that answers after a second;
* ``sync``: ``gd_sync_sleep_app``, a sync step blocking its thread in ``time.sleep(1)``, at
  each ``--sync-concurrency`` (threads), ``--sync-workflows`` workflows at the default 4
  (1,000 would take about 250 s) and ``--workflows`` at the others;
* ``DBOS``: ``peers/peer_dbos_async.py`` in the peers' venv, the sleep only.

geneva-drive's load: the worker starts and logs ``started:``, idle; then this script creates
all the workflows in one transaction (``create_many``), as an application starting a batch
does, and the worker's LISTEN wakes it. **Wall time comes from the rows**: the first
workflow's ``created_at`` to the last step's outcome commit, by PostgreSQL's commit
timestamps (the server runs with ``track_commit_timestamp = on``; ``finished_at`` is stamped
before that commit, which can wait for one of the lane's few connections). Peak RSS is the
worker process's ``VmHWM`` (the kernel's high-water mark of its resident set), read before it
stops. ``in_flight_peak`` counts the most step executions open at once by their rows' own
``started_at``/``finished_at``: what the lane reached. JSON lines on stdout; the last one
sums up.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _gd
from _common import (
    BENCH_DIR,
    REPO,
    emit,
    ensure_peers_venv,
    free_port,
    host_cores,
    host_jiffies,
    libpq_dsn,
    log,
    machine,
    percentile,
    run_json,
    start_postgres,
    tree_gauges,
    wait_for,
)
from sqlalchemy import text
from sqlalchemy.orm import Session

WALL_TARGET_S = 15.0
RSS_TARGET_MB = 300.0
TIMEOUT_S = 900.0

# What each geneva-drive system runs: (worker app module, workflow class name).
APPS = {
    ("async", "sleep"): ("gd_async_app", "BenchAsyncSleep"),
    ("async", "http"): ("gd_async_app", "BenchAsyncHttp"),
    ("sync", "sleep"): ("gd_sync_sleep_app", "BenchSyncSleep"),
}


# -- the slow HTTP server --------------------------------------------------------------------


async def slow_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A raw ASGI app: every request is answered "ok" after a second, never sooner."""
    if scope["type"] != "http":
        return
    await asyncio.sleep(1.0)
    headers = [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


def serve(port: int) -> None:
    """This script's ``--serve PORT``: the slow server, in a process of its own (so that its
    loop shares no GIL with the script's polls, nor with the worker)."""
    import uvicorn

    uvicorn.run(
        slow_app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
        access_log=False,
        backlog=4096,
        timeout_keep_alive=30,
    )


def start_slow_server() -> tuple[subprocess.Popen[bytes], str]:
    import socket

    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])

    def up() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            return False

    wait_for(up, 30, what="the slow HTTP server")
    return proc, f"http://127.0.0.1:{port}/"


# -- one geneva-drive run --------------------------------------------------------------------


def start_worker(
    url: str, app: str, concurrency: int, async_concurrency: int, env: dict[str, str]
) -> tuple[subprocess.Popen[str], float]:
    """One ``geneva-drive worker`` process; returns once it has logged ``started:``, with its
    CPU at that line (start-up and imports are not the steps' cost)."""
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
        "--concurrency",
        str(concurrency),
        "--async-concurrency",
        str(async_concurrency),
    ]
    proc = subprocess.Popen(
        argv,
        cwd=BENCH_DIR,
        env={**os.environ, **env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO / "src")},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:  # the worker's own log line, not a sleep
        lines.append(line)
        if " started: " in line:
            break
    else:
        raise RuntimeError("geneva-drive worker exited before starting:\n" + "".join(lines))
    cpu0 = tree_gauges(proc.pid)["cpu_s"]
    threading.Thread(target=_gd._drain, args=(proc.stderr,), daemon=True).start()
    return proc, cpu0


def _epoch(value: Any) -> float:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.timestamp() if value.tzinfo else _gd._naive_utc_epoch(value)


# Each step's outcome commit, by PostgreSQL's own clock (``track_commit_timestamp``, which this
# script turns on): the last update of an execution row is the transaction that committed its
# outcome. ``finished_at`` is stamped before that commit, which can wait for one of the lane's
# few connections: at --async-concurrency 500 the last stamp came seconds before the last commit.
_STEPS = text(
    "SELECT started_at, finished_at, outcome, "
    "extract(epoch FROM pg_xact_commit_timestamp(xmin)) "
    "FROM geneva_drive_step_executions WHERE finished_at IS NOT NULL"
)


def read_rows(engine: Any) -> dict[str, Any]:
    """Wall time, in-flight peak and per-step figures from the rows (see ``_STEPS``)."""
    with engine.connect() as conn:
        created = [
            _epoch(c)
            for (c,) in conn.execute(text("SELECT created_at FROM geneva_drive_workflows"))
        ]
        steps = [
            (_epoch(s), _epoch(f), outcome, float(c) if c is not None else None)
            for s, f, outcome, c in conn.execute(_STEPS)
        ]
    first_create = min(created)
    last_stamp = max(f for _, f, _, _ in steps)
    commits = [c for *_, c in steps if c is not None]
    last_commit = max(commits) if len(commits) == len(steps) else None
    # The most executions open at once: +1 at each start, -1 at each finish (finishes first
    # on a tie, so that back-to-back steps of one task do not count twice).
    events = sorted([(s, 1) for s, *_ in steps] + [(f, -1) for _, f, *_ in steps])
    open_now = peak = 0
    for _, delta in events:
        open_now += delta
        peak = max(peak, open_now)
    durations = [f - s for s, f, *_ in steps]
    stamp_to_commit = [c - f for _, f, _, c in steps if c is not None]
    first_start = sorted(s for s, *_ in steps)
    return {
        # First create → last outcome committed (else: → the last finished_at stamp).
        "wall_s": round((last_commit or last_stamp) - first_create, 2),
        "wall_by": "commit timestamps" if last_commit else "finished_at stamps",
        "wall_stamps_s": round(last_stamp - first_create, 2),
        "succeeded": sum(1 for _, _, outcome, _ in steps if outcome == "success"),
        "in_flight_peak": peak,
        "step_s": _spread(durations),
        # finished_at stamp → the outcome's commit: waiting for a connection, and the commit.
        "stamp_to_commit_s": _spread(stamp_to_commit) if stamp_to_commit else None,
        # When the first and the last step began, after the first create.
        "first_start_after_create_s": round(first_start[0] - first_create, 3),
        "last_start_after_create_s": round(first_start[-1] - first_create, 3),
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 50) or 0, 3),
        "p99": round(percentile(values, 99) or 0, 3),
        "max": round(max(values), 3),
    }


def run_geneva_drive(
    server: Any,
    lane: str,
    io: str,
    workflows: int,
    concurrency: int,
    async_concurrency: int,
    http_url: str | None,
) -> dict[str, Any]:
    import importlib

    app, class_name = APPS[(lane, io)]
    name, url = server.create_database("aio")
    engine, _ = _gd.prepare(url)
    cls = getattr(importlib.import_module(app), class_name)
    env = {"GD_BENCH_HTTP_URL": http_url} if http_url else {}
    engine.dispose()  # a backend flushes its statistics when it disconnects
    proc, cpu0 = start_worker(url, app, concurrency, async_concurrency, env)
    host0 = host_jiffies()
    xacts0 = transactions(server, name)
    polls = 0
    try:
        t0 = time.perf_counter()
        with Session(engine) as session:
            cls.create_many(session, count=workflows)
            session.commit()
        polling = _gd.poll_engine(engine)
        try:
            while not _gd.done(polling, workflows):
                polls += 1
                if proc.poll() is not None:
                    raise RuntimeError(f"the worker exited ({proc.returncode}) mid-run")
                if time.perf_counter() - t0 > TIMEOUT_S:
                    raise TimeoutError(f"not done after {TIMEOUT_S}s")
                time.sleep(_gd.POLL)
        finally:
            polling.dispose()
        seconds = time.perf_counter() - t0
        host = host_cores(host0)
        gauges = tree_gauges(proc.pid)  # while alive: /proc goes with it
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    engine.dispose()
    time.sleep(0.5)  # let the worker's backends exit (and report their counters)
    xacts = [
        after - before for after, before in zip(transactions(server, name), xacts0, strict=True)
    ]
    rows = read_rows(engine)
    engine.dispose()
    server.drop_database(name)
    result: dict[str, Any] = {
        "bench": "async-io",
        "system": f"geneva-drive {lane}",
        "io": io,
        "workflows": workflows,
        "concurrency": concurrency if lane == "sync" else None,
        "async_concurrency": async_concurrency if lane == "async" else None,
        **rows,
        "seconds_by_clock": round(seconds, 2),
        "steps_per_s": round(workflows / rows["wall_s"], 1),
        "peak_rss_mb": round(gauges["peak_rss_mb"], 1),
        "cpu_s": round(gauges["cpu_s"] - cpu0, 2),
        # The database's transactions over the run, per step: the worker's (claims, outcomes,
        # idle polls, the lane's claims that find nothing) and this script's one create; its
        # "are we done?" polls are left out (a rollback each, two for the last).
        "commits_per_step": round((xacts[0] - 1) / workflows, 2),
        "rollbacks_per_step": round(max(xacts[1] - polls - 2, 0) / workflows, 2),
        **host,
    }
    if lane == "async":
        result["meets_targets"] = (
            rows["wall_s"] <= WALL_TARGET_S and result["peak_rss_mb"] <= RSS_TARGET_MB
        )
    else:
        # What 1,000 would take at this concurrency, from this run's own rate.
        result["extrapolated_1000_s"] = round(1000 / result["steps_per_s"], 1)
    return result


def transactions(server: Any, database: str) -> tuple[int, int]:
    """``pg_stat_database``'s (commits, rollbacks) of ``database``, in a fresh snapshot."""
    rows = server.admin(
        "SELECT pg_stat_clear_snapshot(), xact_commit, xact_rollback FROM pg_stat_database "
        f"WHERE datname = '{database}'"
    )
    return int(rows[0][1]), int(rows[0][2])


def run_dbos(server: Any, python: str, workflows: int) -> dict[str, Any]:
    name, _ = server.create_database("aio_dbos")
    try:
        argv = [python, str(BENCH_DIR / "peers" / "peer_dbos_async.py")]
        argv += ["--url", server.url(name, driver="postgresql")]
        argv += ["--dsn", libpq_dsn(server, name), "--dbname", name]
        argv += ["--workflows", str(workflows)]
        host0 = host_jiffies()
        lines = run_json(argv, timeout=TIMEOUT_S)
        result = lines[-1] if lines else {"error": "no output"}
        result.update(host_cores(host0))
        return result
    finally:
        server.drop_database(name)


# -- the run ------------------------------------------------------------------------------------


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    wanted = {s.strip() for s in args.systems.split(",") if s.strip()}
    ios = [i.strip() for i in args.io.split(",") if i.strip()]
    systems: list[dict[str, Any]] = []
    if "async" in wanted:
        for io in ios:
            for value in _ints(args.async_concurrency):
                systems.append(
                    {"kind": "async", "io": io, "workflows": args.workflows, "async": value}
                )
    if "sync" in wanted and "sleep" in ios:
        for value in _ints(args.sync_concurrency):
            count = args.sync_workflows if value <= 4 else args.workflows
            systems.append({"kind": "sync", "io": "sleep", "workflows": count, "threads": value})
    if "DBOS" in wanted and "sleep" in ios:
        systems.append({"kind": "DBOS", "io": "sleep", "workflows": args.workflows})
    return systems


def _ints(values: str) -> list[int]:
    return [int(v) for v in values.split(",") if v.strip()]


def label(system: dict[str, Any]) -> str:
    if system["kind"] == "async":
        return f"geneva-drive async, {system['io']}, --async-concurrency {system['async']}"
    if system["kind"] == "sync":
        return f"geneva-drive sync threads, sleep, --concurrency {system['threads']}"
    return "DBOS async, sleep"


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the slow server
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--systems", default="async,sync,DBOS", help="of async, sync, DBOS")
    parser.add_argument("--io", default="sleep,http", help="of sleep, http")
    parser.add_argument("--async-concurrency", default="100,200,500")
    parser.add_argument("--sync-concurrency", default="4,32")
    parser.add_argument(
        "--sync-workflows",
        type=int,
        default=100,
        help="workflows for the sync threads at --concurrency 4 or less (1,000 would take "
        "about 250 s; the result line extrapolates)",
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--durability", choices=["durable", "async"], default="durable")
    parser.add_argument("--transport", choices=["tcp", "unix"], default="tcp")
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return []
    systems = plan(args)
    python = ""
    if any(s["kind"] == "DBOS" for s in systems):
        python = str(ensure_peers_venv())
    server = start_postgres(
        args.durability,
        transport=args.transport,
        extra_settings={"track_commit_timestamp": "on"},  # the rows' commit times (_STEPS)
    )
    http, http_url = (None, None)
    if any(s["io"] == "http" for s in systems):
        http, http_url = start_slow_server()
    results: list[dict[str, Any]] = []
    try:
        emit(bench="machine", **machine(), durability=args.durability, transport=args.transport)
        for round_no in range(1, args.rounds + 1):
            shift = (round_no - 1) % len(systems)
            for system in systems[shift:] + systems[:shift]:
                log(f"async_io: round {round_no}: {label(system)}, {system['workflows']} workflows")
                try:
                    if system["kind"] == "DBOS":
                        result = run_dbos(server, python, system["workflows"])
                    else:
                        result = run_geneva_drive(
                            server,
                            system["kind"],
                            system["io"],
                            system["workflows"],
                            system.get("threads", 4),
                            system.get("async", 100),
                            http_url,
                        )
                except Exception as error:
                    traceback.print_exc()
                    result = {"error": f"{type(error).__name__}: {error}"}
                result.update(round=round_no, label=label(system), loadavg=os.getloadavg())
                emit(**result)
                results.append(result)
    finally:
        if http is not None:
            http.terminate()
            http.wait(10)
        server.stop()
    emit(
        bench="async-io-summary",
        rows=[
            {
                key: r.get(key)
                for key in (
                    "label",
                    "round",
                    "workflows",
                    "wall_s",
                    "peak_rss_mb",
                    "in_flight_peak",
                    "cpu_s",
                    "meets_targets",
                    "extrapolated_1000_s",
                    "error",
                )
            }
            for r in results
        ],
    )
    return results


if __name__ == "__main__":
    main()

"""Throughput: N three-step no-op workflows through the database worker.

    .venv/bin/python benchmarks/throughput.py --workflows 2000
    .venv/bin/python benchmarks/throughput.py --workflows 2000 --processes 1,2,4   # scale-out
    .venv/bin/python benchmarks/throughput.py --workflows 500 --backend sqlite

Each mode gets a fresh database with N workflows seeded before any worker starts. Mode 0 runs
``geneva_drive.runtime.worker.Worker`` on a thread of this process; mode k ≥ 1 runs k separate
``geneva-drive worker`` processes (their CPU and peak RSS come from /proc). Prints one JSON
line per mode: workflows/s, steps/s (wall time from worker start to the last finished
workflow), commits per step (``pg_stat_database.xact_commit`` delta, PostgreSQL only), worker
CPU ms per step, the server's CPU ms and WAL bytes per step (PostgreSQL), peak RSS, the step
gap and first-step start latency under this load.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _gd
import gd_app
from _common import (
    WaitSampler,
    commits,
    emit,
    host_cores,
    host_jiffies,
    log,
    machine,
    percentile,
    self_gauges,
    start_postgres,
    summary_ms,
)

STEPS = 3


def one_mode(args: argparse.Namespace, server, processes: int) -> dict:  # type: ignore[no-untyped-def]
    tmp = None
    if args.backend == "postgresql":
        name, url = server.create_database("thr")
        dsn = server.url(name, driver="postgresql")
    else:
        tmp = Path(tempfile.mkdtemp(prefix="gd-bench-sqlite-"))
        url, name, dsn = _gd.sqlite_url(tmp), None, None
    engine, config = _gd.prepare(url)
    drive = getattr(args, "drive", False)
    t_seed = time.perf_counter()
    if not drive:
        _gd.seed(config, gd_app.BenchThreeSteps, args.workflows)
    seed_s = time.perf_counter() - t_seed
    if args.analyze and not drive:
        from sqlalchemy import text

        # What autovacuum does within a minute of a backlog arriving. Not in throughput mode:
        # its tables start empty, and statistics of empty tables would say they stay so.
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
    engine.dispose()  # a backend flushes its statistics when it disconnects
    before = commits(dsn, name) if dsn else None
    server_cpu0 = server.cpu_s() if dsn else None
    wal0 = server.wal_lsn() if dsn else None
    syncs0 = server.wal_syncs() if dsn else None
    cpu0 = self_gauges()["cpu_s"]
    # On the "postgres" database: its own statements must not count as the run's commits.
    waits = WaitSampler(server.url("postgres", driver="postgresql"), name) if dsn and name else None
    trace_prefix = str(Path(tempfile.mkdtemp(prefix="gd-bench-trace-")) / "trace")
    pool_prefix = str(Path(trace_prefix).with_name("pool"))
    pool_peak = None
    gd_app.TRACE.clear()
    if processes == 0:
        if drive:
            raise SystemExit("--drive runs worker processes: pass --processes 1 (or more)")
        host0 = host_jiffies()
        run = _gd.run_in_process(config, args.workflows, args.concurrency)
        host = host_cores(host0)
        trace = list(gd_app.TRACE)
        cpu = self_gauges()["cpu_s"] - cpu0
        rss = self_gauges()["peak_rss_mb"]
        procs_info = None
    else:
        os.environ["GD_BENCH_TRACE"] = trace_prefix  # the workers write their body trace
        os.environ["GD_BENCH_POOL"] = pool_prefix  # and their pools' peak checkouts
        try:
            # The clock starts at the first worker's "started" line (Celery's: worker_ready).
            procs, t0 = _gd.start_worker_processes(url, processes, args.concurrency)
        finally:
            del os.environ["GD_BENCH_TRACE"], os.environ["GD_BENCH_POOL"]
        started = time.time() - (time.perf_counter() - t0)
        driver = _gd.Driver(config, gd_app.BenchThreeSteps, args.workflows) if drive else None
        host0 = host_jiffies()
        try:
            if driver is not None:
                driver.start()
            with waits or contextlib.nullcontext():
                run = _gd.run_processes(
                    engine,
                    procs,
                    args.workflows,
                    started,
                    t0,
                    all_created=(lambda: not driver.is_alive()) if driver is not None else None,
                )
            host = host_cores(host0)
        finally:
            if driver is not None:
                driver.join()
            _gd.stop_processes(procs)
        trace = _gd.read_traces(trace_prefix)
        pool_peak = max(_gd.read_pool_peaks(pool_prefix), default=None)
        cpu = sum(g["cpu_s"] for g in run.gauges)
        rss = max(g["peak_rss_mb"] for g in run.gauges)
        procs_info = [
            {"cpu_s": round(g["cpu_s"], 2), "peak_rss_mb": round(g["peak_rss_mb"], 1)}
            for g in run.gauges
        ]
    engine.dispose()
    after = server_cpu = wal = syncs = None
    if dsn:
        time.sleep(0.5)  # let the workers' backends exit (and report their counters)
        after = commits(dsn, name)
        server_cpu = server.cpu_s() - server_cpu0
        wal = server.wal_bytes_since(wal0)
        syncs1 = server.wal_syncs()
        syncs = syncs1 - syncs0 if syncs0 is not None and syncs1 is not None else None
    rows = _gd.executions(engine)
    engine.dispose()
    steps = len(rows)
    gaps = _gd.step_gaps(rows)
    first = _gd.first_step_latency(rows, run.started)
    result = {
        "bench": "throughput",
        "system": "geneva-drive",
        # backlog: every workflow created before the workers start; throughput: one driver
        # thread creating them one transaction each while the workers run.
        "load": "throughput" if drive else "backlog",
        "backend": args.backend,
        "durability": args.durability if args.backend == "postgresql" else None,
        "mode": "in-process Worker" if processes == 0 else f"{processes} worker process(es)",
        "transport": server.transport if server is not None else None,
        "processes": processes,
        "concurrency": args.concurrency,
        # The most connections one worker process had checked out at once (its threads, the
        # heartbeat's, LISTEN's): what its pool must hold.
        "pool_peak_checkouts": pool_peak,
        "workflows": args.workflows,
        "steps": steps,
        "seconds": round(run.seconds, 3),
        "workflows_per_s": round(args.workflows / run.seconds, 1),
        "steps_per_s": round(steps / run.seconds, 1),
        "steps_per_s_by_rows": round(steps / _gd.busy_span(rows), 1),
        # Everything the database committed during the run (workers' claims, idle polls
        # included; this script's own polls are read-only and roll back). PostgreSQL also
        # counts each listening worker's read of the notification queue as a commit: with
        # --drive, one per start per worker process that is not durable (notifycost.py);
        # wal_fsyncs_per_step is the durable side.
        "commits_per_step": round((after - before) / steps, 2) if dsn else None,
        "cpu_ms_per_step": round(cpu * 1000 / steps, 3),
        # The database server's side, same span (PostgreSQL: the whole server, other
        # databases' idle processes included - there are none here).
        "server_cpu_ms_per_step": round(server_cpu * 1000 / steps, 3) if dsn else None,
        "wal_bytes_per_step": round(wal / steps) if dsn else None,
        "wal_fsyncs_per_step": round(syncs / steps, 3) if syncs is not None else None,
        # What the server's client backends waited on while the workers ran (worker modes).
        "server_waits": waits.summary() if waits is not None and waits.samples else None,
        # The host's cores busy on average while the workers ran: next to the CPU per step
        # of the worker, the server and the driver, whether the machine was the limit.
        **host,
        "peak_rss_mb": round(rss, 1),
        "worker_processes": procs_info,
        # Next step's body start − previous body's end, as the step bodies saw it.
        "step_gap": summary_ms(_gd.body_gaps(trace)),
        # The same from the database stamps (started_at − finished_at): with chaining both
        # are taken in one transaction, so this shows only the executor's own time.
        "step_gap_stamps": summary_ms(gaps),
        "first_step_start": {
            "p50_s": round(percentile(first, 50) or 0, 3),
            "p99_s": round(percentile(first, 99) or 0, 3),
            "max_s": round(max(first), 3),
        },
        "seed_s": round(seed_s, 2),
        "driver_cpu_ms_per_workflow": (
            round(driver.cpu_s * 1000 / args.workflows, 3) if drive and driver else None
        ),
        "driver_s": round(driver.seconds, 3) if drive and driver else None,
        "analyzed": args.analyze and not drive,
    }
    if processes == 0:
        result["note"] = "in-process: CPU and RSS are of the whole script (seeding included)"
    if server is not None and name is not None:
        server.drop_database(name)
    return result


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=2000)
    parser.add_argument("--backend", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument(
        "--processes",
        default="0,1",
        help="comma-separated modes: 0 = in-process Worker, k = k worker processes",
    )
    parser.add_argument("--concurrency", type=int, default=None, help="threads per worker")
    parser.add_argument("--durability", choices=["durable", "async"], default="durable")
    parser.add_argument("--transport", choices=["tcp", "unix"], default="tcp")
    parser.add_argument(
        "--drive",
        action="store_true",
        help="throughput mode: a driver thread creates the workflows one transaction each "
        "while the workers run (default: a backlog created before they start)",
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--analyze",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ANALYZE after seeding, as autovacuum does within a minute of a backlog arriving "
        "(default); --no-analyze runs on the fresh tables' statistics",
    )
    args = parser.parse_args(argv)
    modes = [int(m) for m in args.processes.split(",")]
    server = (
        start_postgres(args.durability, transport=args.transport)
        if args.backend == "postgresql"
        else None
    )
    results = []
    try:
        emit(bench="machine", **machine())
        for round_no in range(1, args.rounds + 1):
            for mode in modes:
                log(f"throughput: round {round_no}, mode {mode}, {args.workflows} workflows")
                result = one_mode(args, server, mode)
                result["round"] = round_no
                emit(**result)
                results.append(result)
    finally:
        if server is not None:
            server.stop()
    return results


if __name__ == "__main__":
    main()

"""What instrumentation costs: no-op steps/s with metrics and tracing off and on, in one run.

    .venv/bin/python benchmarks/observability.py --workflows 1000 --rounds 5
    .venv/bin/python benchmarks/observability.py --backend postgresql --workflows 1000

Four modes, interleaved round by round so that drift of the host hits them alike: ``off``
(nothing subscribed, ``configure(tracing=False)``), ``metrics`` (``runtime.metrics.install``
on a fresh registry), ``tracing`` (an OpenTelemetry SDK provider with a batch processor and an
exporter that sends nowhere — as an application configures it, less the network) and
``both``. Each mode of each round gets a fresh database seeded with N three-step no-op
workflows, then one thread runs every
due step as a worker's step thread does (chaining on: ``_gd.drain_with_one_step_thread``);
steps/s is 3N over that drain's wall time, and CPU µs per step this process's CPU time over
it (SQLite runs in the process; on PostgreSQL the server's share is left out) — on a shared
host the CPU time moves less than the wall time. Prints one JSON line per mode and round, then
the median of each mode and its ratio to ``off``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _gd
import gd_app
from _common import emit, log, machine, start_postgres

from geneva_drive.runtime.configure import configure

MODES = ("off", "metrics", "tracing", "both")
STEPS = 3


def _provider() -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Nowhere(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    # As an application configures it (a batch processor, an exporter), less the network.
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Nowhere()))
    return provider


def one(args: argparse.Namespace, server: Any, mode: str) -> dict[str, Any]:
    if server is not None:
        _, url = server.create_database("obs")
    else:
        url = _gd.sqlite_url(Path(tempfile.mkdtemp(prefix="gd-bench-obs-")))
    engine, config = _gd.prepare(url)
    _gd.seed(config, gd_app.BenchThreeSteps, args.workflows)
    uninstall = None
    if mode in ("tracing", "both"):
        config = configure(engine=engine, tracing=_provider())
    elif mode == "off" and not args.default_settings:
        config = configure(engine=engine, tracing=False)
    if mode in ("metrics", "both"):
        from prometheus_client import CollectorRegistry

        from geneva_drive.runtime import metrics

        uninstall = metrics.install(CollectorRegistry())
    try:
        gd_app.TRACE.clear()
        started, cpu = time.perf_counter(), time.process_time()
        if args.runner == "worker":
            # Its own clock: up to the last workflow's finish, not the worker's stop after it.
            seconds = _gd.run_in_process(config, args.workflows, args.concurrency).seconds
        else:
            _gd.drain_with_one_step_thread(config, f"bench-{mode}")
            seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu
    finally:
        if uninstall is not None:
            uninstall()
        engine.dispose()
    return {
        "bench": "observability",
        "backend": args.backend,
        "mode": mode,
        "runner": args.runner,
        "workflows": args.workflows,
        "seconds": round(seconds, 3),
        "steps_per_s": round(STEPS * args.workflows / seconds, 1),
        "cpu_us_per_step": round(cpu * 1e6 / (STEPS * args.workflows), 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument(
        "--runner",
        choices=("drain", "worker"),
        default="drain",
        help="drain: one thread runs every due step, as a worker's step thread does (the "
        "default: the least noise); worker: geneva_drive's Worker on a thread of this process, "
        "with its step threads, lease renewals and polls, as a worker process runs",
    )
    parser.add_argument(
        "--concurrency", type=int, default=None, help="--runner worker: its step threads"
    )
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help="comma-separated modes to run (default: all four)",
    )
    parser.add_argument(
        "--default-settings",
        action="store_true",
        help="run mode off with the default settings (no tracing= given), so that it also runs "
        "on a tree from before tracing: with PYTHONPATH at each tree, off against the tree "
        "before instrumentation",
    )
    args = parser.parse_args(argv)
    modes = tuple(args.modes.split(","))
    server = start_postgres() if args.backend == "postgresql" else None
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    cpu: dict[str, list[float]] = {mode: [] for mode in modes}
    try:
        emit(bench="machine", **machine())
        for round_no in range(1, args.rounds + 1):
            order = modes if round_no % 2 else tuple(reversed(modes))
            for mode in order:
                log(f"observability: round {round_no}, {mode}")
                result = one(args, server, mode)
                rates[mode].append(result["steps_per_s"])
                cpu[mode].append(result["cpu_us_per_step"])
                emit(**result, round=round_no)
    finally:
        if server is not None:
            server.stop()
    first = modes[0]  # "off" unless --modes says otherwise
    base, base_cpu = statistics.median(rates[first]), statistics.median(cpu[first])
    for mode in modes:
        median, median_cpu = statistics.median(rates[mode]), statistics.median(cpu[mode])
        emit(
            bench="observability-summary",
            backend=args.backend,
            runner=args.runner,
            mode=mode,
            median_steps_per_s=round(median, 1),
            steps_vs_first=round(median / base, 3),
            median_cpu_us_per_step=round(median_cpu, 1),
            cpu_vs_first=round(median_cpu / base_cpu, 3),
            rounds=rates[mode],
            cpu_rounds=cpu[mode],
        )


if __name__ == "__main__":
    main()

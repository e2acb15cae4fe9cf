"""Client instructions per step, counted by valgrind: a geneva-drive step thread, the bare loop.

    .venv/bin/python benchmarks/instructions.py --workflows 300
    .venv/bin/python benchmarks/instructions.py --src /tmp/old-tree/src   # another tree's code
    .venv/bin/python benchmarks/instructions.py --observe off,metrics,tracing,both --no-bare --no-gc
    .venv/bin/python benchmarks/instructions.py --keyed-class-loaded --count-statements --no-bare

Time per step on this shared virtual machine moves by a third from one run to the next (the
same code measured 0.40 and 0.63 ms of worker CPU per step in consecutive runs, with nothing
stolen). The instructions a process executes do not: valgrind's callgrind counts them,
repeatable to about 0.1 %. This counts the user-space instructions of a geneva-drive step
thread (``executor.claim_and_run`` in a loop, one thread, chaining on, as a worker's thread
runs it) and of the bare SQLAlchemy loop with one thread (``peers/peer_bare.py``), each on
a backlog of ``--workflows`` three-step no-op workflows on the same PostgreSQL, with the
instrumentation switched on for the run only: neither start-up nor seeding is counted.

What it leaves out: the kernel's share of a process's CPU (a round trip is a send, a poll and
a receive: the bare loop makes seven per step, geneva-drive about 2.3), and the cost of
several threads sharing one interpreter. Needs valgrind (``apt-get install valgrind``).
Prints one JSON line per system and one with the ratio.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BENCH_DIR, REPO, callgrind_instrumentation, emit, log, machine, start_postgres

STEPS = 3
VALGRIND = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=/dev/null"]


OBSERVE = ("off", "metrics", "tracing", "both", "null-tracer")


def geneva_drive_child(
    url: str,
    workflows: int,
    observe: str = "off",
    keyed_loaded: bool = False,
    count_statements: bool = False,
    no_gc: bool = False,
) -> None:
    """Under valgrind: seed a backlog, then count one step thread's run of it, with the
    instrumentation ``observe`` names switched on (see :func:`observed`). ``keyed_loaded``:
    a class with a ``fairness_key`` is loaded too (the backlog's class has none).
    ``count_statements``: print the statements sent (``statements=N``; the listener's own
    instructions are counted too). ``no_gc``: collect, then count with the cyclic GC off."""
    import _gd
    import gd_app

    if keyed_loaded:
        import gd_fair_app  # noqa: F401  (BenchFairOne: a keyed class in this process)
    engine, config = _gd.prepare(url)
    _gd.seed(config, gd_app.BenchThreeSteps, workflows)
    with engine.begin() as conn:  # as throughput.py: what autovacuum does within a minute
        conn.exec_driver_sql("ANALYZE")
    config, stop = observed(engine, config, observe)
    sent = [0]
    if count_statements:
        from sqlalchemy import event

        def count(*_: Any) -> None:
            sent[0] += 1

        event.listen(engine, "before_cursor_execute", count)
    if no_gc:
        gc.collect()
        gc.disable()
    callgrind_instrumentation(True)
    _gd.drain_with_one_step_thread(config, "instructions")
    stop()  # a batch processor's last export is counted: the application pays for it too
    callgrind_instrumentation(False)
    if count_statements:
        print(f"statements={sent[0]}")
    engine.dispose()


def observed(engine: Any, config: Any, observe: str) -> tuple[Any, Any]:
    """The settings and a stop function for ``observe``: ``off`` (the defaults: no tracer
    provider configured, nothing subscribed), ``metrics`` (``runtime.metrics.install`` on a
    registry of its own), ``tracing`` (an OpenTelemetry SDK provider with a batch processor
    and an exporter that sends nowhere — as an application configures it, less the network)
    or ``both``; ``null-tracer``: tracing on with a provider whose spans record nothing —
    what geneva-drive does around a span (its attributes, the context attached) without the
    SDK's own work."""
    from geneva_drive.runtime.configure import configure

    stops = []
    if observe in ("metrics", "both"):
        from prometheus_client import CollectorRegistry

        from geneva_drive.runtime import metrics

        stops.append(metrics.install(CollectorRegistry()))
    if observe == "null-tracer":
        from opentelemetry import trace

        class NullTracer:  # spans that record nothing, as cheap as the API makes them
            def start_span(self, *_: Any, **__: Any) -> Any:
                return trace.INVALID_SPAN

        class NullProvider:
            def get_tracer(self, *_: Any, **__: Any) -> NullTracer:
                return NullTracer()

        config = configure(engine=engine, tracing=NullProvider())
    if observe in ("tracing", "both"):
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class Nowhere(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Nowhere()))
        config = configure(engine=engine, tracing=provider)
        stops.append(provider.shutdown)

    def stop() -> None:
        for each in stops:
            each()

    return config, stop


def counted(argv: list[str], env: dict[str, str]) -> int:
    return counted_and_sent(argv, env)[0]


def counted_and_sent(argv: list[str], env: dict[str, str]) -> tuple[int, int | None]:
    """Instructions, and the statements the child says it sent (``--count-statements``)."""
    done = subprocess.run([*VALGRIND, *argv], capture_output=True, text=True, env=env, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{argv[1]} under valgrind failed:\n{done.stderr[-2000:]}")
    sent = re.search(r"statements=(\d+)", done.stdout)
    return int(found.group(1)), int(sent.group(1)) if sent else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workflows", type=int, default=300)
    parser.add_argument("--src", default=str(REPO / "src"), help="the geneva-drive tree to count")
    parser.add_argument(
        "--observe",
        default="off",
        help=f"comma-separated instrumentation modes to count the step thread in, each in a "
        f"run of its own: {', '.join(OBSERVE)} (default: off)",
    )
    parser.add_argument("--no-bare", action="store_true", help="skip the bare loop")
    parser.add_argument(
        "--keyed-class-loaded",
        action="store_true",
        help="load a class with a fairness_key in the step thread's process too",
    )
    parser.add_argument(
        "--count-statements", action="store_true", help="also count the statements sent"
    )
    parser.add_argument(
        "--no-gc",
        action="store_true",
        help="count with the cyclic GC off (collected first): whether a full collection falls "
        "in a run moves its count by ~30k instructions per step at 300 workflows — more than "
        "what a comparison of instrumentation modes looks for",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "geneva-drive":
        geneva_drive_child(
            args.url,
            args.workflows,
            args.observe,
            args.keyed_class_loaded,
            args.count_statements,
            args.no_gc,
        )
        return
    modes = args.observe.split(",")
    if not set(modes) <= set(OBSERVE):
        parser.error(f"--observe {args.observe!r}: expected modes among {', '.join(OBSERVE)}")
    emit(bench="machine", **machine())
    env = {**os.environ, "PYTHONPATH": args.src}
    server = start_postgres()
    try:
        steps = STEPS * args.workflows
        for mode in modes:
            name, url = server.create_database(f"instr_gd_{mode}")
            log(f"instructions: geneva-drive ({args.src}), {args.workflows} workflows, {mode}")
            child = ["--child", "geneva-drive", "--url", url, "--workflows", str(args.workflows)]
            child += ["--keyed-class-loaded"] if args.keyed_class_loaded else []
            child += ["--count-statements"] if args.count_statements else []
            child += ["--no-gc"] if args.no_gc else []
            gd, sent = counted_and_sent([sys.executable, __file__, *child, "--observe", mode], env)
            extra = {} if sent is None else {"statements_per_step": round(sent / steps, 3)}
            emit(
                bench="instructions",
                system="geneva-drive step thread",
                observe=mode,
                gc="off" if args.no_gc else "on",
                keyed_class_loaded=args.keyed_class_loaded,
                src=args.src,
                steps=steps,
                instructions=gd,
                per_step=round(gd / steps),
                **extra,
            )
        if args.no_bare:
            return
        name, url = server.create_database("instr_bare")
        log("instructions: bare SQLAlchemy loop, 1 thread")
        dsn = server.url(name, driver="postgresql")
        peer = [str(BENCH_DIR / "peers" / "peer_bare.py"), "--callgrind", "--threads", "1"]
        peer += ["--url", url, "--dsn", dsn, "--dbname", name, "--workflows", str(args.workflows)]
        bare = counted([sys.executable, *peer], env)
        emit(
            bench="instructions",
            system="bare SQLAlchemy loop, 1 thread",
            steps=steps,
            instructions=bare,
            per_step=round(bare / steps),
        )
        emit(bench="instructions", ratio_geneva_drive_to_bare=round(gd / bare, 3))
    finally:
        server.stop()


if __name__ == "__main__":
    main()

"""What a concurrency limit costs: no-op steps/s with no limit, one that never binds, and
one that binds (limit 8 and 1), in one run.

    .venv/bin/python benchmarks/limits.py --workflows 1000 --rounds 3

Each variant gets a fresh PostgreSQL database seeded with N three-step no-op workflows (the
throughput workload; ``gd_app.BenchThreeSteps`` and its subclasses with a class-level
``ConcurrencyLimit`` on one global key), then one ``geneva-drive worker`` process runs them at
``--concurrency`` step threads (16 by default, so that a limit of 8 binds). Rounds interleave
the variants, in a rotated order each round. Prints one JSON line per variant and round, then
the medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _gd
import gd_app
from _common import emit, log, machine, start_postgres
from sqlalchemy import text

VARIANTS = {
    "no limit": gd_app.BenchThreeSteps,
    "limit 1000 (never binds)": gd_app.BenchLimitNeverBinds,
    "limit 8": gd_app.BenchLimit8,
    "limit 1": gd_app.BenchLimit1,
}


def one_variant(server, name: str, args: argparse.Namespace) -> dict:  # type: ignore[no-untyped-def]
    database, url = server.create_database("lim")
    engine, config = _gd.prepare(url)
    _gd.seed(config, VARIANTS[name], args.workflows)
    engine.dispose()
    procs, t0 = _gd.start_worker_processes(url, 1, args.concurrency)
    started = time.time() - (time.perf_counter() - t0)
    try:
        run = _gd.run_processes(engine, procs, args.workflows, started, t0)
    finally:
        _gd.stop_processes(procs)
    rows = _gd.executions(engine)
    with engine.connect() as conn:  # anything but a clean success: what and why
        odd = conn.execute(
            text(
                "SELECT outcome, error_message, metadata FROM geneva_drive_step_executions "
                "WHERE outcome IS DISTINCT FROM 'success'"
            )
        ).all()
    engine.dispose()
    server.drop_database(database)
    steps = len(rows)
    return {
        "bench": "limits",
        "variant": name,
        "workflows": args.workflows,
        "steps": steps,
        "concurrency": args.concurrency,
        "seconds": round(run.seconds, 3),
        "steps_per_s": round(steps / run.seconds, 1),
        "cpu_ms_per_step": round(sum(g["cpu_s"] for g in run.gauges) * 1000 / steps, 3),
        "not_success": [(o, (m or "")[:300], str(meta)[:300]) for o, m, meta in odd],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16, help="step threads")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS)
    )
    args = parser.parse_args()
    names = [name.strip() for name in args.variants.split(",")]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown}; expected some of {list(VARIANTS)}")
    server = start_postgres()
    results: dict[str, list[float]] = {name: [] for name in names}
    try:
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                log(f"round {round_ + 1}: {name}")
                result = one_variant(server, name, args)
                emit(round=round_ + 1, **result)
                results[name].append(result["steps_per_s"])
    finally:
        server.stop()
    base = statistics.median(results["no limit"]) if results.get("no limit") else None
    for name in names:
        median = statistics.median(results[name])
        emit(
            bench="limits-summary",
            variant=name,
            steps_per_s_median=median,
            rounds=results[name],
            of_no_limit=round(median / base, 3) if base else None,
            machine=machine(),
        )


if __name__ == "__main__":
    main()

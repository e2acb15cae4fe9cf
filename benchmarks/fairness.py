"""Fair claims: tenant A enqueues 20,000 one-step workflows, then tenant B 10; B's first-step
latency with and without a fairness key, and what the key costs in no-op steps/s.

    .venv/bin/python benchmarks/fairness.py --a 20000 --b 10 --rounds 3

Each variant gets a fresh PostgreSQL database seeded with A's workflows (``gd_fair_app``'s
``BenchPlainOne``, or ``BenchFairOne``, keyed by tenant), then one ``geneva-drive worker``
process drains them. Once it has finished ``--b-after`` of them, B's 10 are created, and
their latency is each one's step start − B's creation (the rows' own clock). Throughput:
A's and B's steps over the run. Rounds alternate the variants, in a rotated order each round.
Prints one JSON line per variant and round, then the medians with the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _gd
import gd_fair_app
from _common import emit, log, machine, start_postgres, wait_for
from sqlalchemy import text
from sqlalchemy.orm import Session

VARIANTS = {"no key": gd_fair_app.BenchPlainOne, "fairness_key": gd_fair_app.BenchFairOne}


def _create(config, cls: type, tenant: str, count: int) -> datetime:  # type: ignore[no-untyped-def]
    """``count`` workflows of ``tenant``, 1,000 per create_many(); when the last commit began
    (the rows are visible to the worker from its end)."""
    token = gd_fair_app.TENANT.set(tenant)
    try:
        made = 0
        while made < count:
            n = min(1000, count - made)
            with Session(config.require_engine()) as session:
                cls.create_many(session, count=n)
                committing = datetime.now(UTC)
                session.commit()
            made += n
        return committing
    finally:
        gd_fair_app.TENANT.reset(token)


def one_variant(server, name: str, args: argparse.Namespace) -> dict:  # type: ignore[no-untyped-def]
    cls = VARIANTS[name]
    database, url = server.create_database("fair")
    engine, config = _gd.prepare(url)
    _create(config, cls, "a", args.a)
    procs, t0 = _gd.start_worker_processes(url, 1, args.concurrency, app="gd_fair_app")
    started = time.time() - (time.perf_counter() - t0)
    try:
        wait_for(lambda: _gd.finished_count(engine) >= args.b_after, 300, what="A's head")
        with engine.connect() as conn:
            last_a = conn.execute(text("SELECT max(id) FROM geneva_drive_workflows")).scalar_one()
        b_created = _create(config, cls, "b", args.b)
        run = _gd.run_processes(engine, procs, args.a + args.b, started, t0)
    finally:
        _gd.stop_processes(procs)
    with engine.connect() as conn:
        b_starts = conn.execute(
            text(
                "SELECT started_at FROM geneva_drive_step_executions "
                "WHERE workflow_id > :last_a ORDER BY started_at"
            ),
            {"last_a": last_a},
        ).scalars()
        b_latency = [(s.replace(tzinfo=UTC) - b_created).total_seconds() for s in b_starts]
        steps = conn.execute(
            text("SELECT count(*) FROM geneva_drive_step_executions WHERE outcome = 'success'")
        ).scalar_one()
    engine.dispose()
    server.drop_database(database)
    return {
        "bench": "fairness",
        "variant": name,
        "a": args.a,
        "b": args.b,
        "concurrency": args.concurrency,
        "steps": steps,
        "seconds": round(run.seconds, 3),
        "steps_per_s": round(steps / run.seconds, 1),
        "cpu_ms_per_step": round(sum(g["cpu_s"] for g in run.gauges) * 1000 / steps, 3),
        "b_first_ms": round(b_latency[0] * 1000, 1) if b_latency else None,
        "b_last_ms": round(b_latency[-1] * 1000, 1) if b_latency else None,
        "b_rows": len(b_latency),
        "loadavg": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=int, default=20_000, help="tenant A's workflows")
    parser.add_argument("--b", type=int, default=10, help="tenant B's workflows")
    parser.add_argument("--b-after", type=int, default=500, help="A's finished when B starts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4, help="step threads")
    args = parser.parse_args()
    server = start_postgres()
    results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    try:
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                log(f"round {round_ + 1}: {name}")
                result = one_variant(server, name, args)
                emit(round=round_ + 1, **result)
                results[name].append(result)
    finally:
        server.stop()
    base = statistics.median(r["steps_per_s"] for r in results["no key"])
    for name in names:
        runs = results[name]
        median = statistics.median(r["steps_per_s"] for r in runs)
        emit(
            bench="fairness-summary",
            variant=name,
            steps_per_s_median=median,
            of_no_key=round(median / base, 3),
            b_first_ms_median=statistics.median(r["b_first_ms"] for r in runs),
            b_last_ms_median=statistics.median(r["b_last_ms"] for r in runs),
            loadavg=[r["loadavg"] for r in runs],
            machine=machine(),
        )


if __name__ == "__main__":
    main()

"""Peers, same workload, same run: geneva-drive vs DBOS, a Celery chain and Procrastinate.

    .venv/bin/python benchmarks/peers.py --workflows 2000 --rounds 5

Creates ``benchmarks/.venv-peers`` on first use (the peers never enter the project's venv)
and needs Debian's ``redis-server`` (``apt-get install -y redis-server``). One embedded
PostgreSQL server and one private Redis (loopback port, no persistence) serve every system;
each run gets a fresh database. Rounds are interleaved — every system once per round, the
order rotated each round — and the summary line holds medians and ratios (geneva-drive's
steps/s divided by each peer's).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import throughput
from _common import (
    BENCH_DIR,
    emit,
    ensure_peers_venv,
    libpq_dsn,
    log,
    machine,
    median,
    run_json,
    start_postgres,
    start_redis,
)

SYSTEMS = [
    "geneva-drive (1 worker process)",
    "geneva-drive (in-process Worker)",
    "DBOS (queued)",
    "DBOS (loop)",
    "Celery chain (Redis/prefork)",
    "Procrastinate (defer next)",
]


def run_system(system: str, args: argparse.Namespace, server, redis, python: str) -> dict:  # type: ignore[no-untyped-def]
    if system.startswith("geneva-drive"):
        mode = 1 if "process" in system and "in-process" not in system else 0
        ns = argparse.Namespace(
            workflows=args.workflows,
            backend="postgresql",
            concurrency=None,
            durability=args.durability,
            analyze=args.analyze,
        )
        result = throughput.one_mode(ns, server, mode)
        result["system"] = system
        return result
    if system.startswith("Celery"):
        argv = [python, str(BENCH_DIR / "peers" / "peer_celery.py"), "--redis-url", redis.url]
        argv += ["--workflows", str(args.workflows)]
        lines = run_json(argv, timeout=900)
        return lines[-1] if lines else {"error": "no output"}
    name, _ = server.create_database("peer")
    try:
        dsn = libpq_dsn(server, name)
        if system.startswith("DBOS"):
            argv = [python, str(BENCH_DIR / "peers" / "peer_dbos.py")]
            argv += ["--url", server.url(name, driver="postgresql"), "--dsn", dsn]
            argv += ["--dbname", name, "--mode", "loop" if "loop" in system else "queued"]
        else:
            argv = [python, str(BENCH_DIR / "peers" / "peer_procrastinate.py")]
            argv += ["--dsn", dsn, "--dbname", name]
        argv += ["--workflows", str(args.workflows)]
        lines = run_json(argv, timeout=900)
        return lines[-1] if lines else {"error": "no output"}
    finally:
        server.drop_database(name)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--systems",
        default="geneva-drive,DBOS,Celery,Procrastinate",
        help="comma-separated substrings of the system names to run",
    )
    parser.add_argument("--durability", choices=["durable", "async"], default="async")
    parser.add_argument("--analyze", action="store_true", help="see throughput.py --analyze")
    args = parser.parse_args(argv)
    wanted = [w.strip() for w in args.systems.split(",") if w.strip()]
    systems = [s for s in SYSTEMS if any(w in s for w in wanted)] or SYSTEMS
    errors: dict[str, str] = {}
    try:
        python = str(ensure_peers_venv())
    except Exception as error:  # a peer that cannot be installed is reported, not hidden
        python = ""
        errors["install"] = f"{type(error).__name__}: {error}"
        systems = [s for s in systems if s.startswith("geneva-drive")]
    server = start_postgres(args.durability)
    redis = start_redis(persistence=False)
    results: dict[str, list[dict]] = {s: [] for s in systems}
    try:
        emit(bench="machine", **machine(), durability=args.durability)
        for round_no in range(1, args.rounds + 1):
            shift = (round_no - 1) % len(systems)
            for system in systems[shift:] + systems[:shift]:
                log(f"peers: round {round_no}: {system}")
                try:
                    result = run_system(system, args, server, redis, python)
                except Exception as error:
                    result = {"system": system, "error": f"{type(error).__name__}: {error}"}
                result["round"] = round_no
                result["system"] = system
                emit(**result)
                results[system].append(result)
    finally:
        redis.stop()
        server.stop()
    summary: dict = {"bench": "peers-summary", "workflows": args.workflows, "rounds": args.rounds}
    table = {}
    for system, runs in results.items():
        ok = [r for r in runs if "steps_per_s" in r]
        table[system] = {
            "steps_per_s_median": median([r["steps_per_s"] for r in ok]),
            "steps_per_s_rounds": [r["steps_per_s"] for r in ok],
            "commits_per_step_median": median(
                [r["commits_per_step"] for r in ok if r.get("commits_per_step") is not None]
            ),
            "cpu_ms_per_step_median": median([r["cpu_ms_per_step"] for r in ok]),
            "peak_rss_mb_max": max([r["peak_rss_mb"] for r in ok], default=None),
            "errors": [r["error"] for r in runs if "error" in r],
        }
    ours = table.get(SYSTEMS[0], {}).get("steps_per_s_median")
    for row in table.values():
        theirs = row["steps_per_s_median"]
        row["geneva_drive_ratio"] = round(ours / theirs, 2) if ours and theirs else None
    summary["table"] = table
    summary["errors"] = errors
    emit(**summary)
    return summary


if __name__ == "__main__":
    main()

"""Peers, same workload, same run: geneva-drive vs DBOS, a Celery chain, a bare SQLAlchemy loop
and Procrastinate, each on a preloaded backlog and (where it has one) in throughput mode.

    .venv/bin/python benchmarks/peers.py --workflows 2000 --rounds 5

Creates ``benchmarks/.venv-peers`` on first use (the peers never enter the project's venv)
and needs Debian's ``redis-server`` (``apt-get install -y redis-server``). One embedded
PostgreSQL server and one private Redis (loopback port, no persistence) serve every system;
each run gets a fresh database. Rounds are interleaved — every system once per round, the
order rotated each round — and the summary line holds medians and ratios (geneva-drive's
steps/s divided by each peer's): the ratio of the two medians, and the median of the ratios
of each round's pair (``geneva_drive_ratio_by_round_median``), the one to read on a host
whose speed drifts. Before round 1 every system runs once on a tenth of the
workflows (``--warmup``), left out of the summary: otherwise the first system listed always
meets a cold server and cold caches in round 1 (geneva-drive, which ran 10-20 % below its
later rounds there on a quiet host).
"""

from __future__ import annotations

import argparse
import sys
import traceback
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

# "backlog": every workflow created before the workers start. "throughput": one driver thread
# starting workflows one transaction (Celery: one apply_async) each while the workers run.
SYSTEMS = [
    "geneva-drive (1 worker process, backlog)",
    "geneva-drive (1 worker process, throughput)",
    "geneva-drive (in-process Worker, backlog)",
    "DBOS (queued)",
    "DBOS (loop)",
    "Celery chain (Redis/prefork, backlog)",
    "Celery chain (Redis/prefork, throughput)",
    "bare SQLAlchemy loop (backlog)",
    "bare SQLAlchemy loop (throughput)",
    "Procrastinate (defer next)",
]
# Each system's ratio is taken against geneva-drive's run of the same load.
REFERENCE = {
    "backlog": SYSTEMS[0],
    "throughput": SYSTEMS[1],
}


def load_of(system: str) -> str:
    # DBOS queued enqueues inside its clock, while its workers run: the throughput load.
    return "throughput" if "throughput" in system or system == "DBOS (queued)" else "backlog"


def paired_ratios(ours: list[dict], theirs: list[dict]) -> list[float]:
    """geneva-drive's steps/s ÷ the peer's, round by round (rounds both completed).

    The two runs of a round are a few minutes apart at most, and this shared host's speed
    drifts by a quarter or more over a whole run: the median of these paired ratios leaves
    that drift out, where the ratio of the two medians can set a slow round of one system
    against a fast round of the other."""
    by_round = {r["round"]: r["steps_per_s"] for r in theirs if r.get("steps_per_s")}
    return [
        r["steps_per_s"] / by_round[r["round"]]
        for r in ours
        if r.get("steps_per_s") and r["round"] in by_round
    ]


def concurrency_of(system: str) -> int | None:
    """The ``--concurrency`` of a geneva-drive variant ("…, concurrency 16)"); None: default."""
    _, found, rest = system.partition("concurrency ")
    return int(rest.rstrip(")")) if found else None


def with_concurrency(systems: list[str], values: list[int | None]) -> list[str]:
    """Each geneva-drive system once per ``--gd-concurrency`` value (None: the default)."""
    out = []
    for system in systems:
        if not system.startswith("geneva-drive"):
            out.append(system)
            continue
        for value in values:
            out.append(system if value is None else f"{system[:-1]}, concurrency {value})")
    return out


def run_system(system: str, args: argparse.Namespace, server, redis, python: str) -> dict:  # type: ignore[no-untyped-def]
    if system.startswith("geneva-drive"):
        mode = 0 if "in-process" in system else 1
        ns = argparse.Namespace(
            workflows=args.workflows,
            backend="postgresql",
            concurrency=concurrency_of(system),
            durability=args.durability,
            analyze=args.analyze,
            drive="throughput" in system,
        )
        result = throughput.one_mode(ns, server, mode)
        result["system"] = system
        return result
    if system.startswith("Celery"):
        argv = [python, str(BENCH_DIR / "peers" / "peer_celery.py"), "--redis-url", redis.url]
        argv += ["--workflows", str(args.workflows), "--mode", load_of(system)]
        lines = run_json(argv, timeout=900)
        return lines[-1] if lines else {"error": "no output"}
    name, _ = server.create_database("peer")
    try:
        dsn = libpq_dsn(server, name)
        if system.startswith("bare"):
            argv = [sys.executable, str(BENCH_DIR / "peers" / "peer_bare.py")]
            argv += ["--url", server.url(name), "--dsn", dsn, "--dbname", name]
            argv += ["--mode", load_of(system)]
            argv += ["--analyze" if args.analyze else "--no-analyze"]
        elif system.startswith("DBOS"):
            argv = [python, str(BENCH_DIR / "peers" / "peer_dbos.py")]
            argv += ["--url", server.url(name, driver="postgresql"), "--dsn", dsn]
            argv += ["--dbname", name, "--mode", "loop" if "loop" in system else "queued"]
        else:
            argv = [python, str(BENCH_DIR / "peers" / "peer_procrastinate.py")]
            argv += ["--dsn", dsn, "--dbname", name]
        argv += ["--workflows", str(args.workflows)]
        cpu0 = server.cpu_s()
        lines = run_json(argv, timeout=900)
        result = lines[-1] if lines else {"error": "no output"}
        if result.get("steps"):
            # The whole run's, its schema and seeding included: an upper bound of the
            # steps' own (geneva-drive's counts the worker's span only).
            result["server_cpu_ms_per_step"] = round(
                (server.cpu_s() - cpu0) * 1000 / result["steps"], 3
            )
        return result
    finally:
        server.drop_database(name)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--systems",
        default="geneva-drive,DBOS,Celery,bare,Procrastinate",
        help="comma-separated substrings of the system names to run",
    )
    parser.add_argument(
        "--gd-concurrency",
        default="default",
        help="comma-separated --concurrency values for geneva-drive's workers, each run as a "
        "system of its own ('default': the worker's own, e.g. default,8,16,32)",
    )
    parser.add_argument("--durability", choices=["durable", "async"], default="durable")
    parser.add_argument("--transport", choices=["tcp", "unix"], default="tcp")
    parser.add_argument(
        "--analyze",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ANALYZE after seeding a backlog, geneva-drive's and the bare loop's (default; "
        "see throughput.py --analyze)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="unrecorded rounds before round 1, each system once on a tenth of --workflows",
    )
    args = parser.parse_args(argv)
    wanted = [w.strip() for w in args.systems.split(",") if w.strip()]
    systems = [s for s in SYSTEMS if any(w in s for w in wanted)] or SYSTEMS
    values = [v.strip() for v in args.gd_concurrency.split(",") if v.strip()]
    systems = with_concurrency(systems, [None if v == "default" else int(v) for v in values])
    errors: dict[str, str] = {}
    try:
        python = str(ensure_peers_venv())
    except Exception as error:  # a peer that cannot be installed is reported, not hidden
        python = ""
        errors["install"] = f"{type(error).__name__}: {error}"
        systems = [s for s in systems if s.startswith(("geneva-drive", "bare"))]
    server = start_postgres(args.durability, transport=args.transport)
    redis = start_redis(persistence=False)
    results: dict[str, list[dict]] = {s: [] for s in systems}
    try:
        emit(bench="machine", **machine(), durability=args.durability, transport=args.transport)
        warm = argparse.Namespace(**{**vars(args), "workflows": max(100, args.workflows // 10)})
        for round_no in range(1, args.warmup + 1):
            for system in systems:
                log(f"peers: warm-up {round_no}: {system}")
                try:
                    run_system(system, warm, server, redis, python)
                except Exception:
                    traceback.print_exc()  # the recorded rounds report it again
        for round_no in range(1, args.rounds + 1):
            shift = (round_no - 1) % len(systems)
            for system in systems[shift:] + systems[:shift]:
                log(f"peers: round {round_no}: {system}")
                try:
                    result = run_system(system, args, server, redis, python)
                except Exception as error:
                    traceback.print_exc()  # to stderr: the JSON line keeps only the message
                    result = {"system": system, "error": f"{type(error).__name__}: {error}"}
                result["round"] = round_no
                result["system"] = system
                emit(**result)
                results[system].append(result)
    finally:
        redis.stop()
        server.stop()
    summary: dict = {
        "bench": "peers-summary",
        "workflows": args.workflows,
        "rounds": args.rounds,
        "warmup": args.warmup,
    }
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
            "pool_peak_checkouts_max": max(
                [r["pool_peak_checkouts"] for r in ok if r.get("pool_peak_checkouts")],
                default=None,
            ),
            "errors": [r["error"] for r in runs if "error" in r],
        }
    for system, row in table.items():
        row["load"] = load_of(system)
        ours = table.get(REFERENCE[row["load"]], {}).get("steps_per_s_median")
        theirs = row["steps_per_s_median"]
        row["geneva_drive_ratio"] = round(ours / theirs, 2) if ours and theirs else None
        paired = paired_ratios(results.get(REFERENCE[row["load"]], []), results[system])
        row["geneva_drive_ratio_by_round"] = [round(ratio, 2) for ratio in paired]
        middle = median(paired)
        row["geneva_drive_ratio_by_round_median"] = None if middle is None else round(middle, 2)
    summary["table"] = table
    summary["errors"] = errors
    emit(**summary)
    return summary


if __name__ == "__main__":
    main()

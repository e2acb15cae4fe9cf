"""Step threads against durable commits: one worker process at 4, 8, 16 threads beside the bare
loop, same server, interleaved rounds.

    .venv/bin/python benchmarks/threads.py --workflows 2000 --rounds 2 --threads 4,8,16

With ``synchronous_commit=on`` every commit waits for the WAL flush, and a step thread waits
with it: at 4 threads the process is idle while its commits are on the disk. This shows how
many threads it takes to fill that time (PostgreSQL flushes the commits that wait together
in one fsync). Preloaded backlog of three-step workflows; ratios against the bare loop of the
same round.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers
import throughput
from _common import emit, log, machine, median, start_postgres


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", default="4,8,16")
    parser.add_argument("--durability", choices=["durable", "async"], default="durable")
    parser.add_argument("--load", choices=["backlog", "throughput"], default="backlog")
    args = parser.parse_args(argv)
    counts = [int(t) for t in args.threads.split(",")]
    server = start_postgres(args.durability)
    runs: dict[str, list[float]] = {}
    try:
        emit(bench="machine", **machine(), durability=args.durability)
        for round_no in range(1, args.rounds + 1):
            for threads in counts:
                log(f"threads: round {round_no}, {threads} threads")
                ns = argparse.Namespace(
                    workflows=args.workflows,
                    backend="postgresql",
                    concurrency=threads,
                    durability=args.durability,
                    analyze=True,
                    drive=args.load == "throughput",
                )
                result = throughput.one_mode(ns, server, 1)
                result.update(round=round_no, system=f"geneva-drive ({threads} threads)")
                emit(**result)
                runs.setdefault(result["system"], []).append(result["steps_per_s"])
            bare = f"bare SQLAlchemy loop ({args.load})"
            ns = argparse.Namespace(workflows=args.workflows, durability=args.durability)
            result = peers.run_system(bare, ns, server, None, sys.executable)
            result.update(round=round_no)
            emit(**result)
            runs.setdefault(bare, []).append(result.get("steps_per_s", 0.0))
    finally:
        server.stop()
    bare_median = median(runs.pop(f"bare SQLAlchemy loop ({args.load})", []))
    emit(
        bench="threads-summary",
        bare_steps_per_s_median=bare_median,
        table={
            system: {
                "steps_per_s_median": median(values),
                "rounds": values,
                "ratio_to_bare": round(median(values) / bare_median, 2)  # type: ignore[operator]
                if bare_median
                else None,
            }
            for system, values in runs.items()
        },
    )


if __name__ == "__main__":
    main()

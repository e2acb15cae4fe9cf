"""What one NOTIFY costs the server, with and without a backend listening on its channel.

    .venv/bin/python benchmarks/notifycost.py --notifies 2000 --rounds 2

Why it exists: PostgreSQL reads the notification queue in a transaction of its own in every
listening backend, and counts it in ``pg_stat_database.xact_commit``. A workload whose
transactions NOTIFY a listening worker (throughput mode: every start wakes the worker)
therefore shows one "commit" more per NOTIFY per listening process than it makes durable
commits. This measures that count and the server CPU it costs, alternating listening and
not, on the same server (embedded PostgreSQL, ``synchronous_commit=on``, TCP). Each phase
opens fresh connections and closes them before reading the counters: a backend reports its
statistics when it exits, so nothing is left unreported.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import commits, emit, log, machine, start_postgres

CHANNEL = "geneva_drive_bench"


def one_phase(server, database: str, notifies: int, listening: bool) -> dict:  # type: ignore[no-untyped-def]
    import psycopg

    url = server.url(database, driver="postgresql")
    before = commits(url, database)
    listener = psycopg.connect(url, autocommit=True)
    sender = psycopg.connect(url, autocommit=True)
    try:
        if listening:
            listener.execute(f"LISTEN {CHANNEL}")
        cpu0 = server.cpu_s()
        for _ in range(notifies):
            sender.execute(f"NOTIFY {CHANNEL}, 'default'")
        # The listener's reads happen when its backend is signalled; give the last one time.
        deadline = time.monotonic() + 5
        while listening and time.monotonic() < deadline:
            if sum(1 for _ in listener.notifies(timeout=0.2, stop_after=notifies)) == 0:
                break
        cpu = server.cpu_s() - cpu0
    finally:
        listener.close()
        sender.close()
    time.sleep(0.5)  # the two backends exit and report their counters
    # The count includes the LISTEN and the counter's own reads: a few in thousands, left in.
    counted = commits(url, database) - before
    return {
        "bench": "notifycost",
        "listening": listening,
        "notifies": notifies,
        "commits_per_notify": round(counted / notifies, 3),
        "server_cpu_ms_per_notify": round(cpu * 1000 / notifies, 3),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notifies", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    server = start_postgres()
    results = []
    try:
        emit(bench="machine", **machine())
        database, _ = server.create_database("notify")
        for round_no in range(1, args.rounds + 1):
            for listening in (True, False):
                log(f"notifycost: round {round_no}, listening={listening}")
                result = one_phase(server, database, args.notifies, listening)
                result["round"] = round_no
                emit(**result)
                results.append(result)
    finally:
        server.stop()
    return results


if __name__ == "__main__":
    main()

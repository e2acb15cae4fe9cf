"""Dashboard pages at scale, over HTTP: the real ``geneva-drive dashboard`` at 1M workflows.

    .venv/bin/python benchmarks/dashboard.py                                  # embedded PG 18
    .venv/bin/python benchmarks/dashboard.py --server stock                   # Debian's PG 15
    .venv/bin/python benchmarks/dashboard.py --server stock --pg-data /var/tmp/gd-pg15  # kept
    .venv/bin/python benchmarks/dashboard.py --url postgresql+psycopg://…     # filled already

What users run is what is measured: the console script ``geneva-drive dashboard --read-only``
(uvicorn, this tree's ``src``), a PostgreSQL on loopback TCP with ``synchronous_commit=on``,
and a client that keeps one HTTP/1.1 connection open as a browser does. The command runs on
the wall clock, days after the fill's history ends, so its overview's last hour is empty;
``--clocks`` ``data`` (measured too by default) serves the same app with uvicorn on the
fill's "now", where the last hour holds the fill's last hour of work. The data is
benchmarks/admin.py's fixed fill (``fill``: ``--size`` workflows, ``--executions-per``
executions each, 10,000 live at every size, the rest history). With ``--pg-data`` the filled
database is kept in that directory and reused by the next run with the same size and fill
(its ``COMMENT`` records which), so a 1M / 10M fill (about a minute) is made once per server.

Pages: the overview, the workflows list (first page, filtered by state, by signal, by
failure), a deep page (a cursor in the middle of the history, also by state), the hero-id
search box (a random hero across the history each request), one workflow's page (a random
one each request) and ``/waiting``. Each page requested ``--requests`` times after one
warm-up request; p50/p95 in ms of the whole request (send to last byte read). JSON lines on
stdout, one per page with the host's load average; progress on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    REPO,
    Postgres,
    add_server_arguments,
    emit,
    free_port,
    log,
    machine,
    percentile,
    start_server,
    wait_for,
)
from admin import EVERY, FILL_EXECUTIONS, FILL_SIDES, FILL_WORKFLOWS, NOW, fill

from geneva_drive.admin.find import encode_cursor


def pages(n: int) -> dict[str, str]:
    """Page name → URL; ``{id}`` and ``{hero}`` are drawn across the whole history."""
    deep = encode_cursor(NOW - n * EVERY / 2, n // 2, True)
    return {
        "overview": "/",
        "workflows first": "/workflows",
        "workflows state=paused": "/workflows?state=paused",
        "workflows signal=approved": "/workflows?signal=approved",
        "workflows failed": "/workflows?failed=yes",
        "workflows deep": "/workflows?" + urlencode({"after": deep}),
        "workflows deep state=finished": "/workflows?"
        + urlencode({"state": "finished", "after": deep}),
        "hero search": "/workflows?hero_id={hero}",
        "workflow": "/workflows/{id}",
        "waiting": "/waiting",
    }


def time_page(conn: http.client.HTTPConnection, url: str, n: int, requests: int) -> dict[str, Any]:
    picks = random.Random(n)
    urls = []
    for _ in range(requests + 1):
        i = picks.randint(1, n)
        urls.append(url.format(id=i, hero=i))  # the fill's hero id of workflow i is str(i)
    get(conn, urls[0])  # warm-up
    samples = []
    size = 0
    for one in urls[1:]:
        t0 = time.perf_counter()
        size = len(get(conn, one))
        samples.append((time.perf_counter() - t0) * 1000)
    return {
        "bytes": size,
        "p50_ms": round(percentile(samples, 50) or 0, 1),
        "p95_ms": round(percentile(samples, 95) or 0, 1),
        "max_ms": round(max(samples), 1),
    }


def get(conn: http.client.HTTPConnection, url: str) -> bytes:
    conn.request("GET", url)
    response = conn.getresponse()
    body = response.read()
    if response.status != 200:
        raise SystemExit(f"GET {url}: {response.status}\n{body[:2000].decode(errors='replace')}")
    return body


# -- the database: filled once per server, reused when the fill is the same -----------------


def fill_signature(n: int, per: int) -> str:
    """Names the data a database holds: the size, and the fill's statements (a changed fill
    makes a kept database stale)."""
    digest = hashlib.sha256((FILL_WORKFLOWS + FILL_EXECUTIONS + FILL_SIDES).encode()).hexdigest()
    return f"geneva-drive bench fill n={n} per={per} sql={digest[:12]}"


def filled_database(server: Postgres, n: int, per: int) -> str:
    """The URL of a database on ``server`` holding admin.py's fill of ``n`` workflows."""
    import geneva_drive

    name = f"gd_dashboard_{n}_{per}"
    signature = fill_signature(n, per)
    found = server.admin(
        f"SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = '{name}'"
    )
    url = server.url(name)
    if found and found[0][0] == signature:
        log(f"reusing {name} ({signature})")
        return url
    server.drop_database(name)
    server.admin(f'CREATE DATABASE "{name}"')
    engine = geneva_drive.create_engine(url)
    geneva_drive.install(engine)
    engine.dispose()
    log(f"filling {name}: {n:,} workflows, {n * per:,} executions")
    emit(what="fill", size=n, seconds=fill(server, name, n, per))
    server.admin(f"COMMENT ON DATABASE \"{name}\" IS '{signature}'")
    return url


def server_facts(url: str) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as conn:
        facts = {"version": conn.execute("SHOW server_version").fetchone()[0]}  # type: ignore[index]
        for name in ("jit", "max_parallel_workers_per_gather", "synchronous_commit"):
            facts[name] = conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
    return facts


# -- the dashboard process ---------------------------------------------------------------------


# ``--clock data``: the same app and server as the command's (``create_app``, uvicorn), with the
# clock frozen at the fill's "now", so the overview's last hour holds the fill's last hour of
# work; the command itself runs on the wall clock, days after the fill's history ends.
FROZEN = """
import sys
from datetime import datetime
import uvicorn
import geneva_drive
from geneva_drive.core.clock import FrozenClock
from geneva_drive.dashboard import create_app
from geneva_drive.runtime.configure import configure

engine = geneva_drive.create_engine(sys.argv[1])
configure(engine=engine)
app = create_app(engine=engine, clock=FrozenClock(datetime.fromisoformat(sys.argv[3])))
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


def start_dashboard(url: str, src: Path, clock: str) -> tuple[subprocess.Popen[bytes], int]:
    """``geneva-drive dashboard --read-only`` (``clock`` "wall"), or the same app on the
    fill's frozen "now" (``clock`` "data")."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(src), GENEVA_DRIVE_DATABASE_URL=url)
    script = str(Path(sys.executable).parent / "geneva-drive")
    argv = [script, "dashboard", "--read-only", "--port", str(port)]
    if clock == "data":
        argv = [sys.executable, "-c", FROZEN, url, str(port), NOW.isoformat()]
    elif clock != "wall":
        raise SystemExit(f"--clocks: {clock!r} is neither wall nor data")
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up() -> bool:
        if process.poll() is not None:
            raise SystemExit(f"geneva-drive dashboard exited with {process.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/static/does-not-exist")
            conn.getresponse().read()
            return True
        except OSError:
            return False

    wait_for(up, 60, what="the dashboard to listen")
    return process, port


def measure(url: str, n: int, requests: int, src: Path, label: str, clocks: list[str]) -> None:
    facts = server_facts(url)
    emit(kind="server", server=label, **facts)
    log(f"{label}: PostgreSQL {facts['version']}, jit {facts['jit']}")
    for clock in clocks:
        process, port = start_dashboard(url, src, clock)
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            for name, page in pages(n).items():
                row = time_page(conn, page, n, requests)
                emit(
                    kind="page",
                    server=label,
                    clock=clock,
                    size=n,
                    page=name,
                    url=page,
                    **row,
                    loadavg=os.getloadavg(),
                )
                log(f"  {clock} {name:<30} p50 {row['p50_ms']:>7} ms  p95 {row['p95_ms']:>7} ms")
            conn.close()
        finally:
            process.terminate()
            process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="workflows")
    parser.add_argument("--executions-per", type=int, default=10)
    parser.add_argument("--requests", type=int, default=30, help="per page, after a warm-up")
    parser.add_argument("--url", help="a database already filled by admin.py's fill at --size")
    parser.add_argument("--src", type=Path, default=REPO / "src", help="the tree to serve")
    parser.add_argument(
        "--clocks",
        default="wall,data",
        help="wall: the command as users run it; data: the same app on the fill's 'now'",
    )
    add_server_arguments(parser)
    args = parser.parse_args()
    clocks = args.clocks.split(",")
    emit(
        kind="setup",
        machine=machine(),
        size=args.size,
        requests=args.requests,
        src=str(args.src),
        server=args.server,
        pg_data=str(args.pg_data or ""),
    )
    if args.url:
        measure(args.url, args.size, args.requests, args.src.resolve(), "--url", clocks)
        return
    server = start_server(args)  # durable: synchronous_commit on
    try:
        url = filled_database(server, args.size, args.executions_per)
        measure(url, args.size, args.requests, args.src.resolve(), args.server, clocks)
    finally:
        server.stop()


if __name__ == "__main__":
    main()

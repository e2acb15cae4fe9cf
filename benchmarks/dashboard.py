"""Dashboard pages at scale: each page's server-side time at 1M workflows / 10M executions.

    .venv/bin/python benchmarks/dashboard.py --sizes 1000000 --requests 50

The data is benchmarks/admin.py's (``fill``: the same live work at every size, the rest
history). The app (``geneva_drive.dashboard.create_app``, read-only, a frozen clock at the
data's "now") is called in-process through Starlette's TestClient, so a request's time is
routing, the admin calls and the template rendering, no network: the overview (stats), the
workflows list (first page, a deep page from a cursor in the middle of the history, filtered
by state, by signal, by failure), one workflow's page, the waiting page. Each URL requested
``--requests`` times after one warm-up request; p50/p95 in ms. JSON lines on stdout.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit, log, machine, percentile
from admin import EVERY, NOW, filled_databases
from starlette.testclient import TestClient

import geneva_drive
from geneva_drive.admin.find import encode_cursor
from geneva_drive.core.clock import FrozenClock
from geneva_drive.dashboard import create_app
from geneva_drive.runtime.configure import configure


def pages(n: int) -> dict[str, str]:
    """Page name → URL; the workflow pages pick workflows across the whole history."""
    deep = encode_cursor(NOW - n * EVERY / 2, n // 2, True)
    return {
        "overview": "/",
        "workflows first": "/workflows",
        "workflows deep": "/workflows?" + urlencode({"after": deep}),
        "workflows state=paused": "/workflows?state=paused",
        "workflows signal=approved": "/workflows?signal=approved",
        "workflows failed": "/workflows?failed=yes",
        "workflows deep state=finished": "/workflows?"
        + urlencode({"state": "finished", "after": deep}),
        "workflow": "/workflows/{id}",
        "waiting": "/waiting",
    }


def time_page(client: TestClient, url: str, n: int, requests: int) -> dict[str, Any]:
    picks = random.Random(n)
    urls = [url.format(id=picks.randint(1, n)) for _ in range(requests + 1)]
    status = client.get(urls[0]).status_code  # warm-up
    samples = []
    for one in urls[1:]:
        t0 = time.perf_counter()
        response = client.get(one)
        samples.append((time.perf_counter() - t0) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"GET {one}: {response.status_code}\n{response.text[:2000]}")
    return {
        "status": status,
        "bytes": len(response.content),
        "p50_ms": round(percentile(samples, 50) or 0, 2),
        "p95_ms": round(percentile(samples, 95) or 0, 2),
        "max_ms": round(max(samples), 2),
    }


def measure(engine: Any, n: int, requests: int) -> None:
    app = create_app(engine=engine, clock=FrozenClock(NOW))
    with TestClient(app) as client:
        for name, url in pages(n).items():
            row = {"size": n, "page": name, "url": url} | time_page(client, url, n, requests)
            emit(**row, loadavg=os.getloadavg())
            log(f"  {name:<30} p50 {row['p50_ms']:>8} ms  p95 {row['p95_ms']:>8} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000")
    parser.add_argument("--executions-per", type=int, default=10)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument(
        "--url", help="measure this database, already filled by fill() with --sizes' one size"
    )
    args = parser.parse_args()
    emit(machine=machine())
    if args.url:
        engine = geneva_drive.create_engine(args.url)
        configure(engine=engine)
        measure(engine, int(args.sizes), args.requests)
        return
    for engine, n in filled_databases(args.sizes, args.executions_per):
        measure(engine, n, args.requests)


if __name__ == "__main__":
    main()

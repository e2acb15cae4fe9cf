"""Celery: a chain of three no-op tasks per workflow on Redis, prefork pool.

Run by ``benchmarks/peers.py``:
    .venv-peers/bin/python benchmarks/peers/peer_celery.py --redis-url URL --workflows 2000
``--mode backlog``: all chains are sent first; then a ``celery worker --pool prefork
--concurrency <nproc>`` starts, and the clock runs from its ``worker_ready`` signal to the
last chain's end. ``--mode throughput``: the worker starts first, and this script's one
thread sends the chains one by one (one ``apply_async`` each) while it runs; the clock runs
from ``worker_ready`` to the last chain's end.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import emit, tree_gauges  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--workflows", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--mode", choices=["backlog", "throughput"], default="backlog")
    args = parser.parse_args()
    os.environ["GD_BENCH_REDIS_URL"] = args.redis_url

    import redis
    from celery import chain
    from peer_celery_app import app, one, three, two

    client = redis.Redis.from_url(args.redis_url)
    client.flushdb()

    def send() -> float:
        t_send = time.perf_counter()
        for i in range(args.workflows):
            chain(one.si(i), two.si(i), three.si(i)).apply_async()
        return time.perf_counter() - t_send

    send_s = send() if args.mode == "backlog" else 0.0

    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "peer_celery_app",
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            str(args.concurrency),
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        cwd=HERE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert worker.stderr is not None
    for line in worker.stderr:
        if "GDBENCH-READY" in line:
            # Its start (interpreter, imports, forking the pool) is not the steps' cost.
            cpu_at_ready = tree_gauges(worker.pid)["cpu_s"]
            break
    else:
        raise SystemExit("celery worker exited before it was ready")
    threading.Thread(target=lambda: [None for _ in worker.stderr], daemon=True).start()
    t0 = time.perf_counter()
    if args.mode == "throughput":
        send_s = send()
    app.close()
    try:
        while int(client.get("gdbench:done") or 0) < args.workflows:
            if time.perf_counter() - t0 > 600:
                raise SystemExit("celery: not done after 600 s")
            time.sleep(0.02)
        seconds = time.perf_counter() - t0
        gauges = tree_gauges(worker.pid)
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
    steps = 3 * args.workflows
    emit(
        bench="throughput",
        system="Celery chain (Redis/prefork)",
        load=args.mode,
        workflows=args.workflows,
        steps=steps,
        seconds=round(seconds, 3),
        workflows_per_s=round(args.workflows / seconds, 1),
        steps_per_s=round(steps / seconds, 1),
        send_s=round(send_s, 2),
        commits_per_step=None,
        cpu_ms_per_step=round((gauges["cpu_s"] - cpu_at_ready) * 1000 / steps, 3),
        peak_rss_mb=round(gauges["peak_rss_mb"], 1),
        processes=gauges["processes"],
        config=f"prefork concurrency={args.concurrency}, prefetch multiplier 64, no results",
    )


if __name__ == "__main__":
    main()

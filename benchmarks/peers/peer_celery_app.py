"""The Celery app for the chain benchmark (``celery -A peer_celery_app worker``).

Configuration from Celery's "Optimizing" guide for many short tasks: no result backend
(``task_ignore_result``), early acknowledgement (the default), a large prefetch multiplier,
and ``--without-gossip --without-mingle --without-heartbeat`` on the worker.
"""

from __future__ import annotations

import os
import sys

import redis
from celery import Celery
from celery.signals import worker_ready

BROKER = os.environ["GD_BENCH_REDIS_URL"]

app = Celery("gdbench", broker=BROKER)
app.conf.update(
    task_ignore_result=True,
    worker_prefetch_multiplier=int(os.environ.get("GD_BENCH_PREFETCH", "64")),
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

_client: redis.Redis | None = None


@app.task(name="gdbench.one")
def one(i: int) -> None:
    pass


@app.task(name="gdbench.two")
def two(i: int) -> None:
    pass


@app.task(name="gdbench.three")
def three(i: int) -> None:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(BROKER)
    _client.incr("gdbench:done")  # how the benchmark sees the chain finish


@worker_ready.connect
def _ready(**_: object) -> None:
    print("GDBENCH-READY", file=sys.stderr, flush=True)

"""The async workflows of ``async_io.py`` (``geneva-drive worker --app gd_async_app``).

One step each, awaiting one second of I/O: ``asyncio.sleep(1)``, or a GET to the script's slow
local HTTP server (``$GD_BENCH_HTTP_URL``, which answers after a second). A module of their
own: a worker that loads an async class starts its async lane, which the sync benchmarks'
workers (``gd_app``, ``gd_sync_sleep_app``) must not.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from geneva_drive import Workflow, step

IO_SECONDS = 1.0


class BenchAsyncSleep(Workflow):
    may_proceed_without_hero = True

    @step
    async def wait(self) -> None:
        await asyncio.sleep(IO_SECONDS)


class BenchAsyncHttp(Workflow):
    may_proceed_without_hero = True

    @step
    async def call(self) -> None:
        status = await get(os.environ["GD_BENCH_HTTP_URL"])
        if status != 200:
            raise RuntimeError(f"the slow server answered {status}")


# One HTTP client per event loop (the worker has one: its async lane's), with no limit on its
# connections: httpx's default pool of 100 would cap the steps in flight below
# --async-concurrency 200 and 500. httpx2 (an httpx) when installed; else raw asyncio streams.
_clients: dict[int, Any] = {}


async def get(url: str) -> int:
    try:
        import httpx2
    except ImportError:
        return await _get_raw(url)
    loop = id(asyncio.get_running_loop())
    client = _clients.get(loop)
    if client is None:
        limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
        client = _clients[loop] = httpx2.AsyncClient(limits=limits, timeout=60)
    response = await client.get(url)
    return int(response.status_code)


async def _get_raw(url: str) -> int:
    """GET over a fresh connection: HTTP/1.1, ``Connection: close``, the status line read."""
    host_port = url.split("//", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"GET / HTTP/1.1\r\nHost: {host_port}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        status_line = await reader.readline()
        await reader.read()  # the rest, until the server closes
        return int(status_line.split()[1])
    finally:
        writer.close()

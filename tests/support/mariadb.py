"""A throwaway MariaDB server for the test suite, and the databases on it.

The binaries come from Debian's `mariadb-server` package (`mariadbd`, `mariadb-install-db`);
the system service is never used or touched. One server runs per test session, started as a
child process of pytest with a fresh data directory under a `mkdtemp()` directory (in the
RAM-backed /dev/shm when there is one: CREATE/DROP TABLE there cost a tenth), listening
only on a unix socket there (`--skip-networking`), as root (`--user=root`). `stop()` shuts it
down and deletes the directory.

MariaDB has no `CREATE DATABASE … TEMPLATE`, so a per-test copy of the installed schema is
made by replaying the template's `SHOW CREATE TABLE` output (columns, generated columns,
indexes, foreign keys, charset: everything) into a fresh database and copying the rows of the
Alembic version table. That is a handful of DDL statements, several times faster than running
the migrations again.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

DRIVER = "mariadb+pymysql"
# 10.6 is the first MariaDB with SKIP LOCKED; the claim query of the worker needs it.
MINIMUM_VERSION = (10, 6)
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0

# Durability across a crash of the test server is not under test: no fsync, no binary log, no
# doublewrite, one shared tablespace (CREATE/DROP TABLE then creates and removes no files).
_SERVER_OPTIONS = [
    "--skip-networking",
    "--skip-log-bin",
    "--skip-name-resolve",
    "--innodb-flush-log-at-trx-commit=0",
    "--innodb-doublewrite=0",
    "--innodb-file-per-table=0",
    "--innodb-buffer-pool-size=128M",
    "--innodb-log-file-size=32M",
    "--innodb-fast-shutdown=2",
    "--character-set-server=utf8mb4",
    "--collation-server=utf8mb4_unicode_ci",
    "--max-connections=500",
    # The worker tests wait on row locks a little; a stuck test should fail, not hang for 50 s.
    "--innodb-lock-wait-timeout=20",
]


_ROOT_PREFIX = "gd-mariadb-"
# A directory of a session that died without stop() (SIGKILL) is removed by a later session
# once it is this old and its server is gone; younger ones may belong to a session starting up.
_STALE_AFTER_S = 600


class MariaDBUnavailable(RuntimeError):
    """The private MariaDB server could not be started."""


def unique_database_name(prefix: str = "gd_test") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _find(program: str) -> str | None:
    # Debian installs the server in /usr/sbin, which is not on every PATH (non-login shells).
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin", "/sbin"])
    return shutil.which(program, path=path)


@dataclass
class MariaDBServer:
    """A running private MariaDB server. Create with `start()`, end with `stop()`."""

    root: Path
    socket: Path
    version: str
    _process: subprocess.Popen[bytes]
    _admin: sa.Engine
    _stopped: bool = field(default=False)

    @classmethod
    def start(cls) -> MariaDBServer:
        """Start a server in a fresh temporary directory; raise MariaDBUnavailable if it won't."""
        server_bin = _find("mariadbd") or _find("mysqld")
        install_bin = _find("mariadb-install-db") or _find("mysql_install_db")
        if server_bin is None or install_bin is None:
            raise MariaDBUnavailable(
                "mariadbd / mariadb-install-db not found on PATH or in /usr/sbin; "
                "install Debian's mariadb-server package (apt-get install mariadb-server)"
            )
        _remove_stale_roots()
        root = Path(tempfile.mkdtemp(prefix=_ROOT_PREFIX, dir=_scratch_parent()))
        datadir, socket, log = root / "data", root / "mysqld.sock", root / "error.log"
        try:
            installed = subprocess.run(
                [
                    install_bin,
                    "--no-defaults",
                    f"--datadir={datadir}",
                    "--user=root",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            shutil.rmtree(root, ignore_errors=True)
            raise MariaDBUnavailable(f"{install_bin} failed: {exc}") from exc
        if installed.returncode != 0:
            shutil.rmtree(root, ignore_errors=True)
            raise MariaDBUnavailable(
                f"{install_bin} exited {installed.returncode}:\n"
                f"{(installed.stdout + installed.stderr)[-2000:]}"
            )

        process = subprocess.Popen(
            [
                server_bin,
                "--no-defaults",  # never read /etc/mysql: this server is ours alone
                f"--datadir={datadir}",
                f"--socket={socket}",
                f"--pid-file={root / 'mysqld.pid'}",
                f"--log-error={log}",
                f"--tmpdir={root}",
                "--user=root",
                *_SERVER_OPTIONS,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        admin = sa.create_engine(_url(socket, None), isolation_level="AUTOCOMMIT", pool_size=1)

        def fail(reason: str) -> MariaDBUnavailable:
            _terminate(process)
            admin.dispose()
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
            shutil.rmtree(root, ignore_errors=True)
            return MariaDBUnavailable(f"{reason}\nserver log (tail):\n{tail}")

        # A condition wait with a deadline: the server accepts connections on the socket.
        deadline = time.monotonic() + START_TIMEOUT_S
        version: str | None = None
        while version is None:
            if process.poll() is not None:
                raise fail(f"mariadbd exited with status {process.returncode} while starting")
            if socket.exists():
                try:
                    with admin.connect() as conn:
                        version = str(conn.exec_driver_sql("SELECT VERSION()").scalar_one())
                except sa.exc.OperationalError:
                    pass
            if version is None:
                if time.monotonic() > deadline:
                    raise fail(f"mariadbd did not accept connections within {START_TIMEOUT_S} s")
                time.sleep(0.05)
        numbers = tuple(int(part) for part in version.split("-")[0].split(".")[:2])
        if numbers < MINIMUM_VERSION:
            raise fail(
                f"MariaDB {version} is too old: geneva-drive needs MariaDB >= "
                f"{'.'.join(map(str, MINIMUM_VERSION))} (SKIP LOCKED)"
            )
        return cls(root=root, socket=socket, version=version, _process=process, _admin=admin)

    def url(self, database: str | None) -> str:
        """SQLAlchemy URL (PyMySQL driver, unix socket) for a database on this server."""
        return _url(self.socket, database)

    def create_database(self, name: str, *, template: str | None = None) -> str:
        """Create an empty database (or a copy of `template`'s tables) and return its URL."""
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {_quote(name)}")
            if template is not None:
                self._copy_tables(conn, template, name)
        return self.url(name)

    def _copy_tables(self, conn: sa.Connection, template: str, target: str) -> None:
        tables = [
            row[0]
            for row in conn.exec_driver_sql(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = %s AND table_type = 'BASE TABLE' ORDER BY table_name",
                (template,),
            )
        ]
        # Foreign keys may point at tables not created yet; the statements name them
        # unqualified, so they resolve in the target database once USE'd.
        conn.exec_driver_sql(f"USE {_quote(target)}")
        conn.exec_driver_sql("SET SESSION foreign_key_checks = 0")
        try:
            for table in tables:
                create = conn.exec_driver_sql(
                    f"SHOW CREATE TABLE {_quote(template)}.{_quote(table)}"
                ).one()[1]
                conn.exec_driver_sql(create)
                conn.exec_driver_sql(
                    f"INSERT INTO {_quote(table)} SELECT * FROM {_quote(template)}.{_quote(table)}"
                )
        finally:
            conn.exec_driver_sql("SET SESSION foreign_key_checks = 1")

    def drop_database(self, name: str) -> None:
        """Drop a database, disconnecting anything a test left connected to it."""
        with self._admin.connect() as conn:
            # DROP DATABASE waits for the metadata locks of open transactions: end them first.
            ids = conn.exec_driver_sql(
                "SELECT id FROM information_schema.processlist "
                "WHERE db = %s AND id <> CONNECTION_ID()",
                (name,),
            ).scalars()
            for connection_id in ids:
                # It may have ended by itself in the meantime.
                with contextlib.suppress(sa.exc.OperationalError):
                    conn.exec_driver_sql(f"KILL CONNECTION {int(connection_id)}")
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {_quote(name)}")

    def database_names(self) -> set[str]:
        with self._admin.connect() as conn:
            return set(conn.exec_driver_sql("SHOW DATABASES").scalars())

    def stop(self) -> None:
        """Stop the server and delete its data directory. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        self._admin.dispose()
        _terminate(self._process)
        shutil.rmtree(self.root, ignore_errors=True)


def _scratch_parent() -> str | None:
    """/dev/shm if usable (tmpfs: no disk I/O at all), else the default temporary directory."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def _remove_stale_roots() -> None:
    """Delete data directories left by killed sessions (in /dev/shm they hold on to RAM)."""
    parent = Path(_scratch_parent() or tempfile.gettempdir())
    for root in parent.glob(f"{_ROOT_PREFIX}*"):
        try:
            if time.time() - root.stat().st_mtime < _STALE_AFTER_S:
                continue
            pid = int((root / "mysqld.pid").read_text().strip())
        except FileNotFoundError:
            pid = None  # never started, or already cleaned up
        except (OSError, ValueError):
            continue
        if pid is not None:
            try:
                os.kill(pid, 0)
                continue  # its server still runs: another session's
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
        shutil.rmtree(root, ignore_errors=True)


def _die_with_parent() -> None:
    """In the server's process before exec: SIGTERM it when pytest dies without stopping it."""
    with contextlib.suppress(Exception):  # Linux only (prctl); elsewhere stop() must do
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def _terminate(process: subprocess.Popen[bytes]) -> None:
    # SIGTERM is mariadbd's orderly shutdown; --innodb-fast-shutdown=2 makes it quick.
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _url(socket: Path, database: str | None) -> str:
    url = sa.URL.create(
        DRIVER,
        username="root",
        database=database,
        query={"unix_socket": str(socket), "charset": "utf8mb4"},
    )
    return url.render_as_string(hide_password=False)

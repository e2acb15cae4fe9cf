"""Losing a database connection on purpose, as a server restart or an operator's kill would."""

from __future__ import annotations

import time

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session


def lose_connection(session: Session) -> None:
    """Cut the session's connection under it, the way a server restart or a kill would."""
    connection = session.connection()
    dialect = connection.dialect.name
    if dialect == "sqlite":  # no server to lose: close the file handle underneath
        dbapi = connection.connection.dbapi_connection
        assert dbapi is not None
        dbapi.close()
        return
    pid = connection.execute(text(_OWN_ID[dialect])).scalar_one()
    kill_backend(connection.engine, int(pid))


_OWN_ID = {"postgresql": "SELECT pg_backend_pid()", "mariadb": "SELECT CONNECTION_ID()"}


def kill_backend(engine: Engine, pid: int) -> None:
    """End server connection ``pid`` from another connection; return once it is gone."""
    with engine.connect() as other:
        if engine.dialect.name == "postgresql":
            # With a timeout, pg_terminate_backend waits until the backend has exited.
            other.execute(text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid})
            return
        other.execute(text(f"KILL {pid}"))
        gone = text("SELECT count(*) FROM information_schema.processlist WHERE id = :pid")
        deadline = time.monotonic() + 10
        while other.execute(gone, {"pid": pid}).scalar_one():
            assert time.monotonic() < deadline, f"connection {pid} outlived KILL"
            time.sleep(0.01)  # polling a condition with a deadline

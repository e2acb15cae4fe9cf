"""Counting what a piece of code costs the database: statements, commits, connections, and
the NOTIFYs a PostgreSQL listener receives."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import Engine, event

from tests.worker._support import DEADLINE

CHANNEL = "geneva_drive"  # queries.coordination.NOTIFY_CHANNEL
SENTINEL = "budget-sentinel"


@dataclass
class Cost:
    statements: list[str] = field(default_factory=list)  # full SQL, in order
    commits: int = 0
    checkouts: int = 0  # pooled connections handed out

    @property
    def first_words(self) -> list[str]:
        """Upper-cased first word of each statement but SQLite's ``BEGIN IMMEDIATE`` (the
        transaction's, sent as a statement by geneva-drive's engine; psycopg and PyMySQL
        begin without one that a listener sees)."""
        words = [s.lstrip().split()[0].upper() for s in self.statements]
        return [w for w in words if w != "BEGIN"]

    @property
    def notifies(self) -> int:
        return sum("pg_notify" in s for s in self.statements)


@contextmanager
def cost_of(engine: Engine) -> Iterator[Cost]:
    """Everything ``engine`` sends while inside (a listener: every statement takes
    SQLAlchemy's path, the DBAPI short path included)."""
    cost = Cost()

    def on_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        cost.statements.append(statement)

    def on_commit(conn: Any) -> None:
        cost.commits += 1

    def on_checkout(*_: Any) -> None:
        cost.checkouts += 1

    event.listen(engine, "before_cursor_execute", on_execute)
    event.listen(engine, "commit", on_commit)
    event.listen(engine.pool, "checkout", on_checkout)
    try:
        yield cost
    finally:
        event.remove(engine, "before_cursor_execute", on_execute)
        event.remove(engine, "commit", on_commit)
        event.remove(engine.pool, "checkout", on_checkout)


class Listener:
    """``LISTEN geneva_drive`` on a connection of its own (PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        raw = engine.raw_connection()
        self._driver: psycopg.Connection[Any] = raw.driver_connection
        raw.detach()  # LISTEN state must never go back into the pool
        self._driver.autocommit = True
        self._driver.execute(f"LISTEN {CHANNEL}")
        self._sender = psycopg.connect(self._driver.info.dsn, autocommit=True)

    def received_before_a_sentinel(self) -> list[tuple[str, int]]:
        """(payload, pid of the sending backend) of the notifications received so far: a
        NOTIFY sent now from another connection arrives after every notification committed
        before it, so once it is here nothing earlier is still on its way."""
        self._sender.execute("SELECT pg_notify(%s, %s)", (CHANNEL, SENTINEL))
        received: list[tuple[str, int]] = []
        for note in self._driver.notifies(timeout=DEADLINE):
            if note.payload == SENTINEL:
                return received
            received.append((note.payload, note.pid))
        raise AssertionError(f"the sentinel NOTIFY did not arrive within {DEADLINE}s")

    def close(self) -> None:
        self._sender.close()
        self._driver.close()


@contextmanager
def listening(engine: Engine) -> Iterator[Listener]:
    listener = Listener(engine)
    try:
        yield listener
    finally:
        listener.close()

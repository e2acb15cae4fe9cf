"""The interface every database's module implements, with the portable behaviour as defaults."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import sqlalchemy
from sqlalchemy import Connection, Engine, Insert, Table, insert
from sqlalchemy.orm import Session


class Dialect:
    """What one database can do, and the parts of geneva-drive that differ on it.

    The flags say which statements the query layer writes for this database; each names the
    feature it stands for, so a caller reads "can it" rather than "is it PostgreSQL".
    """

    names: ClassVar[tuple[str, ...]] = ()

    # LISTEN/NOTIFY: starts, signals and finished steps wake idle workers at once, inside the
    # writing transaction; elsewhere idle workers poll.
    notifies: ClassVar[bool] = False
    # Data-modifying CTEs: a step starts, completes (and the next one is claimed) and a signal
    # is delivered in one statement each, and a workflow is inserted with its first
    # execution and its wake-up in one.
    combined_writes: ClassVar[bool] = False
    # ``FOR UPDATE OF <workflow> SKIP LOCKED`` over small windows of due rows, in claim order.
    windowed_claim: ClassVar[bool] = False
    # No ``FOR UPDATE OF``: a claim reads a few due rows without locks, then locks their
    # workflow rows one by one with ``SKIP LOCKED``.
    claims_candidates_then_locks: ClassVar[bool] = False
    # ``INSERT … ON CONFLICT DO NOTHING``: a row the unique index refuses is skipped, not an
    # error that undoes the statement.
    skips_conflicting_inserts: ClassVar[bool] = True
    # A DELETE with an ``IN (sub-query)`` is run as a semi-join; else it is written as a join.
    deletes_by_semi_join: ClassVar[bool] = True
    # A new execution's ``attempt`` worked out by its own INSERT (``INSERT … SELECT`` from the
    # executions table: ``queries.executions.new_row_source``); else it is stored NULL and a
    # step's span counts it with a read, only when tracing.
    counts_attempt_on_insert: ClassVar[bool] = True
    # One writer at a time for the whole database (no row locks): geneva-drive's transactions
    # take the write lock when they begin.
    single_writer: ClassVar[bool] = False
    # Step threads a worker runs when not told: one writer gains nothing from more.
    default_concurrency: ClassVar[int] = 4
    # The asyncio driver a worker's event loop runs async steps over (``db.async_engine_like``):
    # SQLAlchemy's ``backend+driver`` suffix, or None where none is supported.
    async_driver: ClassVar[str | None] = None

    def create_engine(self, url: sqlalchemy.URL, **kwargs: Any) -> Engine:
        """``sqlalchemy.create_engine`` with what this database needs set on ``url``."""
        url, kwargs = self.engine_arguments(url, kwargs)
        return sqlalchemy.create_engine(url, **kwargs)

    def engine_arguments(
        self, url: sqlalchemy.URL, kwargs: dict[str, Any]
    ) -> tuple[sqlalchemy.URL, dict[str, Any]]:
        """``url`` and the engine's keyword arguments with what this database needs set: for
        a sync engine and an async one (``create_async_engine``) alike."""
        return url, kwargs

    def prepare(self, engine: Engine) -> Engine:
        """Make an application's engine safe for concurrent workflows. Idempotent."""
        return engine

    def immediate_transactions(self, engine: Engine) -> Engine:
        """``engine`` with transactions that hold the write lock from their start (a database
        with a single writer), else ``engine`` itself."""
        return engine

    def for_workers(self, engine: Engine) -> Engine:
        """The engine geneva-drive's own sessions use."""
        return engine

    def take_write_lock(self, session: Session) -> None:
        """Make ``session``'s transaction hold the lock its next writes need (single writer)."""

    def insert_skipping_conflicts(self, table: Table) -> Insert:
        """An INSERT into ``table`` that skips rows its unique indexes refuse, where the
        database can say so (see ``skips_conflicting_inserts``)."""
        return insert(table)

    def insert_keeping_existing(self, table: Table) -> Insert:
        """An INSERT into ``table`` that leaves a row whose primary key exists as it is, with
        no error and no savepoint (``engine.limits`` creates a key's rows with it)."""
        return self.insert_skipping_conflicts(table)

    def try_housekeeping_lock(self, connection: Connection) -> bool:
        """Take the cluster-wide housekeeping lock on ``connection`` if free; never waits.
        Released by :meth:`release_housekeeping_lock` or when the connection closes."""
        return True

    def release_housekeeping_lock(self, connection: Connection) -> None:
        pass

    def notify(self, connection: Connection, channel: str, payload: str) -> None:
        """Wake listeners of ``channel`` when ``connection``'s transaction commits."""
        raise NotImplementedError(f"{type(self).__name__} has no NOTIFY")

    @contextmanager
    def short_statements(self, session: Session) -> Iterator[None]:
        """Plan the block's statements in ``session``'s transaction as the short reads they
        are; the transaction plans as before after it. (Elsewhere: nothing to change.)"""
        yield

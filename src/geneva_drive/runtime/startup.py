"""Before a long-running command starts, and while it runs: is the database there, and ours?

At startup (``worker``, ``housekeeping``, ``dispatch``, ``Worker.run()``):

- an unreachable database is retried with backoff for a bounded time (a database restarting
  with the application's containers is normal), then reported in one line;
- a database without the geneva-drive schema, or with a schema older or newer than this
  package's migrations, is reported at once, naming both revisions and the fix: nothing a
  worker would do there can succeed, and retrying would only print tracebacks.

While running, :class:`Outages` turns a lost database into one line when it goes and one line
when it is back, with a growing pause between attempts in between.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from geneva_drive.core.errors import GenevaDriveError
from geneva_drive.runtime.worker_options import DEFAULT_WAIT_SECONDS
from geneva_drive.storage.queries import is_transient
from geneva_drive.storage.revision import HEAD_REVISION, current_revision

log = logging.getLogger("geneva_drive.startup")

FIRST_RETRY_SECONDS = 0.25
MAX_RETRY_SECONDS = 5.0


class StartupError(GenevaDriveError):
    """A long-running command cannot start; the message says why and what to do."""


class DatabaseUnreachable(StartupError):
    """The database did not accept a connection within the startup wait."""


class SchemaMismatch(StartupError):
    """The database has no geneva-drive schema, or one of another package version."""


def check_database(engine: Engine, *, wait: float = DEFAULT_WAIT_SECONDS) -> None:
    """Wait (up to ``wait`` seconds) for the database, then check its schema revision."""
    wait_for_database(engine, wait=wait)
    check_schema(engine)


def wait_for_database(
    engine: Engine,
    *,
    wait: float = DEFAULT_WAIT_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    deadline = time.monotonic() + wait
    delay = FIRST_RETRY_SECONDS
    where = engine.url.render_as_string(hide_password=True)
    while True:
        try:
            with engine.connect():
                return
        except DBAPIError as error:
            if time.monotonic() + delay > deadline:
                waited = f" after {wait:g} s" if wait > 0 else ""
                raise DatabaseUnreachable(
                    f"cannot reach the database at {where}{waited}: "
                    f"{first_line(error)}; check --database-url (GENEVA_DRIVE_DATABASE_URL) "
                    "and that the server is up"
                ) from error
            if delay == FIRST_RETRY_SECONDS:
                log.warning(
                    "database at %s unreachable (%s); retrying for up to %g s",
                    where,
                    first_line(error),
                    wait,
                )
        sleep(delay)
        delay = min(delay * 2, MAX_RETRY_SECONDS)


def check_schema(engine: Engine) -> None:
    """Raise :class:`SchemaMismatch` unless the schema is at this package's head revision."""
    head = HEAD_REVISION
    current = current_revision(engine)
    if current == head:
        return
    # Only a mismatch needs the migration scripts (Alembic): is the database's revision ours?
    from geneva_drive.storage.migrate import is_known_revision

    fix = "run `geneva-drive migrate --database-url …` (or geneva_drive.install(engine)) first"
    if current is None:
        raise SchemaMismatch(
            f"the database has no geneva-drive schema (no revision; this package's migrations "
            f"end at {head}); {fix}"
        )
    if not is_known_revision(current):
        raise SchemaMismatch(
            f"the database's geneva-drive schema is at revision {current}, which this "
            f"package does not know (its migrations end at {head}): a newer geneva-drive "
            "migrated it; upgrade geneva-drive here to the version that did"
        )
    raise SchemaMismatch(
        f"the database's geneva-drive schema is at revision {current}, older than this "
        f"package's {head}; {fix}"
    )


def first_line(error: BaseException) -> str:
    """The driver's own message, first line only (SQLAlchemy's wrapper adds the SQL and a URL)."""
    orig = getattr(error, "orig", None) or error
    text = str(orig).strip().splitlines()
    return text[0] if text else type(orig).__name__


def is_outage(error: BaseException) -> bool:
    """A lost or refused connection, as opposed to a lock conflict or a bad statement."""
    if not isinstance(error, DBAPIError):
        return False
    if error.connection_invalidated:
        return True
    # Deadlocks, lock timeouts and "database is locked" are OperationalErrors too, but the
    # database is there: they are retried as they always were.
    return isinstance(error, OperationalError | InterfaceError) and not is_transient(error)


class Outages:
    """One worker's view of the database going away and coming back, shared by its threads.

    Every thread that hits a lost connection asks :meth:`failed` how long to pause; only the
    first failure of an outage is logged, and the first success after it (:meth:`ok`) logs
    that the database is back. The pause doubles from ``first`` up to ``cap``.
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        first: float = FIRST_RETRY_SECONDS,
        cap: float = MAX_RETRY_SECONDS,
    ) -> None:
        self._log = logger
        self._first = first
        self._cap = cap
        self._lock = threading.Lock()
        self._since: float | None = None
        self._back_at = float("-inf")  # when the last outage ended
        self._delay = first
        self.count = 0  # outages seen
        self.failures = 0  # failed attempts, over all outages

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, error: BaseException, started: float | None = None) -> float:
        """Record a failed attempt; returns the pause before the next one.

        ``started`` (``time.monotonic()`` when the attempt began): an attempt that began
        before the last outage ended — one thread's claim, the heartbeat, LISTEN, on a
        connection from before — fails late, after another thread already saw the database
        back. That is the old outage's tail, not a new outage.
        """
        with self._lock:
            self.failures += 1
            if self._since is None and started is not None and started <= self._back_at:
                return self._first
            if self._since is None:
                self._since = time.monotonic()
                self._delay = self._first
                self.count += 1
                self._log.warning(
                    "database unavailable (%s); retrying with backoff until it is back",
                    first_line(error),
                )
            else:
                self._delay = min(self._delay * 2, self._cap)
            return self._delay

    def ok(self, started: float | None = None) -> None:
        """Record a successful round trip: ends the outage, if there was one.

        ``started``: when the attempt began. One begun before the outage was noticed may
        still finish on a connection the outage has not reached yet (a proxy or partition
        cuts connections one by one); that says nothing about the database being back.
        """
        with self._lock:  # uncontended but for an outage's end: cheap next to a claim
            if self._since is None:
                return
            if started is not None and started < self._since:
                return
            self._back_at = time.monotonic()
            lasted = self._back_at - self._since
            self._since = None
            self._log.info("database is back after %.1f s; carrying on", lasted)

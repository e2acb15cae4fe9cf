"""The worker's heartbeat: lease renewal on a connection reserved for it.

The connection is checked out when the worker starts, before any step thread takes one, and
kept: a renewal never waits for a connection behind busy step threads (a wait as long as the
pool's timeout would let the leases expire under running steps, and another worker would
recover those steps and run them a second time). After a failure the connection is dropped
and a new one is checked out at the next beat.
"""

from __future__ import annotations

import contextlib
import logging
import time
from datetime import timedelta

from sqlalchemy import Connection

from geneva_drive.core.settings import Settings
from geneva_drive.engine import leases
from geneva_drive.storage.db import engine_for_workers


class Heartbeat:
    def __init__(
        self,
        config: Settings,
        owner: str,
        running: leases.RunningExecutions,
        lease: timedelta,
        interval: timedelta,
        log: logging.Logger,
    ) -> None:
        self.config, self.owner, self.running = config, owner, running
        self.lease, self.interval, self.log = lease, interval, log
        self._connection: Connection | None = None
        self._reserved = False  # between reserve() and close(): the worker is running

    def reserve(self) -> None:
        """Check out the heartbeat's connection now (the worker does, before its threads);
        it is kept, and checked out again after a failure, until :meth:`close`."""
        self._reserved = True
        self._connect()

    def _connect(self) -> None:
        if self._reserved and self._connection is None:
            self._connection = engine_for_workers(self.config.require_engine()).connect()

    def beat(self) -> int:
        """Renew the leases of the steps running now; how many. A renewal that fails, or
        that took longer than the interval, is logged at WARNING with the executions whose
        leases are at risk; a failure is raised after that."""
        at_risk = self.running.ids()
        started = time.monotonic()
        try:
            self._connect()  # none reserved (a beat outside a running worker): a pooled one
            renewed = leases.renew(
                self.config, self.owner, self.running, self.lease, bind=self._connection
            )
        except Exception:
            self._drop(broken=True)  # the failure may have broken it: a new one next time
            self._warn(at_risk, started, "failed")
            raise
        if at_risk and time.monotonic() - started > self.interval.total_seconds():
            self._warn(at_risk, started, "was late")
        if renewed.lost:
            self.log.warning(
                "the leases of step execution(s) %s ran out before this renewal, and another "
                "worker recovered them while they still run here: each step runs again there "
                "(its body runs twice), and this run's work is discarded when it ends (a "
                "resumable step's at its next checkpoint). Renewals came too late for a lease "
                "of %ss: see the warnings above, or lengthen the lease",
                ", ".join(map(str, renewed.lost)),
                self.lease.total_seconds(),
            )
        return renewed.renewed

    def _warn(self, at_risk: list[int], started: float, what: str) -> None:
        if not at_risk:
            return
        self.log.warning(
            "lease renewal %s after %.1fs (interval %ss, lease %ss): the leases of step "
            "execution(s) %s run out unless a later renewal reaches the database in time, "
            "and another worker may then recover and run them again",
            what,
            time.monotonic() - started,
            self.interval.total_seconds(),
            self.lease.total_seconds(),
            ", ".join(map(str, at_risk)),
        )

    def close(self, *, discard: bool = False) -> None:
        """Give the connection back for good (the worker stops). ``discard``: close it instead
        (settings replaced: the engine it came from may be disposed already, and a connection
        given back to a disposed pool would be left open until collected)."""
        self._reserved = False
        self._drop(broken=discard)

    def _drop(self, *, broken: bool) -> None:
        """Give the connection back; ``broken``: close it (never back into the pool)."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        with contextlib.suppress(Exception):  # a connection a restarted server has closed
            if broken:
                connection.invalidate()
            connection.close()

"""Leases held by a process that runs steps: which executions it runs now, and their heartbeat.

A lease (``lease_owner``, ``lease_expires_at``) is written when phase 1 starts a step. The
heartbeat renews only the executions this process's threads are running at that moment —
not every row leased to the owner id: a row the process lost track of (its phase 3 failed and
left it ``in_progress``) must run out like a dead worker's, or no lease recovery nor
housekeeping could ever touch it while the process lives. Used by ``geneva-drive worker`` and
by the Celery task (one owner id per Celery worker process).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import Connection

from geneva_drive.core.settings import Settings
from geneva_drive.storage.db import session_factory
from geneva_drive.storage.queries.claims import expire_leases, extend_leases, recovered_from


class RunningExecutions:
    """The execution each thread of this process is running now (at most one per thread).

    The executor reports each step it starts in the calling thread (``RunOptions.on_started``,
    the first step and each chained one); the runner calls :meth:`finished` when its call into
    the executor returns, whatever happened. The lock guards the dict only; it is never held
    across a query.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_thread: dict[object, int] = {}  # by thread id, or an async task's key

    def started(self, execution_id: int) -> None:
        with self._lock:
            self._by_thread[threading.get_ident()] = execution_id

    def finished(self) -> None:
        """The calling thread runs nothing any more."""
        with self._lock:
            self._by_thread.pop(threading.get_ident(), None)

    def started_as(self, key: object, execution_id: int) -> None:
        """:meth:`started` for a runner that is not a thread: a task of the async lane."""
        with self._lock:
            self._by_thread[key] = execution_id

    def finished_as(self, key: object) -> None:
        with self._lock:
            self._by_thread.pop(key, None)

    def ids(self) -> list[int]:
        with self._lock:
            return sorted(set(self._by_thread.values()))


@dataclass(frozen=True)
class Renewal:
    renewed: int  # leases pushed out
    lost: list[int] = field(default_factory=list)  # recovered by another worker meanwhile


def renew(
    config: Settings,
    owner: str,
    running: RunningExecutions,
    lease: timedelta,
    *,
    bind: Connection | None = None,
) -> Renewal:
    """Heartbeat: push out the leases of the executions ``running`` lists.

    ``bind``: a connection of the heartbeat's own (the worker's), so that a renewal never
    waits for one behind the step threads; else one from the pool. A lease it could not
    renew because lease recovery took the execution (the heartbeat was late by more than a
    lease) is returned as lost.
    """
    ids = running.ids()
    if not ids:
        return Renewal(0)  # nothing running: no transaction at all
    now = config.clock.now()
    factory = session_factory(config)
    with factory(bind=bind) if bind is not None else factory() as session, session.begin():
        renewed = extend_leases(session, owner, ids, now + lease, now)
        # Fewer renewed than asked: most often a step that finished meanwhile; only the
        # ones lease recovery ended are lost. Read in the renewal's transaction (one more
        # statement, on this rare path only).
        lost = recovered_from(session, ids) if renewed < len(ids) else []
    return Renewal(renewed, lost)


def release(config: Settings, owner: str) -> int:
    """Expire every lease ``owner`` holds now, so other processes recover those steps at once."""
    now = config.clock.now()
    with session_factory(config)() as session, session.begin():
        return expire_leases(session, owner, now)

"""Health at a glance, from index-backed queries whose cost follows the live work."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session


@dataclass(frozen=True)
class QueueBacklog:
    queue: str
    count: int  # scheduled rows past their due time
    oldest_due_age_seconds: float


@dataclass(frozen=True)
class OutcomeCount:
    workflow_type: str
    step: str
    outcome: str
    last_5m: int
    last_60m: int


@dataclass(frozen=True)
class Stats:
    at: datetime
    by_class_state: tuple[tuple[str, str, int], ...]  # (class, state, count): ongoing states
    overdue: tuple[QueueBacklog, ...]
    waiting: int
    overdue_waits: int  # waits past their deadline
    outcomes: tuple[OutcomeCount, ...]
    expired_leases: int
    finished_last_hour: int
    canceled_last_hour: int
    failed_last_hour: int  # executions that ended failed


def stats(session: Session, *, now: datetime | None = None) -> Stats:
    raise NotImplementedError

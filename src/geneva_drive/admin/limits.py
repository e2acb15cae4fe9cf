"""What the concurrency and rate limits are doing now: holders and waiters per key."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from geneva_drive.core.settings import settings
from geneva_drive.storage.queries import limits as q

RATE_WINDOW = timedelta(minutes=1)  # the rate keys' starts shown: those of the last minute


@dataclass(frozen=True)
class LimitHolder:
    execution_id: int
    workflow_id: int
    since: datetime


@dataclass(frozen=True)
class ConcurrencyKey:
    """One concurrency key: the steps holding its slots (``running``) and those waiting."""

    key: str
    running: int
    waiters: int
    holders: tuple[LimitHolder, ...]
    workflow_types: tuple[str, ...]


@dataclass(frozen=True)
class RateKey:
    key: str
    starts_last_minute: int
    last_start: datetime | None


@dataclass(frozen=True)
class Limits:
    at: datetime
    concurrency: tuple[ConcurrencyKey, ...]  # keys with a holder or a waiter, by key
    rate: tuple[RateKey, ...]  # keys with a start in the last minute, by key


def limits(session: Session, *, now: datetime | None = None) -> Limits:
    """Each concurrency key's running count, holders and waiters, and each rate key's recent
    starts, read from the limit tables (small: a row per holder, waiter and recent start)."""
    now = now if now is not None else settings().clock.now()
    keys = tuple(
        ConcurrencyKey(
            use.key,
            len(use.holders),
            use.waiters,
            tuple(LimitHolder(*holder) for holder in use.holders),
            use.workflow_types,
        )
        for use in q.concurrency_use(session)
    )
    rates = tuple(RateKey(*row) for row in q.rate_use(session, now - RATE_WINDOW))
    return Limits(now, keys, rates)

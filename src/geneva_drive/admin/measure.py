"""Health at a glance, from index-backed queries whose cost follows the live work."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from geneva_drive.core.settings import settings
from geneva_drive.core.states import ExecutionState, Outcome, WorkflowState
from geneva_drive.storage.dialects import dialect_of
from geneva_drive.storage.queries import admin as q

BUCKET = timedelta(minutes=5)
BUCKETS = 12  # the last hour, in BUCKET-long slices


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
class OutcomeBucket:
    """Executions that ended in ``[start, start + 5 min)``, by outcome."""

    start: datetime
    success: int
    failed: int
    other: int  # every other ending: continued, reattempted, skipped, canceled, timed out…

    @property
    def total(self) -> int:
        return self.success + self.failed + self.other


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
    # The last hour in 12 five-minute buckets, oldest first (the last one ends at ``at``).
    buckets: tuple[OutcomeBucket, ...]


def stats(session: Session, *, now: datetime | None = None) -> Stats:
    """The health of the whole system now, in six index-backed queries.

    Counts by class × state are of the *ongoing* states only (ready, performing, paused):
    finished and canceled workflows pile up until cleanup, so counting them would grow with
    the history; the last hour's are given instead (``admin.count`` gives capped totals).
    """
    now = now if now is not None else settings().clock.now()
    # Short reads, whatever the planner makes of the history's size (no JIT, no parallel
    # workers on PostgreSQL); the caller's transaction plans as before afterwards.
    with dialect_of(session).short_statements(session):
        return _stats(session, now)


def _stats(session: Session, now: datetime) -> Stats:
    hour_ago = now - timedelta(hours=1)
    ongoing: list[tuple[str, str, int]] = []
    ended = {WorkflowState.FINISHED: 0, WorkflowState.CANCELED: 0}
    for workflow_type, state, number in q.workflow_counts(session, hour_ago):
        if state in ended:
            ended[WorkflowState(state)] += number
        else:
            ongoing.append((workflow_type, state, number))
    starts = [hour_ago + BUCKET * n for n in range(BUCKETS)]
    outcomes, counts = _outcomes(q.recent_outcomes(session, hour_ago, starts[1:]))
    buckets = tuple(OutcomeBucket(start, *n) for start, n in zip(starts, counts, strict=True))
    waiting, overdue_waits = q.waiting_totals(session, now)
    return Stats(
        at=now,
        by_class_state=tuple(sorted(ongoing)),
        overdue=tuple(
            QueueBacklog(queue, int(number), max(0.0, (now - oldest).total_seconds()))
            for queue, number, oldest in q.overdue_by_queue(session, now)
        ),
        waiting=waiting,
        overdue_waits=overdue_waits,
        outcomes=outcomes,
        expired_leases=q.expired_lease_count(session, now),
        finished_last_hour=ended[WorkflowState.FINISHED],
        canceled_last_hour=ended[WorkflowState.CANCELED],
        failed_last_hour=sum(b.failed for b in buckets),
        buckets=buckets,
    )


def _outcomes(rows: Any) -> tuple[tuple[OutcomeCount, ...], list[list[int]]]:
    """Per (class, step, outcome): the last 5 minutes (the last bucket) and the hour; per
    bucket: [success, failed, other]."""
    totals: dict[tuple[str, str, str], list[int]] = {}
    buckets = [[0, 0, 0] for _ in range(BUCKETS)]
    for workflow_type, step, state, outcome, bucket, number in rows:
        counts = totals.setdefault((workflow_type, step, outcome or ""), [0, 0])
        counts[0] += int(number) if int(bucket) == BUCKETS - 1 else 0
        counts[1] += int(number)
        kind = 1 if state == ExecutionState.FAILED else 0 if outcome == Outcome.SUCCESS else 2
        buckets[int(bucket)][kind] += int(number)
    outcomes = tuple(
        OutcomeCount(workflow_type, step, outcome, recent, total)
        for (workflow_type, step, outcome), (recent, total) in sorted(totals.items())
    )
    return outcomes, buckets

"""``geneva_drive.admin``: the one management API; the CLI and the dashboard are thin layers.

Plain functions over the caller's ``Session`` (nothing here commits), except :func:`bulk`,
which takes an engine or a sessionmaker because each batch is its own transaction. Results are
frozen dataclasses of plain values; :func:`to_json` turns them into JSON-ready data.

- find: :func:`find` (keyset pages), :func:`count` (capped), :func:`for_hero`
- inspect: :func:`show` (a workflow's timeline)
- act: :func:`pause`, :func:`resume`, :func:`skip`, :func:`cancel`, :func:`retry`,
  :func:`resume_at`, :func:`signal`, and :func:`bulk` by filter
- measure: :func:`stats`
"""

from geneva_drive.admin.act import (
    ACTIONS,
    ActionResult,
    BulkResult,
    bulk,
    cancel,
    pause,
    resume,
    resume_at,
    retry,
    signal,
    skip,
)
from geneva_drive.admin.filters import WorkflowFilter
from geneva_drive.admin.find import BoundedCount, Page, WorkflowSummary, count, find, for_hero
from geneva_drive.admin.inspect import ActionEntry, ExecutionEntry, SignalEntry, Timeline, show
from geneva_drive.admin.jsonable import to_json
from geneva_drive.admin.measure import OutcomeBucket, OutcomeCount, QueueBacklog, Stats, stats
from geneva_drive.core.errors import AdminInputError, AdminNotFound, AdminRefused

__all__ = [
    "ACTIONS",
    "ActionEntry",
    "ActionResult",
    "AdminInputError",
    "AdminNotFound",
    "AdminRefused",
    "BoundedCount",
    "BulkResult",
    "ExecutionEntry",
    "OutcomeBucket",
    "OutcomeCount",
    "Page",
    "QueueBacklog",
    "SignalEntry",
    "Stats",
    "Timeline",
    "WorkflowFilter",
    "WorkflowSummary",
    "bulk",
    "cancel",
    "count",
    "find",
    "for_hero",
    "pause",
    "resume",
    "resume_at",
    "retry",
    "show",
    "signal",
    "skip",
    "stats",
    "to_json",
]

"""``geneva_drive.admin``: the one management API; the CLI and the dashboard are thin layers.

Plain functions over the caller's ``Session`` (nothing here commits), except :func:`bulk`,
which takes an engine or a sessionmaker because each batch is its own transaction. Results are
frozen dataclasses of plain values; :func:`to_json` turns them into JSON-ready data.

- find: :func:`find` (keyset pages), :func:`count` (capped); heroes: :func:`for_hero`
- inspect: :func:`show` (a workflow's timeline)
- act: :func:`pause`, :func:`resume`, :func:`skip`, :func:`cancel`, :func:`retry`,
  :func:`resume_at`, :func:`signal`, and :func:`bulk` by filter
- measure: :func:`stats`; limits: :func:`limits` (each limit key's holders and waiters)
- schedules: :func:`schedules`, :func:`pause_schedule`, :func:`resume_schedule`
- async twins on an ``AsyncSession`` (``admin.twins``): :func:`apause`, :func:`aresume`,
  :func:`askip`, :func:`acancel`, :func:`aretry`, :func:`aresume_at`, :func:`asignal`,
  :func:`afind`, :func:`acount`, :func:`afor_hero`, :func:`ashow`, :func:`astats`
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from geneva_drive.core import lazy

if TYPE_CHECKING:
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
    from geneva_drive.admin.family import Family, Relative
    from geneva_drive.admin.filters import WorkflowFilter
    from geneva_drive.admin.find import BoundedCount, Page, WorkflowSummary, count, find
    from geneva_drive.admin.heroes import for_hero
    from geneva_drive.admin.inspect import ActionEntry, ExecutionEntry, SignalEntry, Timeline, show
    from geneva_drive.admin.jsonable import to_json
    from geneva_drive.admin.limits import ConcurrencyKey, LimitHolder, Limits, RateKey, limits
    from geneva_drive.admin.measure import OutcomeBucket, OutcomeCount, QueueBacklog, Stats, stats
    from geneva_drive.admin.schedules import (
        ScheduleInfo,
        pause_schedule,
        resume_schedule,
        schedules,
    )
    from geneva_drive.admin.twins import (
        acancel,
        acount,
        afind,
        afor_hero,
        apause,
        aresume,
        aresume_at,
        aretry,
        ashow,
        asignal,
        askip,
        astats,
    )
    from geneva_drive.core.errors import AdminInputError, AdminNotFound, AdminRefused

# The largest page :func:`find` returns. Here, not in ``find``, so that the CLI's ``--limit``
# can state it without importing the queries.
MAX_PAGE = 1000

# Each name's module is imported when the name is first used (PEP 562): a command that only
# registers itself (``geneva-drive --help``) imports none of them.
_EXPORTS: dict[str, str] = {
    "ACTIONS": "geneva_drive.admin.act",
    "ActionEntry": "geneva_drive.admin.inspect",
    "ActionResult": "geneva_drive.admin.act",
    "AdminInputError": "geneva_drive.core.errors",
    "AdminNotFound": "geneva_drive.core.errors",
    "AdminRefused": "geneva_drive.core.errors",
    "BoundedCount": "geneva_drive.admin.find",
    "BulkResult": "geneva_drive.admin.act",
    "ConcurrencyKey": "geneva_drive.admin.limits",
    "ExecutionEntry": "geneva_drive.admin.inspect",
    "Family": "geneva_drive.admin.family",
    "LimitHolder": "geneva_drive.admin.limits",
    "Limits": "geneva_drive.admin.limits",
    "OutcomeBucket": "geneva_drive.admin.measure",
    "OutcomeCount": "geneva_drive.admin.measure",
    "Page": "geneva_drive.admin.find",
    "QueueBacklog": "geneva_drive.admin.measure",
    "RateKey": "geneva_drive.admin.limits",
    "Relative": "geneva_drive.admin.family",
    "ScheduleInfo": "geneva_drive.admin.schedules",
    "SignalEntry": "geneva_drive.admin.inspect",
    "Stats": "geneva_drive.admin.measure",
    "Timeline": "geneva_drive.admin.inspect",
    "WorkflowFilter": "geneva_drive.admin.filters",
    "WorkflowSummary": "geneva_drive.admin.find",
    "acancel": "geneva_drive.admin.twins",
    "acount": "geneva_drive.admin.twins",
    "afind": "geneva_drive.admin.twins",
    "afor_hero": "geneva_drive.admin.twins",
    "apause": "geneva_drive.admin.twins",
    "aresume": "geneva_drive.admin.twins",
    "aresume_at": "geneva_drive.admin.twins",
    "aretry": "geneva_drive.admin.twins",
    "ashow": "geneva_drive.admin.twins",
    "asignal": "geneva_drive.admin.twins",
    "askip": "geneva_drive.admin.twins",
    "astats": "geneva_drive.admin.twins",
    "bulk": "geneva_drive.admin.act",
    "cancel": "geneva_drive.admin.act",
    "count": "geneva_drive.admin.find",
    "find": "geneva_drive.admin.find",
    "for_hero": "geneva_drive.admin.heroes",
    "limits": "geneva_drive.admin.limits",
    "pause": "geneva_drive.admin.act",
    "pause_schedule": "geneva_drive.admin.schedules",
    "resume": "geneva_drive.admin.act",
    "resume_at": "geneva_drive.admin.act",
    "resume_schedule": "geneva_drive.admin.schedules",
    "retry": "geneva_drive.admin.act",
    "schedules": "geneva_drive.admin.schedules",
    "show": "geneva_drive.admin.inspect",
    "signal": "geneva_drive.admin.act",
    "skip": "geneva_drive.admin.act",
    "stats": "geneva_drive.admin.measure",
    "to_json": "geneva_drive.admin.jsonable",
}


class _AdminModule(types.ModuleType):
    """This package, keeping ``find`` the function: importing the submodule of the same name
    (``geneva_drive.admin.find``, which any module may do) binds the submodule on its package,
    which an eager ``from … import find`` used to overwrite at once."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _AdminModule


def __getattr__(name: str) -> Any:
    return lazy.load(__name__, _EXPORTS, globals(), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "ACTIONS",
    "ActionEntry",
    "ActionResult",
    "AdminInputError",
    "AdminNotFound",
    "AdminRefused",
    "BoundedCount",
    "BulkResult",
    "ConcurrencyKey",
    "ExecutionEntry",
    "Family",
    "LimitHolder",
    "Limits",
    "OutcomeBucket",
    "OutcomeCount",
    "Page",
    "QueueBacklog",
    "RateKey",
    "Relative",
    "ScheduleInfo",
    "SignalEntry",
    "Stats",
    "Timeline",
    "WorkflowFilter",
    "WorkflowSummary",
    "acancel",
    "acount",
    "afind",
    "afor_hero",
    "apause",
    "aresume",
    "aresume_at",
    "aretry",
    "ashow",
    "asignal",
    "askip",
    "astats",
    "bulk",
    "cancel",
    "count",
    "find",
    "for_hero",
    "limits",
    "pause",
    "pause_schedule",
    "resume",
    "resume_at",
    "resume_schedule",
    "retry",
    "schedules",
    "show",
    "signal",
    "skip",
    "stats",
    "to_json",
]

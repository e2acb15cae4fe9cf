"""Flow control inside a step: the signals ``self.pause()`` and friends raise.

They derive from ``BaseException`` so an application's ``except Exception:`` cannot swallow
them; the executor is the one place that catches them and turns them into outcomes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum


class Action(StrEnum):
    CANCEL = "cancel"
    PAUSE = "pause"
    REATTEMPT = "reattempt"
    SKIP = "skip"
    FINISH = "finish"
    SUSPEND = "suspend"


@dataclass
class FlowControl(BaseException):
    """Raised by a flow-control verb inside a step; never escapes the executor."""

    action: Action
    wait: timedelta | None = None
    rewind: bool = False
    # wait_until=: an aware UTC datetime; phase 3 turns it into a wait from its one ``now``.
    until: datetime | None = None

    def __str__(self) -> str:
        return f"flow control: {self.action}"

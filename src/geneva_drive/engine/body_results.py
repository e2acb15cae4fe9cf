"""What running a step body (phase 2) comes to, short of flow control.

The executor and the resumable runner (``iteration``) both return these; they live in a
module of their own so that neither of the two has to import the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any


@dataclass(frozen=True)
class Completed:
    """The body returned. ``result``: what it returned, encoded for storage (None: nothing)."""

    result: Any = None


@dataclass(frozen=True)
class Interrupted:
    """A resumable step stopped at a checkpoint; a successor continues from the cursor."""

    wait: timedelta | None = None
    until: datetime | None = None  # skip_to(wait_until=): phase 3 makes it a wait


@dataclass(frozen=True)
class Failed:
    error: BaseException

"""pytest plugin (auto-loaded when geneva-drive is installed): clock and settings fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from geneva_drive.core.clock import FrozenClock
from geneva_drive.runtime.configure import configured


@pytest.fixture
def frozen_clock() -> Iterator[FrozenClock]:
    """Freeze geneva-drive's clock for one test; ``frozen_clock.advance(seconds=30)`` moves it."""
    clock = FrozenClock()
    with configured(clock=clock):
        yield clock

"""The sync workflow of ``async_io.py`` (``geneva-drive worker --app gd_sync_sleep_app``).

The thread pool's version of ``gd_async_app.BenchAsyncSleep``: one step that blocks its step
thread for a second (``time.sleep(1)``), as a sync HTTP call would. A module of its own, so
that its worker loads no async class and starts no async lane.
"""

from __future__ import annotations

import time

from geneva_drive import Workflow, step

IO_SECONDS = 1.0


class BenchSyncSleep(Workflow):
    may_proceed_without_hero = True

    @step
    def wait(self) -> None:
        time.sleep(IO_SECONDS)

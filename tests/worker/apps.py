"""Workflows for the worker tests, importable by `geneva-drive worker --app tests.worker.apps`.

Steps that must block do so on files in the directory named by ``GD_TEST_SYNC_DIR`` (the
test creates the file when it wants the step to go on), always with a deadline.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, ClassVar

from geneva_drive import Workflow, resumable_step, step

DEADLINE_SECONDS = 120.0


class SimulatedCrash(BaseException):
    """Raised by a step to stop dead, like a killed process: nothing after phase 1 commits."""


def _sync_dir() -> Path:
    return Path(os.environ["GD_TEST_SYNC_DIR"])


def announce_and_block(name: str) -> None:
    """Write ``started-<name>-<pid>``, then wait for ``release-<name>`` (or the deadline)."""
    directory = _sync_dir()
    (directory / f"started-{name}-{os.getpid()}").write_text(str(os.getpid()))
    release = directory / f"release-{name}"
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not release.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"test never created {release}")
        time.sleep(0.02)  # polling a file the test controls, not synchronising on time


class WorkerScaleThreeSteps(Workflow):
    may_proceed_without_hero = True

    @step
    def one(self) -> None:
        pass

    @step
    def two(self) -> None:
        pass

    @step
    def three(self) -> None:
        pass


class WorkerBlockingStep(Workflow):
    """``hold`` blocks until the test releases it; ``after`` follows at once."""

    may_proceed_without_hero = True

    @step
    def hold(self) -> None:
        announce_and_block("hold")

    @step
    def after(self) -> None:
        pass


class WorkerCrashable(Workflow):
    """``fragile`` raises SimulatedCrash while ``crashes`` > 0 (one per run)."""

    may_proceed_without_hero = True
    crashes: ClassVar[int] = 0

    @step
    def fragile(self) -> None:
        if type(self).crashes > 0:
            type(self).crashes -= 1
            raise SimulatedCrash

    @step
    def after(self) -> None:
        pass


class WorkerCrashableResumable(Workflow):
    """Checkpoints 3 items, then crashes once while ``crashes`` > 0."""

    may_proceed_without_hero = True
    crashes: ClassVar[int] = 0
    seen: ClassVar[list[Any]] = []

    @resumable_step
    def walk(self, it: Any) -> None:
        for item in it.iterate_over(range(6)):
            type(self).seen.append(item)
            if item == 3 and type(self).crashes > 0:
                type(self).crashes -= 1
                raise SimulatedCrash


class WorkerWaitsForApproval(Workflow):
    may_proceed_without_hero = True

    @step(wait_for="approved")
    def approve(self) -> None:
        pass

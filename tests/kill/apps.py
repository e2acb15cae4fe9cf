"""Workflows for the worker-process tests here: ``geneva-drive worker --app tests.kill.apps``.

``GD_KILL_CRASH`` makes the worker process itself break, to test that a worker that stops
abnormally says so and never exits 0: ``step-thread`` (a step thread dies of an error outside
any step), ``heartbeat`` (the heartbeat thread dies).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from geneva_drive import Workflow, step

log = logging.getLogger("geneva_drive")


class KillStepExits(Workflow):
    """A step that calls ``sys.exit()`` (a library's, say): its error, not the worker's."""

    may_proceed_without_hero = True

    @step(on_exception="reattempt", max_reattempts=1)
    def leave(self) -> None:
        raise SystemExit(0)


class KillStepInterrupts(Workflow):
    may_proceed_without_hero = True

    @step  # the default policy: pause
    def interrupt(self) -> None:
        raise KeyboardInterrupt


class KillPlain(Workflow):
    may_proceed_without_hero = True

    @step
    def only(self) -> None:
        log.info("kill_apps: plain finished")


class KillBase(DeclarativeBase):
    pass


class KillEffect(KillBase):
    """A step's database effect: one row per step run that committed."""

    __tablename__ = "kill_effects"

    id: Mapped[int] = mapped_column(primary_key=True)
    workflow_id: Mapped[int]
    step_name: Mapped[str] = mapped_column(String(50))


# How long each counted step works after writing its row (with its transaction open): long
# enough that a server restart finds steps in flight.
STEP_SECONDS = float(os.environ.get("GD_KILL_STEP_SECONDS", "0.2"))


def _effect(workflow: Workflow, name: str) -> None:
    workflow.session.add(KillEffect(workflow_id=workflow.id, step_name=name))
    workflow.session.flush()  # written, not committed: commits with the step's outcome
    time.sleep(STEP_SECONDS)  # the step's own work, not synchronisation


class KillCounted(Workflow):
    """Three steps, each writing one effect row in its unit of work."""

    may_proceed_without_hero = True

    @step
    def one(self) -> None:
        _effect(self, "one")

    @step
    def two(self) -> None:
        _effect(self, "two")

    @step
    def three(self) -> None:
        _effect(self, "three")


class KillMixed(Workflow):
    """Three steps; the middle one writes nothing, so its completion and the start of the next
    step are one statement (``queries.bypass.execute_alone``) — a path of its own through a
    restart."""

    may_proceed_without_hero = True

    @step
    def one(self) -> None:
        _effect(self, "one")

    @step
    def two(self) -> None:
        time.sleep(STEP_SECONDS)  # the step's own work, not synchronisation

    @step
    def three(self) -> None:
        _effect(self, "three")


class KillSleeps(Workflow):
    """One step that works (sleeps) for STEP_SECONDS and writes nothing: load for a worker."""

    may_proceed_without_hero = True

    @step
    def work(self) -> None:
        time.sleep(STEP_SECONDS)  # the step's own work, not synchronisation


def _break_the_worker(how: str) -> None:
    from geneva_drive.engine import leases
    from geneva_drive.runtime.worker import Worker

    def fail(*_args: Any) -> Any:
        raise RuntimeError(f"injected failure ({how})")

    def exit_quietly(*_args: Any) -> Any:
        raise SystemExit(0)  # a BaseException: the thread's `except Exception` lets it by

    if how == "step-thread":  # called by each step thread after every claim, outside any step
        leases.RunningExecutions.finished = fail  # type: ignore[method-assign,assignment]
    elif how == "heartbeat":
        Worker.heartbeat = exit_quietly  # type: ignore[method-assign,assignment]
    else:
        raise ValueError(f"GD_KILL_CRASH={how!r}: expected step-thread or heartbeat")


if os.environ.get("GD_KILL_CRASH"):
    _break_the_worker(os.environ["GD_KILL_CRASH"])

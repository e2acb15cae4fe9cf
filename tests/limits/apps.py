"""Workflows with limits, for the tests and for `geneva-drive worker --app tests.limits.apps`.

Each body records when it ran (``BodyRun``, wall-clock seconds, committed with its step): a
body runs strictly inside the time its step holds a slot, so the largest number of bodies
running at once, read from these rows, is at most what the limit allows.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

from sqlalchemy import Double, Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from geneva_drive import ConcurrencyLimit, RateLimit, Workflow, step

# How long a body of the process tests works (its workload, not a synchronisation).
BODY_SECONDS = float(os.environ.get("GD_TEST_BODY_SECONDS", "0"))


class LimitsBase(DeclarativeBase):
    pass


class BodyRun(LimitsBase):
    __tablename__ = "limits_test_body_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64))
    began: Mapped[float] = mapped_column(Double)
    ended: Mapped[float] = mapped_column(Double)


def _record(workflow: Workflow, key: str, seconds: float = 0.0) -> None:
    began = time.time()
    if seconds:
        time.sleep(seconds)  # the step's work
    workflow.session.add(BodyRun(key=key, began=began, ended=time.time()))


class TwoAtATime(Workflow):
    """A global limit of 2 on one step (a constant key)."""

    may_proceed_without_hero = True

    @step(concurrency=ConcurrencyLimit(2))
    def work(self) -> None:
        _record(self, "global", BODY_SECONDS)


class OnePerTenant(Workflow):
    """A class-level limit of 1 per tenant, the tenant passed as ``create(input=...)``."""

    may_proceed_without_hero = True
    concurrency = ConcurrencyLimit(1, key=lambda wf: wf.input["tenant"])

    @step
    def work(self) -> None:
        _record(self, str(self.input["tenant"]), BODY_SECONDS)

    @step
    def more(self) -> None:
        _record(self, str(self.input["tenant"]), BODY_SECONDS)


class Gateway(Workflow):
    """At most 10 starts a second of its one step, shared with every class naming "gateway"."""

    may_proceed_without_hero = True

    @step(rate_limit=RateLimit(10, per=timedelta(seconds=1), key="gateway"))
    def charge(self) -> None:
        pass


class Unlimited(Workflow):
    may_proceed_without_hero = True

    @step
    def work(self) -> None:
        pass

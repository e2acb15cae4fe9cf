"""Workflow classes the admin tests drive (names start with Admin: identities are global)."""

from __future__ import annotations

from datetime import timedelta

from geneva_drive import Workflow, step


class AdminThreeSteps(Workflow):
    @step
    def first(self) -> None:
        pass

    @step(wait=timedelta(hours=1))
    def second(self) -> None:
        pass

    @step
    def third(self) -> None:
        pass


class AdminFlaky(Workflow):
    """Fails at ``charge`` until its hero's status says "fixed" (then pauses, as by default)."""

    @step
    def prepare(self) -> None:
        pass

    @step
    def charge(self) -> None:
        if self.hero.status == "timeout":
            raise TimeoutError("gateway timed out")
        if self.hero.status != "fixed":
            raise RuntimeError("card declined")

    @step
    def receipt(self) -> None:
        pass


class AdminWaits(Workflow):
    @step
    def ask(self) -> None:
        pass

    @step(wait_for="approved", timeout=timedelta(hours=2), on_timeout="cancel")
    def approve(self) -> None:
        pass

    @step
    def done(self) -> None:
        pass


class AdminWaitsForever(Workflow):
    @step(wait_for="shipped")
    def wait_for_it(self) -> None:
        pass


class AdminRetries(Workflow):
    """``charge`` raises while its hero's status is "busy" and is reattempted (no failure)."""

    @step(on_exception="reattempt")
    def charge(self) -> None:
        if self.hero.status == "busy":
            raise ConnectionError("gateway busy, try later")

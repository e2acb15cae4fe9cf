"""Workflows the dashboard tests look at, and the data set most of them start from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive import Workflow, resumable_step, step
from geneva_drive.testing import perform_next_step, speedrun
from tests.support.app import Account, Order

SCRIPT = "<script>window.__pwned = 1</script>"  # stored in payloads, errors and a hero id
ESCAPED = "&lt;script&gt;window.__pwned = 1&lt;/script&gt;"


class CardDeclined(Exception):
    pass


class DashOrderFlow(Workflow):
    """Pauses when ``charge`` fails; an order whose status is "broken" fails there."""

    @step
    def reserve(self) -> None:
        pass

    @step(on_exception="pause")
    def charge(self) -> None:
        if self.hero.status == "broken":
            raise CardDeclined(f"gateway said {SCRIPT} for order {self.hero.id}")

    @step
    def ship(self) -> None:
        pass


class DashApproval(Workflow):
    """Waits for an ``approval`` signal, then finishes."""

    @step(wait_for="approval")
    def approve(self) -> None:
        pass

    @step
    def done(self) -> None:
        pass


class DashAccountFlow(Workflow):
    @step(wait_for="verified")
    def verify(self) -> None:
        pass


class DashResumable(Workflow):
    """Walks seven items, three a run: runs of 3, 3 and 1 iterations."""

    @resumable_step(max_iterations=3)
    def walk(self, it: Any) -> None:
        for _ in it.iterate_over(range(7)):
            pass


@dataclass(frozen=True)
class Scenario:
    finished: int  # DashOrderFlow, ran to the end
    failed: int  # DashOrderFlow, paused after charge failed (error message holds SCRIPT)
    waiting: int  # DashApproval, waits for "approval"; holds a pending "note" with SCRIPT
    scripted_hero: int  # DashAccountFlow whose hero id is SCRIPT, waits for "verified"


def build_scenario(session: Session) -> Scenario:
    good, broken = Order(status="ok"), Order(status="broken")
    account = Account(id=SCRIPT)
    session.add_all([good, broken, account])
    session.flush()
    finished = speedrun(DashOrderFlow.create(session, hero=good))
    failed = speedrun(DashOrderFlow.create(session, hero=broken), raise_errors=False)
    waiting = DashApproval.create(session, hero=Order(status="new"))
    perform_next_step(waiting)  # parks it, waiting for "approval"
    waiting.signal("note", payload={"text": SCRIPT}, allow_unknown=True)  # waited for by none
    scripted = DashAccountFlow.create(session, hero=account)
    perform_next_step(scripted)
    session.commit()
    assert (finished.state, failed.state, waiting.state) == ("finished", "paused", "ready")
    return Scenario(finished.id, failed.id, waiting.id, scripted.id)


def snapshot(session: Session) -> dict[str, list[Any]]:
    """Every row of geneva-drive's tables: equal before and after means nothing changed."""
    from geneva_drive.storage.models import Base

    session.commit()
    rows: dict[str, list[Any]] = {}
    for table in Base.metadata.sorted_tables:
        if table.name.startswith("geneva_drive_"):
            query = select(table).order_by(*table.primary_key.columns)
            rows[table.name] = [tuple(r) for r in session.execute(query)]
    session.commit()
    return rows

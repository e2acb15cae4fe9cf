"""What a limit that never binds costs, in statements: a budget per workflow over the same
workflows without one, run the way a worker runs them (chaining the next step in the
transaction that completes one)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import event

from geneva_drive import ConcurrencyLimit, Workflow, step
from geneva_drive.engine.executor import claim_and_run
from geneva_drive.engine.run_options import RunOptions
from tests.limits._support import counts

WORKFLOWS = 3
# Statements a three-step workflow with a never-binding class-level limit may cost over the
# same one without: its first step's slot (taken at the claim, not in the claim's one
# statement), the slot passed on to each next step, and the release. PostgreSQL takes a free
# slot in one statement; elsewhere it is two. (One less than when the first step's keys were
# computed at its claim and written there: create() now inserts them with the row.)
BUDGET = {"postgresql": 5, "mariadb": 6, "sqlite": 6}


class CostFree(Workflow):
    may_proceed_without_hero = True

    @step
    def a(self) -> None:
        pass

    @step
    def b(self) -> None:
        pass

    @step
    def c(self) -> None:
        pass


class CostNeverBinds(CostFree):
    concurrency = ConcurrencyLimit(1000)


def _statements(gd: Any, session: Any, cls: type[Workflow]) -> int:
    for _ in range(WORKFLOWS):
        cls.create(session)
    session.commit()
    seen: list[str] = []

    def count(*_args: Any) -> None:
        seen.append("")

    options = RunOptions(worker_id="w", lease=timedelta(seconds=30), chain=lambda queue: True)
    event.listen(gd.engine, "before_cursor_execute", count)
    try:
        while claim_and_run(None, options, gd):
            pass
    finally:
        event.remove(gd.engine, "before_cursor_execute", count)
    return len(seen)


def test_a_never_binding_limit_costs_a_few_statements_per_workflow(gd, session, db_backend):
    _statements(gd, session, CostNeverBinds)  # the key's slot rows exist from now on

    free = _statements(gd, session, CostFree)
    limited = _statements(gd, session, CostNeverBinds)

    assert (limited - free) / WORKFLOWS <= BUDGET[db_backend], (limited, free)
    assert counts(session)[:2] == (0, 0)

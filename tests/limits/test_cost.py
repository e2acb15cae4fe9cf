"""What a limit that never binds costs, in statements: a budget per workflow over the same
workflows without one, run the way a worker runs them (chaining the next step in the
transaction that completes one)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from sqlalchemy import event, select

from geneva_drive import ConcurrencyLimit, StepExecution, Workflow, step
from geneva_drive.engine.executor import claim_and_run
from geneva_drive.engine.run_options import RunOptions
from geneva_drive.runtime.loaded import claim_scope
from geneva_drive.storage.models import LimitSlot
from tests.limits._support import counts

WORKFLOWS = 3
# Statements a three-step workflow with a never-binding class-level limit may cost over the
# same one without. MariaDB and SQLite: the first step's slot (taken after its claim; its key
# is stored by create()), the slot passed on to each next step, and the release. PostgreSQL
# passes the slot on inside the statement that completes a step and inserts the next one
# started, and inside the one that completes a workflow and hands over to the next workflow's
# first step (a slot of the same key, when nobody waits for it): what is left is the first
# claim's slot and the last release, spread over the workflows.
BUDGET = {"postgresql": 1, "mariadb": 6, "sqlite": 6}


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
    # A worker's scope (the loaded classes: what its handover claims within), not a fair one
    # (tests/fairness's classes may be loaded too; fair claims never hand over).
    scope = replace(claim_scope(None), fair=False)
    event.listen(gd.engine, "before_cursor_execute", count)
    try:
        while claim_and_run(scope, options, gd):
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


HELD_BY: list[list[str]] = []


class PassesItsSlot(Workflow):
    """Three steps of one slot: each body records which steps hold a slot of the key."""

    may_proceed_without_hero = True
    concurrency = ConcurrencyLimit(1, key="passes-its-slot")

    def _holders(self) -> None:
        held = self.session.execute(
            select(StepExecution.step_name)
            .join(LimitSlot, LimitSlot.execution_id == StepExecution.id)
            .where(LimitSlot.key.endswith(":passes-its-slot"))
        )
        HELD_BY.append([name for (name,) in held])

    @step
    def a(self) -> None:
        self._holders()

    @step
    def b(self) -> None:
        self._holders()

    @step
    def c(self) -> None:
        self._holders()


def test_the_slot_passes_to_each_next_step_started_in_the_completing_transaction(
    gd, session, db_backend
):
    HELD_BY.clear()
    _statements(gd, session, PassesItsSlot)

    # Each step ran holding the key's one slot itself (passed on, never freed and retaken:
    # a second workflow's step never got in between), and the last one freed it.
    assert HELD_BY == [["a"], ["b"], ["c"]] * WORKFLOWS
    slots = select(LimitSlot.execution_id).where(LimitSlot.key.endswith(":passes-its-slot"))
    assert session.scalars(slots).all() == [None]

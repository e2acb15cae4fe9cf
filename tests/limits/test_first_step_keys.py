"""A workflow's first step gets its limit keys when create() schedules it, like every later
step: stored with the first execution, so its claim runs no key callable. A key callable that
fails there is create()'s error, naming the class and step, with nothing written."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from geneva_drive import ConcurrencyLimit, RateLimit, StepConfigurationError, Workflow, step
from geneva_drive.engine import starting
from geneva_drive.engine.prepare import Prepared
from geneva_drive.storage.models import LimitSlot, StepExecution, workflows_table
from tests.limits._support import claim_and_start, finish, rows


def _tenant(wf: Any) -> Any:
    KeyedAtCreate.calls += 1
    tenant = wf.input["tenant"]
    if tenant == "boom":
        raise LookupError("no such tenant")
    return tenant


def _gateway(wf: Any) -> Any:
    KeyedAtCreate.calls += 1
    return f"gateway-{wf.input['tenant']}"


class KeyedAtCreate(Workflow):
    may_proceed_without_hero = True
    calls: ClassVar[int] = 0
    concurrency = ConcurrencyLimit(2, key=_tenant)

    @step(rate_limit=RateLimit(100, per=timedelta(seconds=1), key=_gateway))
    def first(self) -> None:
        pass

    @step
    def second(self) -> None:
        pass


class ChildParent(Workflow):
    may_proceed_without_hero = True

    @step
    def spawn(self) -> None:
        self.start_child(KeyedAtCreate, key="c", input={"tenant": "kid"})


def _written(session: Any) -> tuple[int, int]:
    """(workflows, executions) in the tables, as this session's transaction sees them."""
    return (
        session.scalar(sa.select(sa.func.count()).select_from(workflows_table)) or 0,
        session.scalar(sa.select(sa.func.count()).select_from(StepExecution)) or 0,
    )


def test_create_computes_the_first_steps_keys_and_its_claim_runs_no_callable(gd, session):
    KeyedAtCreate.calls = 0
    workflow = KeyedAtCreate.create(session, input={"tenant": "a"})
    session.commit()

    assert KeyedAtCreate.calls == 2  # the concurrency key and the rate key, once each
    (first,) = rows(session, [workflow])
    assert first.read_metadata("limit_keys") == {
        "concurrency": "KeyedAtCreate:a",
        "rate": "gateway-a",
    }
    step_session, started = claim_and_start(gd)

    assert isinstance(started, Prepared) and started.step_def.name == "first"
    assert KeyedAtCreate.calls == 2  # no user code in the claim
    session.commit()  # a fresh read (SQLite keeps a read transaction's snapshot)
    held = session.query(LimitSlot).filter(LimitSlot.execution_id.is_not(None)).one()
    assert held.key == "KeyedAtCreate:a"
    finish(gd, step_session, started)
    assert rows(session, [workflow])[0].outcome == "success"


def test_create_many_stores_each_workflows_own_first_keys(gd, session):
    KeyedAtCreate.calls = 0
    result = KeyedAtCreate.create_many(
        session, inputs=[{"tenant": "a"}, {"tenant": "b"}, {"tenant": "a"}]
    )
    session.commit()

    assert KeyedAtCreate.calls == 6
    by_workflow = {e.workflow_id: e for e in session.scalars(sa.select(StepExecution))}
    keys = [by_workflow[w].read_metadata("limit_keys") for _, w in result.created]
    assert [k["concurrency"] for k in keys] == [
        "KeyedAtCreate:a",
        "KeyedAtCreate:b",
        "KeyedAtCreate:a",
    ]
    assert [k["rate"] for k in keys] == ["gateway-a", "gateway-b", "gateway-a"]


def test_a_key_callable_raising_at_create_is_its_error_and_writes_nothing(gd, session):
    with pytest.raises(StepConfigurationError) as refused:
        KeyedAtCreate.create(session, input={"tenant": "boom"})

    message = str(refused.value)
    assert "KeyedAtCreate.step 'first': the concurrency key callable raised LookupError" in message
    assert "no such tenant" in message
    assert _written(session) == (0, 0)
    session.commit()  # the caller's transaction is still usable, and holds nothing
    assert _written(session) == (0, 0)


def test_a_key_callable_raising_in_create_many_names_the_item_and_writes_nothing(gd, session):
    with pytest.raises(StepConfigurationError) as refused:
        KeyedAtCreate.create_many(
            session, inputs=[{"tenant": "a"}, {"tenant": "a"}, {"tenant": "boom"}]
        )

    message = str(refused.value)
    assert "KeyedAtCreate.step 'first': the concurrency key callable raised LookupError" in message
    assert "inputs[2]" in message
    session.commit()
    assert _written(session) == (0, 0)


def test_start_child_computes_the_childs_first_keys(gd, session):
    KeyedAtCreate.calls = 0
    parent = ChildParent.create(session)
    session.commit()
    step_session, started = claim_and_start(gd)
    finish(gd, step_session, started)

    child_first = session.scalars(
        sa.select(StepExecution).where(StepExecution.workflow_id != parent.id)
    ).one()
    assert child_first.read_metadata("limit_keys") == {
        "concurrency": "KeyedAtCreate:kid",
        "rate": "gateway-kid",
    }
    assert KeyedAtCreate.calls == 2


class StartsUnlimited(Workflow):
    may_proceed_without_hero = True

    @step
    def work(self) -> None:
        pass


class StartsLimited(Workflow):
    may_proceed_without_hero = True
    concurrency = ConcurrencyLimit(5, key=lambda wf: wf.input["tenant"])

    @step
    def work(self) -> None:
        pass


def _start_statements(gd: Any, start: Any) -> int:
    seen: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(gd.engine, "before_cursor_execute", count)
    try:
        start()
    finally:
        event.remove(gd.engine, "before_cursor_execute", count)
    return len(seen)


def test_the_first_steps_keys_cost_create_no_statement(gd, session):
    tenant = {"tenant": "a"}
    for cls in (StartsUnlimited, StartsLimited):  # first uses: connection, caches
        cls.create(session, input=tenant)
        cls.create_many(session, inputs=[tenant, tenant])
    free = _start_statements(gd, lambda: StartsUnlimited.create(session, input=tenant))
    limited = _start_statements(gd, lambda: StartsLimited.create(session, input=tenant))
    many = [tenant] * 50
    free_many = _start_statements(gd, lambda: StartsUnlimited.create_many(session, inputs=many))
    limited_many = _start_statements(gd, lambda: StartsLimited.create_many(session, inputs=many))
    # Two keys: one bulk insert each (the rows of one insert share the execution's metadata).
    two_keys = [{"tenant": "a"}, {"tenant": "b"}] * 25
    limited_two = _start_statements(gd, lambda: StartsLimited.create_many(session, inputs=two_keys))
    session.commit()

    assert limited == free
    assert limited_many == free_many
    assert limited_two <= 2 * free_many
    assert session.scalar(sa.select(sa.func.count()).select_from(StepExecution)) == 158


class KeyedByTick(Workflow):
    may_proceed_without_hero = True
    concurrency = ConcurrencyLimit(1, key=lambda wf: wf.scheduled_tick.strftime("%H:%M"))

    @step
    def work(self) -> None:
        pass


def test_a_schedules_tick_is_there_for_the_first_steps_key(gd, session):
    tick = datetime(2026, 3, 1, 3, 0, tzinfo=UTC)
    # What a schedule's tick runs (engine.schedules), for a class of no schedule of its own.
    workflow = starting.create(
        KeyedByTick,
        session,
        hero=None,
        allow_multiple=True,
        step_job_options=None,
        scheduled_tick=tick,
    )
    session.commit()

    (first,) = rows(session, [workflow])
    assert first.read_metadata("limit_keys") == {"concurrency": "KeyedByTick:03:00"}

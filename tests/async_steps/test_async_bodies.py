"""async def steps, conditions, hooks and handlers are awaited with a sync step's guarantees.

Each behaviour runs two ways: on the worker's async lane (the phases in a greenlet over
aiosqlite / psycopg's async driver, awaiting on the loop) and from sync code (``speedrun``,
as a Celery task or a step thread runs a step: the coroutine runs to completion on a loop of
its own). The outcome and the rows must be the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from sqlalchemy import select

from geneva_drive import SignalMatcher, Workflow, step
from geneva_drive.core.states import WorkflowState
from geneva_drive.testing import run_until_parked, speedrun
from tests.async_steps._support import lane, wait_until
from tests.engine._support import history, reload
from tests.support.app import AuditEntry, Order


class AsyncWrites(Workflow):
    @step
    async def first(self) -> None:
        await asyncio.sleep(0)
        self.async_session.add(AuditEntry(order_id=self.hero.id, note="through async_session"))
        await self.async_session.flush()
        self.hero.status = "touched by an async step"  # self.session's instances work too

    @step
    def second(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="sync after async"))


class AsyncRaises(Workflow):
    @step
    async def first(self) -> None:
        self.async_session.add(AuditEntry(order_id=self.hero.id, note="rolled back"))
        await self.async_session.flush()
        await asyncio.sleep(0)
        raise RuntimeError("the gateway said no")


class AsyncReattempts(Workflow):
    @step
    async def first(self) -> None:
        await asyncio.sleep(0)
        self.hero.counter += 1
        if self.hero.counter < 2:
            self.reattempt()


class AsyncCommits(Workflow):
    @step
    async def first(self) -> None:
        self.async_session.add(AuditEntry(order_id=self.hero.id, note="committed early?"))
        await self.async_session.commit()  # refused: the step's unit of work


def _never(workflow: Workflow) -> bool:
    return False


async def _skip(workflow: Workflow) -> bool:
    await asyncio.sleep(0)
    return workflow.hero.status == "skip me"


class AsyncConditionsAndHooks(Workflow):
    async def cancel_if(self) -> bool:
        await asyncio.sleep(0)
        return self.hero.canceled

    async def before_step_execution(self, execution) -> None:
        await asyncio.sleep(0)
        self.session.add(AuditEntry(order_id=self.hero.id, note=f"before {execution.step_name}"))

    async def after_step_execution(self, execution) -> None:
        await asyncio.sleep(0)
        self.session.add(AuditEntry(order_id=self.hero.id, note=f"after {execution.step_name}"))

    @step(skip_if=_skip)
    def maybe(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="maybe ran"))

    @step
    def last(self) -> None:
        pass


handled: list[str] = []


async def _handler(workflow: Workflow, error: BaseException) -> None:
    await asyncio.sleep(0)
    handled.append(str(error))
    workflow.skip()


class AsyncHandler(Workflow):
    @step(on_exception=_handler)
    async def first(self) -> None:
        raise ValueError("handled asynchronously")


@pytest.fixture(params=["async lane", "sync caller"])
def run(request, gd, session) -> Callable[[Workflow], None]:
    """Runs a workflow's steps until it stops (finished, canceled, paused)."""
    if request.param == "sync caller":

        def in_sync(workflow: Workflow) -> None:
            speedrun(workflow, raise_errors=False)

        return in_sync

    def on_the_loop(workflow: Workflow) -> None:
        with lane(gd):
            wait_until(lambda: reload(session, workflow).state not in _GOING)

    return on_the_loop


_GOING = (WorkflowState.READY, WorkflowState.PERFORMING)


def _start(session, cls, **order):
    hero = Order(**order)
    session.add(hero)
    workflow = cls.create(session, hero=hero)
    session.commit()
    return workflow, hero


def _notes(session) -> list[str]:
    session.commit()
    session.expire_all()
    return list(session.scalars(select(AuditEntry.note).order_by(AuditEntry.id)))


def test_an_async_steps_writes_commit_with_its_outcome(session, run):
    workflow, hero = _start(session, AsyncWrites)

    run(workflow)

    assert _notes(session) == ["through async_session", "sync after async"]
    session.refresh(hero)
    assert hero.status == "touched by an async step"
    assert reload(session, workflow).state == "finished"


def test_an_async_step_that_raises_rolls_its_writes_back(session, run):
    workflow, _ = _start(session, AsyncRaises)

    run(workflow)

    assert _notes(session) == []
    assert history(session, workflow) == [("first", "failed", "failed")]
    assert reload(session, workflow).state == "paused"


def test_flow_control_works_in_an_async_step(session, run):
    workflow, hero = _start(session, AsyncReattempts)

    run(workflow)

    session.refresh(hero)
    assert hero.counter == 2
    assert [outcome for _, _, outcome in history(session, workflow)] == [
        "reattempted",
        "success",
    ]


def test_an_async_step_may_not_commit_its_own_unit_of_work(session, run):
    workflow, _ = _start(session, AsyncCommits)

    run(workflow)

    assert _notes(session) == []
    assert history(session, workflow) == [("first", "failed", "failed")]


def test_async_conditions_and_hooks_are_awaited(session, run):
    workflow, _ = _start(session, AsyncConditionsAndHooks, status="skip me")

    run(workflow)

    # maybe: skip_if awaited (True); last: the hooks awaited around its body.
    assert _notes(session) == ["before last", "after last"]
    assert [outcome for _, _, outcome in history(session, workflow)] == ["skipped", "success"]


def test_an_async_cancel_if_is_awaited(session, run):
    workflow, _ = _start(session, AsyncConditionsAndHooks, canceled=True)

    run(workflow)

    assert reload(session, workflow).state == "canceled"
    assert _notes(session) == []


def test_an_async_exception_handler_is_awaited(session, run):
    handled.clear()
    workflow, _ = _start(session, AsyncHandler)

    run(workflow)

    assert handled == ["handled asynchronously"]
    assert reload(session, workflow).state == "finished"


class PaidEnough:
    """A signal matcher whose ``matches`` is ``async def``: it must be awaited, not read as
    truthy (a coroutine object is), or the first payment would be taken."""

    names = ("paid",)

    async def matches(self, signal) -> bool:
        await asyncio.sleep(0)
        return bool(signal.payload["cents"] >= 100)


async def _enough(workflow: Workflow, payload) -> bool:
    await asyncio.sleep(0)
    return bool(payload["cents"] >= 100)


class AwaitsAPayment(Workflow):
    @step
    async def invoice(self) -> None:
        await asyncio.sleep(0)

    @step(wait_for=PaidEnough())
    def record(self) -> None:
        self.hero.status = f"paid {self.received_signal.payload['cents']}"


class AwaitsAPaymentByPredicate(Workflow):
    @step
    async def invoice(self) -> None:
        await asyncio.sleep(0)

    @step(wait_for=SignalMatcher("paid", _enough))
    def record(self) -> None:
        self.hero.status = f"paid {self.received_signal.payload['cents']}"


@pytest.mark.parametrize("cls", [AwaitsAPayment, AwaitsAPaymentByPredicate])
def test_an_async_signal_matcher_is_awaited(session, run, cls):
    workflow, hero = _start(session, cls)
    # Both arrive before the step waits: its phase 1 (on the lane, or in the sync caller)
    # scans them with the matcher, which takes the second only.
    workflow.signal("paid", {"cents": 50})
    workflow.signal("paid", {"cents": 150})
    session.commit()

    run(workflow)

    session.refresh(hero)
    assert hero.status == "paid 150"
    assert reload(session, workflow).state == "finished"


def test_an_async_signal_matcher_is_awaited_when_the_signal_arrives(session):
    workflow, hero = _start(session, AwaitsAPaymentByPredicate)
    run_until_parked(workflow)  # the invoice, then the step parks on the signal
    assert history(session, workflow)[-1][:2] == ("record", "waiting")

    # Matched in the signalling transaction (here a sync one: the predicate runs on a loop
    # of its own; through asignal() it is awaited on the application's loop).
    workflow.signal("paid", {"cents": 50})
    session.commit()
    assert history(session, workflow)[-1][:2] == ("record", "waiting")
    workflow.signal("paid", {"cents": 150})
    session.commit()
    speedrun(workflow)

    session.refresh(hero)
    assert hero.status == "paid 150"

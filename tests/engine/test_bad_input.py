"""Issue 14, items 6, 10, 11, 14, 15, 16: bad input meets a clear error, the same on every
database, and nothing is written.

Before: NaN payloads were invalid JSON on SQLite and a raw DataError at commit on PostgreSQL;
a long queue name was stored by SQLite and refused by PostgreSQL at flush; an unimportable
dotted matcher fell back to pause without a word; a step's own commit() made half its writes
durable; a lambda around a coroutine was recorded as a success without running.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from sqlalchemy import func, select

from geneva_drive import (
    ExceptionPolicy,
    SerializationError,
    Signal,
    StepConfigurationError,
    Workflow,
    resumable_step,
    step,
)
from geneva_drive.core.errors import UnitOfWorkError
from geneva_drive.engine import unit_of_work
from geneva_drive.storage.serialization import MAX_DEPTH
from geneva_drive.testing import perform_next_step
from tests.engine._support import executions, reload
from tests.support.app import AuditEntry, Order


def _deep(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    return value


class BadInputWaits(Workflow):
    @step(wait_for="paid")
    def capture(self) -> None:
        pass


class BadInputCursor(Workflow):
    @resumable_step
    def walk(self, it) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="walked"))
        it.set(math.nan)
        it.checkpoint()


class BadInputUnimportableMatcher(Workflow):
    @step(on_exception=ExceptionPolicy("reattempt", matching="no_such_module_gd.Timeout"))
    def call_gateway(self) -> None:
        raise TimeoutError("gateway timed out")


async def _fetch() -> None:
    BadInputCoroutine.ran = True


class BadInputCoroutine(Workflow):
    ran = False
    fetch = step(lambda wf: _fetch(), name="fetch")


class BadInputCommits(Workflow):
    @step
    def first(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="committed early"))
        self.session.commit()
        raise RuntimeError("never reached: commit() is refused")


class BadInputRollsBack(Workflow):
    @step
    def first(self) -> None:
        self.hero.status = "kept?"
        self.session.rollback()


class BadInputCloses(Workflow):
    @step
    def first(self) -> None:
        self.session.close()


class BadInputSavepoint(Workflow):
    @step
    def first(self) -> None:
        try:
            with self.session.begin_nested():
                self.session.add(AuditEntry(order_id=self.hero.id, note=None))  # NOT NULL
                self.session.flush()
        except Exception:
            pass  # the savepoint is undone; the step's transaction goes on
        self.session.add(AuditEntry(order_id=self.hero.id, note="after savepoint"))


class BadInputCheckpoints(Workflow):
    @resumable_step
    def walk(self, it) -> None:
        for n in it.iterate_over(range(3)):
            self.session.add(AuditEntry(order_id=self.hero.id, note=f"item {n}"))


def _start(session, cls):
    order = Order()
    session.add(order)
    wf = cls.create(session, hero=order)
    session.commit()
    return wf, order


def _count(session, model) -> int:
    session.commit()
    return session.execute(select(func.count()).select_from(model)).scalar_one()


def _notes(session) -> list[str]:
    session.commit()
    session.expire_all()
    return list(session.execute(select(AuditEntry.note).order_by(AuditEntry.id)).scalars())


# -- item 10: payloads, metadata, cursors ----------------------------------------------------


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_a_signal_payload_with_nan_or_infinity_is_refused_and_nothing_is_stored(session, number):
    wf, _ = _start(session, BadInputWaits)
    with pytest.raises(SerializationError, match=r"NaN or Infinity.*\(at value\['amount'\]\)"):
        wf.signal("paid", payload={"amount": number})
    session.rollback()
    assert _count(session, Signal) == 0


def test_a_signal_payload_nested_beyond_the_limit_is_refused_and_nothing_is_stored(session):
    wf, _ = _start(session, BadInputWaits)
    with pytest.raises(SerializationError, match=rf"nested more than {MAX_DEPTH} levels"):
        wf.signal("paid", payload=_deep(MAX_DEPTH + 1))
    with pytest.raises(SerializationError, match=rf"nested more than {MAX_DEPTH} levels"):
        wf.signal("paid", payload=_deep(50_000))  # no RecursionError either
    session.rollback()
    assert _count(session, Signal) == 0


def test_a_payload_and_metadata_at_the_depth_limit_are_stored_on_every_database(session):
    # MariaDB's JSON check stops at 32 levels: the limit leaves room below it.
    wf, _ = _start(session, BadInputWaits)
    wf.write_metadata("deep", _deep(MAX_DEPTH))
    wf.signal("paid", payload=_deep(MAX_DEPTH))
    session.commit()
    session.expire_all()
    assert wf.read_metadata("deep") == _deep(MAX_DEPTH)
    stored = session.execute(select(Signal)).scalar_one()
    assert stored.payload == _deep(MAX_DEPTH)


def test_metadata_with_nan_is_refused_naming_the_workflow_and_nothing_is_written(session):
    wf, _ = _start(session, BadInputWaits)
    with pytest.raises(
        SerializationError,
        match=rf"BadInputWaits id={wf.id}: write_metadata\('rate'\): cannot store the float nan",
    ):
        wf.write_metadata("rate", {"value": math.nan})
    session.commit()
    session.expire_all()
    assert reload(session, wf).metadata_json is None


def test_a_cursor_with_nan_fails_the_step_cleanly_and_its_work_rolls_back(session):
    # Before: SQLite committed invalid JSON with the step's work; PostgreSQL failed at commit.
    wf, _ = _start(session, BadInputCursor)
    execution = perform_next_step(wf, raise_errors=False)
    assert (execution.state, execution.outcome) == ("failed", "failed")
    assert execution.error_class_name == "geneva_drive.core.errors.SerializationError"
    assert "NaN or Infinity" in execution.error_message
    assert execution.cursor is None
    assert reload(session, wf).state == "paused"
    assert _notes(session) == []


# -- item 11 and 15: job options at create() -------------------------------------------------


def test_a_queue_name_longer_than_its_column_is_refused_at_create_and_nothing_is_written(
    session,
):
    order = Order()
    session.add(order)
    with pytest.raises(
        StepConfigurationError,
        match=r"BadInputWaits\.step_job_options: job_options queue= is 300 characters long, "
        r"over the limit of 255",
    ):
        BadInputWaits.create(session, hero=order, step_job_options={"queue": "q" * 300})
    assert _count(session, Workflow) == 0


def test_a_priority_outside_its_column_is_refused_at_create(session):
    with pytest.raises(StepConfigurationError, match=r"priority=1099511627776 is outside"):
        BadInputWaits.create(session, hero=Order(), step_job_options={"priority": 2**40})
    session.rollback()
    assert _count(session, Workflow) == 0


def test_a_job_option_the_backend_ignores_is_refused_at_create_with_did_you_mean(session):
    # Before: stored, and ignored by the database worker without a word.
    with pytest.raises(
        StepConfigurationError,
        match=r"BadInputWaits\.step_job_options: job option 'priorty' \(did you mean "
        r"'priority'\?\) is not understood by the configured backend DatabaseBackend",
    ):
        BadInputWaits.create(session, hero=Order(), step_job_options={"priorty": 1})
    session.rollback()
    assert _count(session, Workflow) == 0


# -- item 14: a dotted matcher that cannot be imported ---------------------------------------


def test_an_unimportable_dotted_matcher_pauses_and_says_so_in_the_stored_error(session):
    wf, _ = _start(session, BadInputUnimportableMatcher)
    execution = perform_next_step(wf, raise_errors=False)
    assert (execution.state, execution.outcome) == ("failed", "failed")
    assert reload(session, wf).state == "paused"
    # The step's own error is what is recorded…
    assert (execution.error_class_name, execution.error_message) == (
        "TimeoutError",
        "gateway timed out",
    )
    # …and the configuration problem, naming class, step and policy, travels with it.
    assert (
        "BadInputUnimportableMatcher.step 'call_gateway': ExceptionPolicy('reattempt', "
        "matching=['no_such_module_gd.Timeout']) could not be applied to TimeoutError: "
        "matching='no_such_module_gd.Timeout' cannot be imported"
    ) in execution.error_backtrace


# -- item 6: a coroutine from a plain def (a lambda around an async function) ---------------


def test_a_step_returning_a_coroutine_has_it_awaited_before_counting_as_done(session):
    # Before issue 37 it was refused (nothing awaited it); now it is awaited like an async
    # def body (core.awaiting), so "done" means it ran.
    wf, _ = _start(session, BadInputCoroutine)
    execution = perform_next_step(wf, raise_errors=False)
    assert (execution.state, execution.outcome) == ("completed", "success")
    assert BadInputCoroutine.ran is True
    assert asyncio.iscoroutinefunction(_fetch)


# -- item 16: the step's session is the library's to commit ----------------------------------


def test_commit_inside_a_step_is_refused_and_none_of_the_steps_writes_land(session):
    # Before: the AuditEntry was committed, then the step failed: half the work durable.
    wf, _ = _start(session, BadInputCommits)
    execution = perform_next_step(wf, raise_errors=False)
    assert (execution.state, execution.outcome) == ("failed", "failed")
    assert execution.error_class_name == "geneva_drive.core.errors.UnitOfWorkError"
    assert execution.error_message.startswith(
        f"BadInputCommits.step 'first' (execution id={execution.id}): self.session.commit() "
        "is not allowed inside a step"
    )
    assert "put them in a step of their own" in execution.error_message
    assert _notes(session) == []
    assert reload(session, wf).state == "paused"


@pytest.mark.parametrize("cls", [BadInputRollsBack, BadInputCloses], ids=["rollback", "close"])
def test_rollback_or_close_inside_a_step_is_refused(session, cls):
    wf, order = _start(session, cls)
    execution = perform_next_step(wf, raise_errors=False)
    assert execution.error_class_name == "geneva_drive.core.errors.UnitOfWorkError"
    verb = "rollback" if cls is BadInputRollsBack else "close"
    assert f"self.session.{verb}() is not allowed inside a step" in execution.error_message
    session.refresh(order)
    assert order.status == "new"


def test_a_savepoint_inside_a_step_is_still_allowed(session):
    wf, _ = _start(session, BadInputSavepoint)
    execution = perform_next_step(wf)
    assert (execution.state, execution.outcome) == ("completed", "success")
    assert _notes(session) == ["after savepoint"]


def test_resumable_checkpoints_still_commit_inside_the_guard(session):
    wf, _ = _start(session, BadInputCheckpoints)
    execution = perform_next_step(wf)
    assert (execution.state, execution.outcome) == ("completed", "success")
    assert _notes(session) == ["item 0", "item 1", "item 2"]
    assert executions(session, wf)[0].cursor_value == 3


def test_the_guard_refuses_only_inside_its_block_and_the_library_passes_it(session):
    definition = BadInputCommits.steps.named("first")
    with unit_of_work.guard(session, definition, 7):
        with pytest.raises(
            UnitOfWorkError, match=r"BadInputCommits\.step 'first' \(execution id=7\)"
        ):
            session.commit()
        unit_of_work.commit(session)  # what a checkpoint does
    assert "commit" not in vars(session)
    session.commit()

"""A step's limit keys are computed when it is scheduled and stored with it: its claim runs no
key callable. (A workflow's first step: tests/limits/test_first_step_keys.py.)"""

from __future__ import annotations

from typing import Any, ClassVar

from geneva_drive import ConcurrencyLimit, Workflow, step
from geneva_drive.engine.prepare import Prepared
from geneva_drive.storage.models import LimitSlot
from tests.limits._support import claim_and_start, counts, finish, rows


def _tenant(wf: Any) -> Any:
    KeyedAtScheduling.calls += 1
    return wf.read_metadata("tenant") or wf.input  # create(input=) gives the first one


class KeyedAtScheduling(Workflow):
    may_proceed_without_hero = True
    calls: ClassVar[int] = 0
    concurrency = ConcurrencyLimit(2, key=_tenant)

    @step
    def first(self) -> None:
        pass

    @step
    def second(self) -> None:
        pass


def _explodes(wf: Any) -> str:
    if wf.read_metadata("explode"):
        raise LookupError("no tenant for this one")
    return "t"


class KeyFailsWhenScheduled(Workflow):
    may_proceed_without_hero = True
    concurrency = ConcurrencyLimit(1, key=_explodes)

    @step
    def first(self) -> None:
        self.write_metadata("explode", True)

    @step(on_exception="cancel")
    def second(self) -> None:
        pass


def test_the_next_steps_key_is_stored_when_it_is_scheduled_and_its_claim_runs_no_callable(
    gd, session
):
    workflow = KeyedAtScheduling.create(session, input="a")
    session.commit()
    step_session, started = claim_and_start(gd)
    finish(gd, step_session, started)  # schedules "second"

    scheduled = rows(session, [workflow])[-1]
    assert (scheduled.step_name, scheduled.state) == ("second", "scheduled")
    assert scheduled.read_metadata("limit_keys") == {"concurrency": "KeyedAtScheduling:a"}

    workflow = session.get(KeyedAtScheduling, workflow.id)
    workflow.write_metadata("tenant", "b")  # too late: the key is the one stored
    session.commit()
    KeyedAtScheduling.calls = 0
    step_session, started = claim_and_start(gd)

    assert isinstance(started, Prepared) and started.step_def.name == "second"
    assert KeyedAtScheduling.calls == 0  # no user code in the claim
    held = session.query(LimitSlot).filter(LimitSlot.execution_id.is_not(None)).one()
    assert held.key == "KeyedAtScheduling:a"
    finish(gd, step_session, started)
    assert counts(session)[:2] == (0, 0)


def test_a_key_callable_failing_when_its_step_is_scheduled_fails_that_step_at_its_claim(
    gd, session
):
    workflow = KeyFailsWhenScheduled.create(session)
    session.commit()
    step_session, started = claim_and_start(gd)
    finish(gd, step_session, started)  # its body makes the next key fail; its outcome stands

    first, second = rows(session, [workflow])
    assert first.outcome == "success"
    assert second.state == "scheduled" and "LookupError" in second.read_metadata("limit_keys_error")

    step_session, ended = claim_and_start(gd)
    step_session.close()

    assert not isinstance(ended, Prepared)
    first, second = rows(session, [workflow])
    message = second.error_message or ""
    assert "KeyFailsWhenScheduled.step 'second': the concurrency key callable raised" in message
    assert f"workflow id={workflow.id}" in message
    session.refresh(workflow)
    assert workflow.state == "canceled"  # its policy decided; nothing left stuck
    assert counts(session) == (0, 0, 0)

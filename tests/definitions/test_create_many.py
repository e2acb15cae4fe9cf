"""``Workflow.create_many``: a bulk start, one workflow per hero, with the uniqueness of
``create()`` and conflicts reported per hero. Database tests run on every backend."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from geneva_drive import (
    StepConfigurationError,
    StepExecution,
    Workflow,
    WorkflowAlreadyOngoing,
    step,
)
from geneva_drive.runtime.configure import configured
from geneva_drive.testing import speedrun
from tests.engine._support import RecordingBackend
from tests.support.app import AuditEntry, Order


class ManyTwoSteps(Workflow):
    job_options = {"queue": "bulk", "priority": 2}

    @step(wait=timedelta(minutes=5))
    def first(self) -> None:
        pass

    @step
    def second(self) -> None:
        pass


class ManyQuick(Workflow):
    @step
    def only(self) -> None:
        self.session.add(AuditEntry(order_id=self.hero.id, note="ran"))


class ManyHeroless(Workflow):
    may_proceed_without_hero = True

    @step
    def only(self) -> None:
        pass


class ManyNoSteps(Workflow):
    pass


def _orders(session, count):
    orders = [Order() for _ in range(count)]
    session.add_all(orders)
    session.commit()
    return orders


def _count(session, model=Workflow):
    return session.execute(select(func.count()).select_from(model)).scalar_one()


def _columns(row, *skip):
    return {
        a.key: getattr(row, a.key)
        for a in type(row).__mapper__.column_attrs
        if a.key not in ("id", "workflow_id", "hero_id", *skip)
    }


# -- what it writes --------------------------------------------------------------------------


def test_each_hero_gets_a_workflow_in_the_order_given(session):
    orders = _orders(session, 5)

    result = ManyQuick.create_many(session, heroes=orders)
    session.commit()

    assert [hero for hero, _ in result.created] == orders
    assert result.conflicts == []
    for order, workflow_id in result.created:
        wf = session.get(Workflow, workflow_id)
        assert (wf.hero_type, wf.hero_id, wf.type) == ("Order", str(order.id), "ManyQuick")


def test_the_rows_are_those_create_would_write(session, clock):
    one, two = _orders(session, 2)
    single = ManyTwoSteps.create(session, hero=one, step_job_options={"priority": 9})
    (_, bulk_id), *_ = ManyTwoSteps.create_many(
        session, heroes=[two], step_job_options={"priority": 9}
    ).created
    session.commit()
    session.expire_all()
    bulk = session.get(Workflow, bulk_id)

    assert _columns(bulk) == _columns(single)
    assert bulk.next_step_name == "first" and bulk.state == "ready"
    assert _columns(bulk.current_execution) == _columns(single.current_execution)
    assert bulk.current_execution.scheduled_for == clock.now() + timedelta(minutes=5)
    assert bulk.current_execution.priority == 9


def test_the_workflows_it_starts_run_to_the_end(session):
    orders = _orders(session, 3)
    result = ManyQuick.create_many(session, heroes=orders)
    session.commit()

    for workflow_id in result.workflow_ids:
        speedrun(session.get(Workflow, workflow_id))

    assert session.execute(select(AuditEntry.note)).scalars().all() == ["ran"] * 3


def test_each_workflow_is_enqueued_after_commit_with_its_own_execution(session):
    orders = _orders(session, 4)
    backend = RecordingBackend()
    with configured(backend=backend):
        result = ManyTwoSteps.create_many(session, heroes=orders)
        assert backend.enqueued == []  # nothing before the commit
        session.commit()

    by_workflow = {s.workflow_id: s for s in backend.enqueued}
    assert sorted(by_workflow) == sorted(result.workflow_ids)
    for workflow_id, enqueued in by_workflow.items():
        execution = session.get(StepExecution, enqueued.execution_id)
        assert (execution.workflow_id, execution.step_name) == (workflow_id, "first")
        assert enqueued.job_options == {"queue": "bulk", "priority": 2}


def test_a_rolled_back_bulk_start_leaves_nothing(session):
    orders = _orders(session, 3)
    ManyQuick.create_many(session, heroes=orders)
    session.rollback()

    assert _count(session) == 0
    assert _count(session, StepExecution) == 0


def test_count_starts_hero_less_workflows(session):
    result = ManyHeroless.create_many(session, count=1200)
    session.commit()

    assert len(result) == 1200
    assert len(set(result.workflow_ids)) == 1200
    assert all(hero is None for hero, _ in result.created)
    assert _count(session, StepExecution) == 1200


# -- one ongoing workflow per class and hero ----------------------------------------------


def test_a_hero_with_an_ongoing_workflow_is_reported_and_the_others_start(session):
    orders = _orders(session, 4)
    holder = ManyQuick.create(session, hero=orders[2])
    session.commit()

    result = ManyQuick.create_many(session, heroes=orders)
    session.commit()

    assert [hero for hero, _ in result.created] == [orders[0], orders[1], orders[3]]
    assert result.conflicts == [(orders[2], holder.id)]
    assert _count(session) == 4


def test_a_hero_listed_twice_gets_one_workflow(session):
    (order,) = _orders(session, 1)

    result = ManyQuick.create_many(session, heroes=[order, order])
    session.commit()

    assert [hero for hero, _ in result.created] == [order]
    assert result.conflicts == [(order, None)]
    assert _count(session) == 1


def test_conflicts_leave_the_callers_transaction_usable(session):
    orders = _orders(session, 2)
    ManyQuick.create(session, hero=orders[0])
    session.commit()

    ManyQuick.create_many(session, heroes=orders)
    session.add(AuditEntry(order_id=orders[0].id, note="after the bulk start"))
    session.commit()

    assert session.execute(select(AuditEntry.note)).scalars().all() == ["after the bulk start"]


def test_raise_on_conflict_refuses_the_whole_batch_naming_the_holder(session):
    orders = _orders(session, 3)
    holder = ManyQuick.create(session, hero=orders[1])
    session.commit()

    with pytest.raises(
        WorkflowAlreadyOngoing,
        match=rf"ManyQuick: an ongoing workflow \(id={holder.id}\) already exists for hero "
        rf"Order id={orders[1].id}",
    ):
        ManyQuick.create_many(session, heroes=orders, raise_on_conflict=True)
    session.commit()

    assert _count(session) == 1  # the other two were not started either
    assert _count(session, StepExecution) == 1


def test_allow_multiple_starts_beside_an_ongoing_workflow(session):
    orders = _orders(session, 2)
    ManyQuick.create(session, hero=orders[0])
    session.commit()

    result = ManyQuick.create_many(session, heroes=orders, allow_multiple=True)
    session.commit()

    assert len(result.created) == 2 and result.conflicts == []
    assert _count(session) == 3


def test_a_finished_workflow_does_not_block_a_bulk_start(session):
    (order,) = _orders(session, 1)
    first = ManyQuick.create(session, hero=order)
    session.commit()
    speedrun(first)

    result = ManyQuick.create_many(session, heroes=[order])

    assert len(result.created) == 1 and result.conflicts == []
    session.rollback()


# -- bad input: refused before anything is written ------------------------------------------


def test_heroes_and_count_together_or_neither_are_refused(session):
    with pytest.raises(TypeError, match=r"ManyHeroless.create_many\(\): pass heroes"):
        ManyHeroless.create_many(session, heroes=[], count=1)
    with pytest.raises(TypeError, match=r"not both nor neither"):
        ManyHeroless.create_many(session)


def test_a_negative_count_is_refused(session):
    with pytest.raises(ValueError, match=r"create_many\(count=-1\): expected an int >= 0"):
        ManyHeroless.create_many(session, count=-1)


def test_hero_less_workflows_of_a_class_that_needs_a_hero_are_refused(session):
    with pytest.raises(StepConfigurationError, match=r"ManyQuick needs a hero"):
        ManyQuick.create_many(session, count=3)
    assert _count(session) == 0


def test_something_that_is_not_a_hero_is_refused_naming_create_many(session):
    orders = _orders(session, 1)
    with pytest.raises(StepConfigurationError, match=r"ManyQuick.create_many\(hero=...\)"):
        ManyQuick.create_many(session, heroes=[*orders, "order 7"])
    session.commit()
    assert _count(session) == 0


def test_invalid_step_job_options_are_refused_before_anything_is_written(session):
    orders = _orders(session, 2)
    with pytest.raises(StepConfigurationError, match=r"ManyQuick.step_job_options"):
        ManyQuick.create_many(session, heroes=orders, step_job_options={"priorty": 1})
    session.commit()
    assert _count(session) == 0


def test_a_class_without_steps_is_refused(session):
    with pytest.raises(StepConfigurationError, match=r"ManyNoSteps has no steps"):
        ManyNoSteps.create_many(session, heroes=_orders(session, 1))


def test_the_base_workflow_class_cannot_be_started_in_bulk(session):
    with pytest.raises(StepConfigurationError, match=r"create a subclass of Workflow"):
        Workflow.create_many(session, count=1)

"""``Workflow.create``: heroes of every key type, uniqueness, job options, and loading rows
whose class is gone. Database tests run on every backend."""

from __future__ import annotations

import uuid
import warnings
from datetime import timedelta

import pytest
from sqlalchemy import Integer, String, func, select, update
from sqlalchemy.exc import SAWarning
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    make_transient_to_detached,
    mapped_column,
)

from geneva_drive import (
    StepConfigurationError,
    StepExecution,
    Workflow,
    WorkflowAlreadyOngoing,
    WorkflowState,
    step,
)
from geneva_drive.storage import queries as gd_queries
from geneva_drive.testing import assert_workflow_state, speedrun
from tests.support.app import Account, AuditEntry, Device, Order


class CreateTwoSteps(Workflow):
    job_options = {"queue": "class-queue", "priority": 1}

    @step(wait=timedelta(minutes=10))
    def first(self):
        pass

    @step(job_options={"queue": "step-queue"})
    def second(self):
        pass


class CreateOtherForSameHero(Workflow):
    @step
    def only(self):
        pass


class CreateNoSteps(Workflow):
    pass


class CreateAheadOfFirst(Workflow):
    @step
    def defined_first(self):
        pass

    @step(before_step="defined_first")
    def runs_first(self):
        pass


class CreateQuick(Workflow):
    @step
    def only(self):
        pass


class CreateHeroless(Workflow):
    may_proceed_without_hero = True

    @step
    def only(self):
        pass


class CreateVanishing(Workflow):
    may_proceed_without_hero = True

    @step
    def only(self):
        pass


class _WideKeys(DeclarativeBase):
    """Heroes the tests never store (no table): built detached, with their key set."""


class CreateWideKeyHero(_WideKeys):
    __tablename__ = "create_wide_key_heroes"
    id: Mapped[str] = mapped_column(String(400), primary_key=True)


_LONG_NAMED_HERO: type = type(
    "H" * 256,
    (_WideKeys,),
    {"__tablename__": "create_long_named_heroes", "id": mapped_column(Integer, primary_key=True)},
)


def _order(session):
    order = Order()
    session.add(order)
    session.flush()
    return order


def _fresh(session, wf):
    """The workflow row loaded through a brand-new session (nothing cached)."""
    other = Session(session.get_bind())
    return other, other.get(Workflow, wf.id)


def _workflow_count(session):
    return session.execute(select(func.count()).select_from(Workflow)).scalar_one()


# -- heroes --------------------------------------------------------------------------------


def test_a_hero_with_an_integer_key_is_stored_by_type_and_id_and_loads_back(session):
    order = _order(session)
    wf = CreateQuick.create(session, hero=order)
    session.commit()
    assert (wf.hero_type, wf.hero_id) == ("Order", str(order.id))
    other, loaded = _fresh(session, wf)
    with other:
        assert isinstance(loaded.hero, Order)
        assert loaded.hero.id == order.id


def test_a_hero_with_a_string_key_loads_back(session):
    account = Account(id="acct-42", email="a@example.com")
    session.add(account)
    wf = CreateQuick.create(session, hero=account)
    session.commit()
    assert (wf.hero_type, wf.hero_id) == ("Account", "acct-42")
    other, loaded = _fresh(session, wf)
    with other:
        assert loaded.hero.email == "a@example.com"


def test_a_hero_with_a_uuid_key_loads_back(session):
    device = Device(id=uuid.UUID("0b6f3c9e-8d7a-4b1e-9a56-1f2e3d4c5b6a"), label="sensor")
    session.add(device)
    wf = CreateQuick.create(session, hero=device)
    session.commit()
    assert wf.hero_id == "0b6f3c9e-8d7a-4b1e-9a56-1f2e3d4c5b6a"
    other, loaded = _fresh(session, wf)
    with other:
        assert loaded.hero.id == device.id
        assert loaded.hero.label == "sensor"


def test_an_unsaved_hero_is_flushed_to_get_its_key(session):
    order = Order()
    wf = CreateQuick.create(session, hero=order)
    assert order.id is not None
    assert wf.hero_id == str(order.id)


def test_the_hero_is_none_once_its_row_is_deleted(session):
    order = _order(session)
    wf = CreateQuick.create(session, hero=order)
    session.commit()
    session.delete(order)
    session.commit()
    other, loaded = _fresh(session, wf)
    with other:
        assert loaded.hero_type == "Order"
        assert loaded.hero is None


def test_a_workflow_without_a_hero_is_created_without_one(session):
    wf = CreateHeroless.create(session)
    session.commit()
    assert (wf.hero_type, wf.hero_id, wf.hero) == (None, None, None)
    assert wf.next_step_name == "only"


def test_a_hero_less_workflow_that_may_proceed_without_hero_runs_to_the_end(session):
    wf = CreateHeroless.create(session)
    speedrun(wf)
    assert_workflow_state(wf, "finished")


def test_creating_a_workflow_that_needs_a_hero_without_one_is_refused_and_writes_nothing(session):
    # Before: created, then canceled at its first step with no reason stored.
    with pytest.raises(
        StepConfigurationError,
        match=r"CreateQuick\.create\(hero=None\): CreateQuick needs a hero.*"
        r"may_proceed_without_hero = True",
    ):
        CreateQuick.create(session)
    session.commit()
    assert _workflow_count(session) == 0


def test_a_class_passed_as_the_hero_is_refused_naming_the_fix(session):
    # Before: a raw AttributeError from SQLAlchemy's Mapper.
    with pytest.raises(
        StepConfigurationError,
        match=r"CreateQuick\.create\(hero=\.\.\.\): got the class Order itself; pass an "
        r"instance, e\.g\. hero=session\.get\(Order, id\)",
    ):
        CreateQuick.create(session, hero=Order)
    session.commit()
    assert _workflow_count(session) == 0


@pytest.mark.filterwarnings("ignore:Column 'app_accounts.id' is marked")
def test_a_new_hero_the_database_refuses_is_a_clear_error_and_the_transaction_stays_usable(
    session,
):
    # Account's key is not generated: flushing it without one fails in the database.
    with pytest.raises(
        StepConfigurationError,
        match=r"(?s)CreateQuick\.create\(hero=\.\.\.\): the hero .* had no primary key yet, so "
        r"it was added to the session and flushed, which failed: .*save the hero yourself",
    ):
        CreateQuick.create(session, hero=Account(email="no-key@example.com"))
    order = _order(session)  # the caller's transaction is still usable
    session.commit()
    assert _workflow_count(session) == 0
    assert session.get(Order, order.id) is not None


def test_a_new_hero_of_another_session_is_refused(session):
    with Session(session.get_bind()) as other:
        order = Order()
        other.add(order)
        with pytest.raises(StepConfigurationError, match=r"belongs to another session"):
            CreateQuick.create(session, hero=order)


def test_a_hero_deleted_in_this_session_is_refused(session):
    order = _order(session)
    session.commit()
    session.delete(order)
    session.flush()
    with pytest.raises(StepConfigurationError, match=r"has been deleted in this session"):
        CreateQuick.create(session, hero=order)


def test_a_hero_key_longer_than_its_column_is_refused_before_any_sql(session):
    # SQLite stored it; PostgreSQL and MariaDB failed at flush with a raw DataError.
    hero = CreateWideKeyHero(id="k" * 256)
    make_transient_to_detached(hero)  # as if loaded: it has its key, no table needed
    with pytest.raises(
        StepConfigurationError,
        match=r"CreateQuick\.create\(hero=\.\.\.\): the hero's primary key 'kkk.* is 256 "
        r"characters long, over the limit of 255",
    ):
        CreateQuick.create(session, hero=hero)
    session.commit()
    assert _workflow_count(session) == 0


def test_a_hero_class_name_longer_than_its_column_is_refused_before_any_sql(session):
    hero = _LONG_NAMED_HERO(id=1)
    make_transient_to_detached(hero)
    with pytest.raises(
        StepConfigurationError,
        match=r"the hero's class name 'HHH.* is 256 characters long, over the limit of 255",
    ):
        CreateQuick.create(session, hero=hero)
    session.commit()
    assert _workflow_count(session) == 0


def test_two_hero_less_workflows_of_one_class_may_be_ongoing_at_once(session):
    # Decision: uniqueness is per hero; the gem's model check also compared NULL heroes (H-19).
    CreateHeroless.create(session)
    CreateHeroless.create(session)
    session.commit()
    assert _workflow_count(session) == 2


def test_a_hero_that_is_not_a_mapped_instance_is_refused(session):
    with pytest.raises(
        StepConfigurationError,
        match=r"CreateQuick\.create\(hero=\.\.\.\): the hero must be an instance of a mapped",
    ):
        CreateQuick.create(session, hero="order-1")


# -- what create does ----------------------------------------------------------------------


def test_create_starts_ready_and_schedules_the_first_step_after_its_wait(session, clock):
    wf = CreateTwoSteps.create(session, hero=_order(session))
    session.commit()
    assert wf.state == "ready"
    assert wf.next_step_name == "first"
    execution = wf.current_execution
    assert (execution.step_name, execution.state) == ("first", "scheduled")
    assert execution.scheduled_for == clock.now() + timedelta(minutes=10)


def test_create_starts_at_the_first_step_in_positional_order(session):
    # DESIGN 4.2 #2: the gem started at the first *defined* step (H-2).
    wf = CreateAheadOfFirst.create(session, hero=_order(session))
    session.commit()
    assert wf.next_step_name == "runs_first"
    assert wf.current_execution.step_name == "runs_first"


def test_a_workflow_without_steps_is_finished_at_creation(session, clock):
    wf = CreateNoSteps.create(session, hero=_order(session))
    session.commit()
    assert wf.state == "finished"
    assert wf.transitioned_at == clock.now()
    assert wf.current_execution is None


def test_the_base_workflow_class_cannot_be_created(session):
    with pytest.raises(StepConfigurationError, match=r"create a subclass of Workflow"):
        Workflow.create(session)


def test_the_stored_type_is_the_class_identity(session):
    wf = CreateQuick.create(session, hero=_order(session))
    session.commit()
    assert wf.type == "CreateQuick"


# -- one ongoing workflow per class and hero -----------------------------------------------


def test_a_second_ongoing_workflow_of_one_class_for_one_hero_is_refused(session):
    order = _order(session)
    first = CreateQuick.create(session, hero=order)
    session.commit()
    with pytest.raises(
        WorkflowAlreadyOngoing,
        match=rf"CreateQuick: an ongoing workflow \(id={first.id}\) already exists for hero "
        rf"Order id={order.id}.*allow_multiple=True",
    ):
        CreateQuick.create(session, hero=order)


def test_the_callers_transaction_stays_usable_after_a_refused_create(session):
    order = _order(session)
    CreateQuick.create(session, hero=order)
    session.commit()
    with pytest.raises(WorkflowAlreadyOngoing):
        CreateQuick.create(session, hero=order)
    session.add(AuditEntry(order_id=order.id, note="after the refusal"))
    session.commit()
    assert session.execute(select(AuditEntry.note)).scalars().all() == ["after the refusal"]
    assert _workflow_count(session) == 1


def test_losing_the_race_to_the_unique_index_is_refused_and_keeps_the_transaction(
    session, monkeypatch
):
    # Simulate another process inserting between our check and our insert: the check sees
    # nothing, the database's partial unique index refuses the row.
    order = _order(session)
    CreateQuick.create(session, hero=order)
    session.commit()
    monkeypatch.setattr(gd_queries, "find_ongoing_duplicate", lambda *args: None)
    with pytest.raises(WorkflowAlreadyOngoing, match=r"CreateQuick: an ongoing workflow already"):
        CreateQuick.create(session, hero=order)
    session.add(AuditEntry(order_id=order.id, note="after the race"))
    session.commit()
    assert session.execute(select(AuditEntry.note)).scalars().all() == ["after the race"]
    assert _workflow_count(session) == 1


def test_a_refused_create_leaves_no_rows_behind(session):
    order = _order(session)
    CreateQuick.create(session, hero=order)
    session.commit()
    with pytest.raises(WorkflowAlreadyOngoing):
        CreateQuick.create(session, hero=order)
    session.commit()
    count = session.execute(select(func.count()).select_from(StepExecution)).scalar_one()
    assert count == 1


def test_allow_multiple_permits_another_ongoing_workflow_for_the_hero(session):
    order = _order(session)
    CreateQuick.create(session, hero=order)
    second = CreateQuick.create(session, hero=order, allow_multiple=True)
    session.commit()
    assert second.allow_multiple is True
    assert _workflow_count(session) == 2


def test_an_allow_multiple_workflow_does_not_block_a_single_one(session):
    order = _order(session)
    CreateQuick.create(session, hero=order, allow_multiple=True)
    CreateQuick.create(session, hero=order)
    session.commit()
    assert _workflow_count(session) == 2


def test_a_finished_workflow_does_not_block_a_new_one(session):
    order = _order(session)
    first = CreateQuick.create(session, hero=order)
    session.commit()
    speedrun(first)
    assert_workflow_state(first, "finished")
    CreateQuick.create(session, hero=order)
    session.commit()
    assert _workflow_count(session) == 2


def test_a_canceled_workflow_does_not_block_a_new_one(session):
    order = _order(session)
    first = CreateQuick.create(session, hero=order)
    session.commit()
    first.cancel()
    session.commit()
    CreateQuick.create(session, hero=order)
    session.commit()
    assert _workflow_count(session) == 2


def test_a_paused_workflow_still_blocks_a_new_one(session):
    order = _order(session)
    first = CreateQuick.create(session, hero=order)
    session.commit()
    first.pause()
    session.commit()
    with pytest.raises(WorkflowAlreadyOngoing):
        CreateQuick.create(session, hero=order)


def test_different_classes_for_one_hero_do_not_block_each_other(session):
    order = _order(session)
    CreateQuick.create(session, hero=order)
    CreateOtherForSameHero.create(session, hero=order)
    session.commit()
    assert _workflow_count(session) == 2


def test_one_class_for_different_heroes_do_not_block_each_other(session):
    CreateQuick.create(session, hero=_order(session))
    CreateQuick.create(session, hero=_order(session))
    session.commit()
    assert _workflow_count(session) == 2


def test_heroes_of_different_types_with_equal_ids_do_not_block_each_other(session):
    order = _order(session)
    account = Account(id=str(order.id))
    session.add(account)
    CreateQuick.create(session, hero=order)
    CreateQuick.create(session, hero=account)
    session.commit()
    assert _workflow_count(session) == 2


# -- per-instance job options --------------------------------------------------------------


def test_step_job_options_are_stored_and_read_back_after_a_reload(session):
    wf = CreateQuick.create(
        session, hero=_order(session), step_job_options={"queue": "vip", "priority": 9}
    )
    session.commit()
    other, loaded = _fresh(session, wf)
    with other:
        assert loaded.step_job_options == {"queue": "vip", "priority": 9}


def test_a_workflow_without_step_job_options_reads_an_empty_dict(session):
    wf = CreateQuick.create(session, hero=_order(session))
    assert wf.step_job_options == {}
    assert wf.metadata_json is None


def test_invalid_step_job_options_are_refused_naming_the_class(session):
    with pytest.raises(
        StepConfigurationError, match=r"CreateQuick\.step_job_options: job_options priority="
    ):
        CreateQuick.create(session, hero=_order(session), step_job_options={"priority": "urgent"})
    assert _workflow_count(session) == 0


def test_step_job_options_cannot_schedule_the_step(session):
    with pytest.raises(StepConfigurationError, match=r"CreateQuick\.step_job_options: .*wait"):
        CreateQuick.create(session, hero=_order(session), step_job_options={"wait": 5})


def test_clearing_step_job_options_removes_them(session):
    wf = CreateQuick.create(session, hero=_order(session), step_job_options={"queue": "vip"})
    wf.step_job_options = {}
    assert wf.step_job_options == {}


def test_per_instance_job_options_do_not_affect_uniqueness(session):
    order = _order(session)
    CreateQuick.create(session, hero=order, step_job_options={"queue": "a"})
    with pytest.raises(WorkflowAlreadyOngoing):
        CreateQuick.create(session, hero=order, step_job_options={"queue": "b"})


def test_job_options_merge_class_then_instance_then_step(session):
    wf = CreateTwoSteps.create(
        session, hero=_order(session), step_job_options={"priority": 7, "queue": "instance"}
    )
    merged_first = wf.merged_job_options(CreateTwoSteps.steps.named("first"))
    merged_second = wf.merged_job_options(CreateTwoSteps.steps.named("second"))
    assert merged_first == {"queue": "instance", "priority": 7}
    assert merged_second == {"queue": "step-queue", "priority": 7}


def test_the_first_execution_is_queued_with_the_merged_job_options(session):
    wf = CreateTwoSteps.create(session, hero=_order(session), step_job_options={"priority": 7})
    session.commit()
    execution = wf.current_execution
    assert (execution.queue, execution.priority) == ("class-queue", 7)


# -- rows whose class is gone --------------------------------------------------------------


def test_a_row_whose_class_no_longer_exists_loads_as_the_base_workflow(session):
    wf = CreateVanishing.create(session, hero=_order(session))
    session.commit()
    session.execute(update(Workflow).where(Workflow.id == wf.id).values(type="RenamedAwayLongAgo"))
    session.commit()
    other, loaded = _fresh(session, wf)
    with other:
        assert type(loaded) is Workflow
        assert loaded.type == "RenamedAwayLongAgo"
        assert loaded.next_step_name == "only"
        assert len(loaded.steps) == 0


def test_a_row_of_a_vanished_class_shows_up_in_queries_over_all_workflows(session):
    wf = CreateVanishing.create(session, hero=_order(session))
    session.commit()
    session.execute(update(Workflow).where(Workflow.id == wf.id).values(type="GoneForGood"))
    session.commit()
    with Session(session.get_bind()) as other:
        rows = other.execute(select(Workflow)).scalars().all()
        assert [(type(r), r.type) for r in rows] == [(Workflow, "GoneForGood")]


def test_a_row_of_a_vanished_class_is_flushed_as_the_base_workflow_without_a_warning(session):
    wf = CreateVanishing.create(session)
    session.commit()
    session.execute(update(Workflow).where(Workflow.id == wf.id).values(type="DroppedInADeploy"))
    session.commit()
    other, loaded = _fresh(session, wf)
    with other, warnings.catch_warnings():
        warnings.simplefilter("error", SAWarning)  # "incompatible polymorphic identity"
        loaded.state = WorkflowState.PAUSED
        other.commit()
        other.refresh(loaded)
        assert (type(loaded), loaded.type, loaded.state) == (
            Workflow,
            "DroppedInADeploy",
            WorkflowState.PAUSED,
        )


# -- identities ----------------------------------------------------------------------------


def test_two_different_classes_with_one_identity_are_refused_naming_both():
    with pytest.raises(
        StepConfigurationError,
        match=r"workflow type 'CreateQuick' is already used by "
        r"tests\.definitions\.test_create_and_hero\.CreateQuick; set workflow_type",
    ):

        class CreateQuick(Workflow):  # a second class under the same name
            pass


def test_a_custom_workflow_type_clashing_with_another_class_is_refused():
    with pytest.raises(StepConfigurationError, match=r"workflow type 'CreateTwoSteps'"):
        type("CreateCustomClash", (Workflow,), {"workflow_type": "CreateTwoSteps"})

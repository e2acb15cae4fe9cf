"""What ``hero_type`` stores, and how a stored one finds its class, when two mapped classes
share a name. Database tests run on every backend.

Each test maps its own ``Parcel`` classes (two declarative bases, as two modules of one app
would) and disposes of them afterwards, so that no other test sees a second ``Parcel``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Integer, func, select
from sqlalchemy.orm import DeclarativeBase, Session, mapped_column

from geneva_drive import (
    AmbiguousHeroType,
    StepConfigurationError,
    StepExecution,
    Workflow,
    WorkflowState,
    step,
)
from geneva_drive.admin import for_hero
from geneva_drive.storage.heroes import loaded_hero_types, resolve_hero_class
from geneva_drive.storage.serialization import decode, decoding_session, encode
from geneva_drive.testing import speedrun
from tests.support.app import Order


class HeroTypesTouch(Workflow):
    @step
    def touch(self):
        self.hero.touched += 1


class _Parcels:
    """Maps ``Parcel`` classes on bases of their own; disposes of them all at the end."""

    def __init__(self) -> None:
        # Held here: a class nothing refers to may be garbage-collected, leaving its registry.
        self.classes: list[Any] = []

    def define(self, module: str, **attributes: Any) -> Any:
        base = type("Base", (DeclarativeBase,), {"__module__": f"shop.{module}"})
        cls = type(
            "Parcel",
            (base,),
            {
                "__module__": f"shop.{module}",
                "__tablename__": f"{module}_parcels",
                "id": mapped_column(Integer, primary_key=True),
                "touched": mapped_column(Integer, default=0),
                **attributes,
            },
        )
        self.classes.append(cls)
        return cls

    def dispose(self) -> None:
        for cls in self.classes:
            cls.registry.dispose()


@pytest.fixture
def parcels() -> Iterator[_Parcels]:
    made = _Parcels()
    yield made
    made.dispose()


def _saved(session: Session, cls: Any, id_: int = 1) -> Any:
    cls.metadata.create_all(session.connection())
    hero = cls(id=id_)
    session.add(hero)
    session.flush()
    return hero


def _touched(session: Session, cls: Any) -> list[int]:
    return list(session.scalars(select(cls.touched).order_by(cls.id)))


def _workflow_count(session: Session) -> int:
    return session.execute(select(func.count()).select_from(Workflow)).scalar_one()


# -- storing --------------------------------------------------------------------------------


def test_a_hero_whose_class_name_is_shared_is_refused_at_create_naming_both_classes(
    session, parcels
):
    warehouse = parcels.define("warehouse")
    post = parcels.define("post")
    _saved(session, warehouse)
    hero = _saved(session, post)
    with pytest.raises(AmbiguousHeroType) as raised:
        HeroTypesTouch.create(session, hero=hero)
    message = str(raised.value)
    assert message.startswith("HeroTypesTouch.create(hero=...): hero_type 'Parcel' names 2 ")
    assert "shop.warehouse.Parcel (table warehouse_parcels)" in message
    assert "shop.post.Parcel (table post_parcels)" in message
    assert "__hero_type__ = 'post.Parcel'" in message
    assert isinstance(raised.value, StepConfigurationError)
    assert _workflow_count(session) == 0


def test_create_many_refuses_an_ambiguous_hero_and_stores_none_of_the_batch(session, parcels):
    warehouse = parcels.define("warehouse")
    post = parcels.define("post")
    order = Order()
    session.add(order)
    heroes = [order, _saved(session, warehouse)]
    _saved(session, post)
    with pytest.raises(AmbiguousHeroType, match=r"HeroTypesTouch\.create_many\(hero=\.\.\.\)"):
        HeroTypesTouch.create_many(session, heroes=heroes)
    assert _workflow_count(session) == 0


def test_a_declared_hero_type_is_stored_and_each_step_touches_its_own_table(session, parcels):
    warehouse = parcels.define("warehouse")
    post = parcels.define("post", __hero_type__="post.Parcel")
    in_warehouse, in_post = _saved(session, warehouse), _saved(session, post)  # both id 1
    by_post = HeroTypesTouch.create(session, hero=in_post)
    by_warehouse = HeroTypesTouch.create(session, hero=in_warehouse)
    session.commit()
    assert (by_post.hero_type, by_post.hero_id) == ("post.Parcel", "1")
    assert (by_warehouse.hero_type, by_warehouse.hero_id) == ("Parcel", "1")

    speedrun(by_post)
    assert (_touched(session, post), _touched(session, warehouse)) == ([1], [0])
    speedrun(by_warehouse)
    assert (_touched(session, post), _touched(session, warehouse)) == ([1], [1])
    assert by_post.state == by_warehouse.state == WorkflowState.FINISHED


def test_a_class_with_a_unique_name_stores_its_bare_name_as_before(session, parcels):
    warehouse = parcels.define("warehouse")
    wf = HeroTypesTouch.create(session, hero=_saved(session, warehouse))
    session.commit()
    assert wf.hero_type == "Parcel"
    speedrun(wf)
    assert _touched(session, warehouse) == [1]


@pytest.mark.parametrize(
    ("declared", "rule"),
    [
        (42, "expected a non-empty str"),
        ("", "expected a non-empty str"),
        ("post:Parcel", "may not contain ':'"),
    ],
)
def test_an_unusable_declared_hero_type_is_refused_at_create(session, parcels, declared, rule):
    post = parcels.define("post", __hero_type__=declared)
    hero = _saved(session, post)
    with pytest.raises(StepConfigurationError) as raised:
        HeroTypesTouch.create(session, hero=hero)
    message = str(raised.value)
    assert message.startswith("HeroTypesTouch.create(hero=...): ")
    assert f"shop.post.Parcel.__hero_type__ = {declared!r}" in message
    assert rule in message
    assert _workflow_count(session) == 0


# -- resolving ------------------------------------------------------------------------------


def test_a_stored_name_two_classes_share_fails_the_step_naming_both_and_touches_no_row(
    session, parcels
):
    # A process with only the warehouse's model loaded stored the row; this one has both.
    warehouse = parcels.define("warehouse")
    wf = HeroTypesTouch.create(session, hero=_saved(session, warehouse))
    session.commit()
    assert resolve_hero_class("Parcel") is warehouse  # resolved (and cached) while unique
    post = parcels.define("post")
    _saved(session, post)
    session.commit()

    with pytest.raises(AmbiguousHeroType, match=r"hero_type 'Parcel' names 2 mapped classes"):
        speedrun(wf)
    session.expire_all()
    assert (_touched(session, warehouse), _touched(session, post)) == ([0], [0])
    execution = session.scalars(
        select(StepExecution).where(StepExecution.workflow_id == wf.id)
    ).one()
    assert "shop.warehouse.Parcel" in execution.error_message
    assert "shop.post.Parcel" in execution.error_message
    assert execution.error_class_name.endswith("AmbiguousHeroType")
    assert wf.state == WorkflowState.PAUSED  # the default policy: resume once a name is set


def test_the_cache_follows_classes_mapped_and_disposed_after_a_lookup(parcels):
    warehouse = parcels.define("warehouse")
    assert resolve_hero_class("Parcel") is warehouse
    later = _Parcels()
    later.define("post")
    with pytest.raises(AmbiguousHeroType, match=r"shop\.post\.Parcel"):
        resolve_hero_class("Parcel")
    later.dispose()
    assert resolve_hero_class("Parcel") is warehouse


def test_a_declared_hero_type_resolves_and_the_bare_name_no_longer_does(parcels):
    post = parcels.define("post", __hero_type__="post.Parcel")
    assert resolve_hero_class("post.Parcel") is post
    with pytest.raises(LookupError, match="names no mapped class"):
        resolve_hero_class("Parcel")


def test_a_worker_claims_rows_of_a_declared_hero_type(parcels):
    parcels.define("post", __hero_type__="post.Parcel")
    names = loaded_hero_types()
    assert "post.Parcel" in names
    assert "Parcel" not in names


# -- reading by hero ------------------------------------------------------------------------


def test_for_hero_and_ongoing_for_find_workflows_by_the_declared_hero_type(session, parcels):
    parcels.define("warehouse")
    post = parcels.define("post", __hero_type__="post.Parcel")
    hero = _saved(session, post)
    wf = HeroTypesTouch.create(session, hero=hero)
    session.commit()
    assert wf.hero_type == "post.Parcel"
    assert [w.id for w in for_hero(session, hero)] == [wf.id]
    assert [w.id for w in HeroTypesTouch.ongoing_for(hero, session)] == [wf.id]


def test_for_hero_refuses_a_hero_whose_class_name_is_shared(session, parcels):
    warehouse = parcels.define("warehouse")
    parcels.define("post")
    hero = _saved(session, warehouse)
    with pytest.raises(AmbiguousHeroType, match=r"for_hero\(.*\): hero_type 'Parcel' names 2"):
        for_hero(session, hero)


def test_a_stored_reference_uses_the_declared_hero_type_and_loads_its_own_class(session, parcels):
    warehouse = parcels.define("warehouse")
    post = parcels.define("post", __hero_type__="post.Parcel")
    _saved(session, warehouse)
    hero = _saved(session, post)
    stored = encode({"parcel": hero})
    assert "post.Parcel" in str(stored)
    with decoding_session(session):
        assert decode(stored)["parcel"] is hero

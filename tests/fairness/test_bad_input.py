"""A bad fairness_key is a clear error naming the class, and leaves the database unchanged."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from geneva_drive import StepConfigurationError, StepExecution, Workflow, step
from geneva_drive.storage.models import FairKey
from tests.support.app import Account


def test_a_fairness_key_that_is_not_callable_is_a_class_definition_error():
    with pytest.raises(StepConfigurationError, match=r"NotCallable\.fairness_key: expected a"):

        class NotCallable(Workflow):
            fairness_key = "tenant"  # type: ignore[assignment]

            @step
            def one(self) -> None:
                pass


def _raises(wf: Any) -> str:
    raise LookupError("no tenant")


class RaisingKey(Workflow):
    fairness_key = _raises

    @step
    def one(self) -> None:
        pass


class FloatKey(Workflow):
    fairness_key = lambda wf: 1.5  # noqa: E731

    @step
    def one(self) -> None:
        pass


class BoolKey(Workflow):
    fairness_key = lambda wf: True  # noqa: E731

    @step
    def one(self) -> None:
        pass


class EmptyKey(Workflow):
    fairness_key = lambda wf: ""  # noqa: E731

    @step
    def one(self) -> None:
        pass


def _nothing_written(session: Session) -> None:
    session.rollback()
    assert session.scalar(select(func.count()).select_from(StepExecution)) == 0
    assert session.scalar(select(func.count()).select_from(FairKey)) == 0


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (
            RaisingKey,
            # create_many() names the item too
            r"RaisingKey\.fairness_key raised LookupError: no tenant \(for the hero "
            r"Account 'x'(, heroes\[0\] of create_many\(\))?\); make it return a str or int",
        ),
        (FloatKey, r"FloatKey\.fairness_key returned 1\.5 .*non-empty str .*an int, or None"),
        (BoolKey, r"BoolKey\.fairness_key returned True"),
        (EmptyKey, r"EmptyKey\.fairness_key returned ''"),
    ],
)
def test_a_key_callable_that_raises_or_returns_no_key_fails_create_before_any_write(
    gd, session, cls, message
):
    hero = Account(id="x", email="x@a.example")
    session.add(hero)
    session.commit()

    with pytest.raises(StepConfigurationError, match=message):
        cls.create(session, hero=hero)
    _nothing_written(session)

    with pytest.raises(StepConfigurationError, match=message):
        cls.create_many(session, heroes=[hero])
    _nothing_written(session)

"""Bad limits are refused when the class is defined, naming the class and step; a key callable
that fails is an error naming both: create()'s for a first step (nothing written), the step's
for a later one (tests/limits/test_keys.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from geneva_drive import ConcurrencyLimit, RateLimit, StepConfigurationError, Workflow, step
from geneva_drive.storage.models import StepExecution
from tests.limits._support import counts


class SecondGatewayUser(Workflow):
    may_proceed_without_hero = True

    @step(rate_limit=RateLimit(10, per=timedelta(seconds=1), key="gateway"))
    def refund(self) -> None:
        pass


class KeyRaises(Workflow):
    may_proceed_without_hero = True
    concurrency = ConcurrencyLimit(1, key=lambda wf: 1 / 0)

    @step(on_exception="cancel")
    def work(self) -> None:
        pass


class KeyIsNone(Workflow):
    may_proceed_without_hero = True

    @step(concurrency=ConcurrencyLimit(1, key=lambda wf: None), on_exception="cancel")
    def work(self) -> None:
        pass


@pytest.mark.parametrize("n", [0, -1, 1.5, True, "2"])
def test_a_step_limit_that_is_no_whole_number_of_at_least_one_is_refused(n):
    with pytest.raises(StepConfigurationError) as refused:

        class BadStepLimit(Workflow):
            may_proceed_without_hero = True

            @step(concurrency=ConcurrencyLimit(n))
            def work(self) -> None:
                pass

    message = str(refused.value)
    assert "BadStepLimit.step 'work': concurrency=" in message
    assert "at least 1" in message


@pytest.mark.parametrize("n", [0, -1])
def test_a_class_limit_of_zero_or_less_is_refused_naming_the_class(n):
    with pytest.raises(StepConfigurationError, match=r"BadClassLimit\.concurrency .*at least 1"):

        class BadClassLimit(Workflow):
            may_proceed_without_hero = True
            concurrency = ConcurrencyLimit(n)

            @step
            def work(self) -> None:
                pass


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (RateLimit(0, per=timedelta(seconds=1)), "at least 1"),
        (RateLimit(-1, per=timedelta(seconds=1)), "at least 1"),
        (RateLimit(10, per=timedelta(0)), "positive timedelta"),
        (RateLimit(10, per=1), "positive timedelta"),  # type: ignore[arg-type]
        (RateLimit(10, per=timedelta(seconds=1), key=""), "non-empty str"),
        (ConcurrencyLimit(1), "takes a RateLimit"),
    ],
)
def test_a_bad_rate_limit_is_refused_naming_the_step(limit, expected):
    with pytest.raises(StepConfigurationError) as refused:

        class BadRate(Workflow):
            may_proceed_without_hero = True

            @step(rate_limit=limit)
            def charge(self) -> None:
                pass

    assert "BadRate.step 'charge': rate_limit=" in str(refused.value)
    assert expected in str(refused.value)


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        (KeyRaises, "KeyRaises.step 'work': the concurrency key callable raised ZeroDivisionError"),
        (KeyIsNone, "KeyIsNone.step 'work': the concurrency key callable returned None"),
    ],
)
def test_a_first_steps_key_callable_that_fails_is_creates_error_and_writes_nothing(
    gd, session, cls, expected
):
    with pytest.raises(StepConfigurationError) as refused:
        cls.create(session)

    assert expected in str(refused.value)
    assert "(for the workflow without a hero)" in str(refused.value)
    session.commit()
    assert session.scalar(select(func.count()).select_from(StepExecution)) == 0
    assert counts(session) == (0, 0, 0)

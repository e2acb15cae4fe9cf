"""Names a class declares are stored as text too (the workflow type, the signals its steps wait
for): one with a NUL or a lone surrogate is refused when the class is defined, as every value a
caller passes is refused at the call (tests/engine/test_hostile_text.py)."""

from __future__ import annotations

import pytest

from geneva_drive import StepConfigurationError, Workflow, step


@pytest.mark.parametrize("bad", ["Order\x00Flow", "Order\ud800Flow"])
def test_a_workflow_type_that_cannot_be_stored_is_refused_at_class_definition(bad):
    with pytest.raises(StepConfigurationError, match=r"workflow type .* holds a (NUL|lone)"):

        class HostileType(Workflow):
            workflow_type = bad

            @step
            def only(self) -> None:
                pass


@pytest.mark.parametrize("bad", ["paid\x00", "\udfffpaid"])
def test_a_signal_name_that_cannot_be_stored_is_refused_at_class_definition(bad):
    with pytest.raises(StepConfigurationError, match=r"wait_for= names a signal .* holds a"):

        class HostileWaitFor(Workflow):
            @step(wait_for=bad)
            def only(self) -> None:
                pass


def test_a_matcher_naming_a_signal_that_cannot_be_stored_is_refused_at_class_definition():
    class Matcher:
        names = ("approved", "re\x00jected")

        def matches(self, signal: object) -> bool:
            return True

    with pytest.raises(StepConfigurationError, match=r"its names= holds 're\\x00jected'"):

        class HostileMatcher(Workflow):
            @step(wait_for=Matcher())
            def only(self) -> None:
                pass

"""Positional order of steps (``before_step=`` / ``after_step=``) and navigating it."""

from __future__ import annotations

from geneva_drive import Workflow, removed_step, step


class OrderingFirstThird(Workflow):
    @step
    def first(self):
        pass

    @step
    def third(self):
        pass

    @step(before_step="third")
    def second(self):
        pass


class OrderingNumbered(Workflow):
    @step
    def step_1(self):
        pass

    @step
    def step_4(self):
        pass

    @step(after_step="step_1")
    def step_2(self):
        pass

    @step(before_step="step_4")
    def step_3(self):
        pass


class OrderingRelativeToPositioned(Workflow):
    @step
    def a(self):
        pass

    @step
    def d(self):
        pass

    @step(after_step="a")
    def c(self):
        pass

    @step(before_step="c")
    def b(self):
        pass


class OrderingAheadOfFirst(Workflow):
    @step
    def defined_first(self):
        pass

    @step(before_step="defined_first")
    def runs_first(self):
        pass


class OrderingByReference(Workflow):
    @step
    def a(self):
        pass

    @step
    def c(self):
        pass

    @step(after_step=a)
    def b(self):
        pass


class OrderingParent(Workflow):
    @step
    def p1(self):
        pass

    @step
    def p2(self):
        pass


class OrderingChild(OrderingParent):
    @step(before_step="p2")
    def c_between(self):
        pass

    @step(after_step="p2")
    def c_after(self):
        pass

    @step(before_step="p1")
    def c_before(self):
        pass

    @step
    def c_appended(self):
        pass


class OrderingWithGravestones(Workflow):
    gone_first = removed_step("gone_first")

    @step
    def a(self):
        pass

    gone_middle = removed_step("gone_middle")

    @step
    def b(self):
        pass

    gone_last = removed_step("gone_last")


class OrderingEmpty(Workflow):
    pass


# -- computing the order -------------------------------------------------------------------


def test_steps_without_positions_run_in_definition_order():
    assert OrderingParent.steps.names == ["p1", "p2"]


def test_before_step_inserts_a_step_right_before_the_referenced_one():
    assert OrderingFirstThird.steps.names == ["first", "second", "third"]


def test_after_step_and_before_step_combine():
    assert OrderingNumbered.steps.names == ["step_1", "step_2", "step_3", "step_4"]


def test_a_step_can_be_positioned_relative_to_a_positioned_step():
    assert OrderingRelativeToPositioned.steps.names == ["a", "b", "c", "d"]


def test_a_position_may_reference_the_step_definition_object():
    assert OrderingByReference.steps.names == ["a", "b", "c"]
    assert OrderingByReference.steps.named("b").after_step == "a"


def test_a_subclass_can_insert_steps_around_inherited_ones():
    assert OrderingChild.steps.names == [
        "c_before",
        "p1",
        "c_between",
        "p2",
        "c_after",
        "c_appended",
    ]


def test_a_subclass_does_not_change_the_parents_order():
    assert OrderingParent.steps.names == ["p1", "p2"]


def test_the_raw_definition_list_keeps_definition_order():
    names = [d.name for d in OrderingFirstThird._step_definitions]
    assert names == ["first", "third", "second"]


# -- navigating ----------------------------------------------------------------------------


def test_the_first_step_is_the_first_in_positional_order_not_definition_order():
    # DESIGN 4.2 #2: the gem started at the first *defined* step (H-2).
    assert OrderingAheadOfFirst.steps.next_after(None).name == "runs_first"


def test_next_after_returns_the_following_step():
    assert OrderingFirstThird.steps.next_after("first").name == "second"
    assert OrderingFirstThird.steps.next_after("second").name == "third"


def test_next_after_the_last_step_is_none():
    assert OrderingFirstThird.steps.next_after("third") is None


def test_next_after_an_unknown_step_is_none():
    assert OrderingFirstThird.steps.next_after("nope") is None


def test_previous_before_returns_the_preceding_step():
    assert OrderingFirstThird.steps.previous_before("third").name == "second"


def test_previous_before_the_first_an_unknown_or_no_step_is_none():
    steps = OrderingFirstThird.steps
    assert steps.previous_before("first") is None
    assert steps.previous_before("nope") is None
    assert steps.previous_before(None) is None


def test_navigation_steps_over_removed_steps():
    steps = OrderingWithGravestones.steps
    assert steps.next_after(None).name == "a"
    assert steps.next_after("a").name == "b"
    assert steps.next_after("b") is None
    assert steps.previous_before("b").name == "a"


def test_navigation_from_a_removed_step_continues_with_its_neighbours():
    steps = OrderingWithGravestones.steps
    assert steps.next_after("gone_middle").name == "b"
    assert steps.previous_before("gone_middle").name == "a"
    assert steps.next_after("gone_first").name == "a"


def test_a_workflow_without_steps_has_no_first_step():
    assert OrderingEmpty.steps.next_after(None) is None
    assert len(OrderingEmpty.steps) == 0


# -- the collection ------------------------------------------------------------------------


def test_the_collection_is_a_sequence_of_definitions_in_order():
    steps = OrderingFirstThird.steps
    assert len(steps) == 3
    assert steps[0].name == "first"
    assert steps[-1].name == "third"
    assert [d.name for d in steps] == ["first", "second", "third"]
    assert [d.name for d in steps[1:]] == ["second", "third"]


def test_named_finds_a_step_by_name_and_returns_none_otherwise():
    steps = OrderingFirstThird.steps
    assert steps.named("second") is OrderingFirstThird.second
    assert steps.named("nope") is None
    assert steps.named(None) is None


def test_membership_is_tested_by_step_name():
    assert "second" in OrderingFirstThird.steps  # type: ignore[comparison-overlap]
    assert "nope" not in OrderingFirstThird.steps  # type: ignore[comparison-overlap]


def test_removed_steps_are_members_but_not_runnable():
    steps = OrderingWithGravestones.steps
    assert "gone_middle" in steps  # type: ignore[comparison-overlap]
    assert [d.name for d in steps.runnable()] == ["a", "b"]

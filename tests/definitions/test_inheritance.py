"""What a subclass inherits, what it adds, and what it must not change in its parent."""

from __future__ import annotations

import pytest

from geneva_drive import ExceptionPolicy, StepConfigurationError, Workflow, step
from geneva_drive.engine.prepare import cancel_conditions_hold

PARENT_POLICY = ExceptionPolicy("reattempt", matching=TimeoutError, max_reattempts=5)
CHILD_POLICY = ExceptionPolicy("skip", matching=KeyError)


class InheritanceParent(Workflow):
    job_options = {"queue": "parent", "priority": 1}
    exception_policies = [PARENT_POLICY]
    may_proceed_without_hero = True

    def cancel_if(self):
        return getattr(self, "parent_says_cancel", False)

    @step
    def p1(self):
        pass

    @step
    def p2(self):
        pass


class InheritanceChild(InheritanceParent):
    job_options = {"queue": "child"}
    exception_policies = [CHILD_POLICY]

    def cancel_if(self):
        return getattr(self, "child_says_cancel", False)

    @step
    def c1(self):
        pass


class InheritanceSibling(InheritanceParent):
    @step
    def s1(self):
        pass


class InheritanceGrandchild(InheritanceChild):
    pass


class InheritanceSinglePolicy(Workflow):
    # A single policy is accepted, though the ClassVar is typed as a sequence.
    exception_policies = ExceptionPolicy("cancel")  # type: ignore[assignment]


class InheritanceCustomType(Workflow):
    workflow_type = "inheritance-custom-type"


class InheritanceCustomTypeChild(InheritanceCustomType):
    pass


# -- steps ---------------------------------------------------------------------------------


def test_a_subclass_runs_the_parents_steps_then_its_own():
    assert InheritanceChild.steps.names == ["p1", "p2", "c1"]


def test_a_subclass_shares_the_parents_step_definitions():
    assert InheritanceChild.steps.named("p1") is InheritanceParent.steps.named("p1")


def test_adding_steps_in_a_subclass_leaves_the_parent_unchanged():
    assert InheritanceParent.steps.names == ["p1", "p2"]


def test_sibling_subclasses_do_not_see_each_others_steps():
    assert InheritanceSibling.steps.names == ["p1", "p2", "s1"]
    assert "s1" not in InheritanceChild.steps  # type: ignore[comparison-overlap]


def test_a_subclass_without_steps_inherits_all_of_them():
    assert InheritanceGrandchild.steps.names == ["p1", "p2", "c1"]


def test_a_subclass_cannot_redefine_an_inherited_step():
    with pytest.raises(
        StepConfigurationError,
        match=r"InheritanceOverride\.step 'p1'.*already defined in this class or a parent",
    ):

        class InheritanceOverride(InheritanceParent):
            @step
            def p1(self):
                pass


# -- exception policies --------------------------------------------------------------------


def test_class_exception_policies_accumulate_parent_first():
    assert InheritanceChild._exception_policies == [PARENT_POLICY, CHILD_POLICY]


def test_a_subclass_without_policies_inherits_the_parents():
    assert InheritanceSibling._exception_policies == [PARENT_POLICY]
    assert InheritanceGrandchild._exception_policies == [PARENT_POLICY, CHILD_POLICY]


def test_a_single_policy_may_be_given_without_a_list():
    assert len(InheritanceSinglePolicy._exception_policies) == 1
    assert InheritanceSinglePolicy._exception_policies[0].action == "cancel"


def test_class_exception_policies_must_be_policy_objects():
    with pytest.raises(
        StepConfigurationError,
        match=r"InheritanceBadPolicies\.exception_policies: expected ExceptionPolicy objects",
    ):

        class InheritanceBadPolicies(Workflow):
            exception_policies = ["reattempt"]  # type: ignore[list-item]


# -- job options ---------------------------------------------------------------------------


def test_class_job_options_merge_with_the_child_overriding_the_parent():
    assert InheritanceChild._job_options == {"queue": "child", "priority": 1}


def test_a_subclass_without_job_options_inherits_the_parents():
    assert InheritanceSibling._job_options == {"queue": "parent", "priority": 1}


def test_adding_job_options_in_a_subclass_leaves_the_parent_unchanged():
    assert InheritanceParent._job_options == {"queue": "parent", "priority": 1}


def test_invalid_class_job_options_name_the_class():
    with pytest.raises(
        StepConfigurationError, match=r"InheritanceBadJobOptions\.job_options: .*priority= must"
    ):

        class InheritanceBadJobOptions(Workflow):
            job_options = {"priority": "urgent"}


# -- cancel conditions ---------------------------------------------------------------------


def test_cancel_conditions_accumulate_across_subclasses():
    assert len(InheritanceChild._cancel_conditions) == 2
    wf = InheritanceChild()
    assert not cancel_conditions_hold(wf)
    wf.parent_says_cancel = True  # type: ignore[attr-defined]
    assert cancel_conditions_hold(wf)
    wf.parent_says_cancel, wf.child_says_cancel = False, True  # type: ignore[attr-defined]
    assert cancel_conditions_hold(wf)


def test_a_subclass_without_cancel_if_keeps_the_parents_condition():
    assert InheritanceSibling._cancel_conditions == InheritanceParent._cancel_conditions


def test_cancel_if_must_be_callable():
    with pytest.raises(
        StepConfigurationError, match=r"InheritanceBadCancelIf\.cancel_if must be a method"
    ):

        class InheritanceBadCancelIf(Workflow):
            cancel_if = True


# -- hooks and flags -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "hook", ["before_step_execution", "after_step_execution", "around_step_execution"]
)
def test_a_hook_must_be_a_method(hook):
    with pytest.raises(
        StepConfigurationError, match=rf"InheritanceBadHook\.{hook} must be a method"
    ):
        type("InheritanceBadHook", (Workflow,), {hook: "not a method"})


def test_may_proceed_without_hero_is_inherited_and_defaults_to_false():
    assert InheritanceChild.may_proceed_without_hero is True
    assert Workflow.may_proceed_without_hero is False


# -- polymorphic identity ------------------------------------------------------------------


def _identity(cls):
    return cls.__mapper__.polymorphic_identity


def test_a_workflow_type_defaults_to_the_class_name():
    assert _identity(InheritanceChild) == "InheritanceChild"


def test_workflow_type_overrides_the_stored_type():
    assert _identity(InheritanceCustomType) == "inheritance-custom-type"


def test_workflow_type_is_not_inherited():
    assert _identity(InheritanceCustomTypeChild) == "InheritanceCustomTypeChild"


def test_a_subclass_identity_is_registered_for_polymorphic_loading():
    assert InheritanceParent.__mapper__.polymorphic_map["InheritanceChild"].class_ is (
        InheritanceChild
    )


# SQLAlchemy's two notices that the second class replaces the first, in its class registry and
# for the identity: what a reload does, and what this test checks.
@pytest.mark.filterwarnings(
    "ignore:This declarative base already contains a class with the same class name"
    ":sqlalchemy.exc.SAWarning",
    "ignore:Reassigning polymorphic association for identity 'InheritanceReloaded'"
    ":sqlalchemy.exc.SAWarning",
)
def test_defining_the_same_class_again_replaces_it_instead_of_failing():
    # A module reload defines a class with the same module and qualified name again.
    namespace = {"__module__": __name__, "__qualname__": "InheritanceReloaded"}
    first = type("InheritanceReloaded", (Workflow,), {**namespace, "a": step(lambda wf: None)})
    second = type("InheritanceReloaded", (Workflow,), {**namespace, "b": step(lambda wf: None)})
    assert first is not second
    assert Workflow.__mapper__.polymorphic_map["InheritanceReloaded"].class_ is second

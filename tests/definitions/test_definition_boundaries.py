"""Issue 14, items 6, 10, 11, 13 and 15: mistakes caught where they are written (no database).

Each test fails on the code before the issue: async steps were accepted and recorded as done,
NaN waits were raw ValueErrors, unknown options bare TypeErrors naming neither class nor step,
`skip_if="typo"` failed only when the step ran, a bare `removed_step()` did nothing.
Classes that must fail are built inside ``pytest.raises``: they never register.
"""

from __future__ import annotations

import functools
import math
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest

from geneva_drive import ExceptionPolicy, StepConfigurationError, Workflow, removed_step
from geneva_drive.core.errors import SerializationError, UnknownStepOptionError
from geneva_drive.definition.policy import PolicyError
from geneva_drive.definition.steps import repeat_step, resumable_step, step
from geneva_drive.runtime.backends import DatabaseBackend, InlineBackend
from geneva_drive.storage.serialization import MAX_DEPTH, decode, dumps, encode


def _noop(wf):
    pass


async def _async_step(wf):
    pass


async def _async_generator_step(wf):
    yield


async def _async_walk(wf, it):
    pass


# -- item 6 (issue 37): async steps are awaited; what cannot be awaited to one outcome is refused


def test_an_async_generator_step_is_refused_at_class_definition_naming_class_and_step():
    with pytest.raises(
        StepConfigurationError,
        match=r"BoundaryAsync\.step 'a': is an async generator",
    ):
        type("BoundaryAsync", (Workflow,), {"a": step(_async_generator_step)})


def test_async_steps_are_accepted_as_methods_functions_partials_and_repeat_steps():
    class BoundaryAsyncMethod(Workflow):
        @step
        async def pay(self):
            pass

    anon: type[Workflow] = type(
        "BoundaryAsyncAnon", (Workflow,), {"a": step(functools.partial(_async_step))}
    )
    repeated: type[Workflow] = type(
        "BoundaryAsyncRepeat", (Workflow,), {"polls": repeat_step(_async_step, waits=[60, 300])}
    )
    assert [s.name for s in BoundaryAsyncMethod.steps.runnable()] == ["pay"]
    assert len(anon.steps.runnable()) == 1
    assert len(repeated.steps.runnable()) == 2  # one per wait


def test_an_async_resumable_step_is_refused():
    with pytest.raises(StepConfigurationError, match=r"BoundaryAsyncWalk\.step 'a'.*async def"):
        type("BoundaryAsyncWalk", (Workflow,), {"a": resumable_step(_async_walk)})


def test_an_async_skip_if_is_accepted_and_an_async_generator_one_refused():
    async def skip(wf):
        return True

    async def skip_many(wf):
        yield True

    type("BoundaryAsyncSkip", (Workflow,), {"a": step(_noop, skip_if=skip)})
    with pytest.raises(StepConfigurationError, match=r"BoundaryAsyncSkipGen\.step 'a'.*skip_if"):
        type("BoundaryAsyncSkipGen", (Workflow,), {"a": step(_noop, skip_if=skip_many)})


@pytest.mark.parametrize("name", ["cancel_if", "before_step_execution", "after_step_execution"])
def test_async_conditions_and_hooks_are_accepted(name):
    async def hook(self, *args):
        pass

    cls = type(f"BoundaryAsyncHook_{name}", (Workflow,), {"a": step(_noop), name: hook})
    assert getattr(cls, name) is hook


def test_an_async_around_hook_is_refused():
    async def hook(self, *args):
        pass

    with pytest.raises(
        StepConfigurationError, match=r"BoundaryAsyncAround\.around_step_execution is an async"
    ):
        type("BoundaryAsyncAround", (Workflow,), {"a": step(_noop), "around_step_execution": hook})


def test_an_async_policy_handler_is_accepted_and_an_async_generator_refused():
    async def handler(wf, error):
        pass

    async def handler_gen(wf, error):
        yield

    assert ExceptionPolicy(handler=handler).handler is handler
    with pytest.raises(PolicyError, match="is an async generator"):
        ExceptionPolicy(handler=handler_gen)


# -- item 13: waits ------------------------------------------------------------------------


@pytest.mark.parametrize("wait", [math.nan, math.inf, timedelta.max, 10**12])
def test_a_wait_that_is_not_a_finite_usable_duration_is_refused(wait):
    # Before: NaN and infinity raised a raw ValueError/OverflowError from timedelta(), and a
    # huge wait overflowed datetime only when the step was scheduled.
    with pytest.raises(StepConfigurationError, match=r"BoundaryWait\.step 'a': wait="):
        type("BoundaryWait", (Workflow,), {"a": step(_noop, wait=wait)})


def test_a_negative_infinite_wait_is_refused():
    with pytest.raises(StepConfigurationError, match=r"BoundaryWaitNegInf\.step 'a': wait="):
        type("BoundaryWaitNegInf", (Workflow,), {"a": step(_noop, wait=-math.inf)})


def test_the_longest_supported_wait_is_accepted():
    from geneva_drive.storage.limits import MAX_WAIT

    cls = type("BoundaryWaitLongest", (Workflow,), {"a": step(_noop, wait=MAX_WAIT)})
    assert cls.steps.named("a").wait_delta == MAX_WAIT  # type: ignore[attr-defined]


@pytest.mark.parametrize("option", ["timeout", "max_runtime", "checkpoint_interval"])
def test_other_durations_refuse_nan_and_infinity(option):
    base = {"timeout": {"wait_for": "paid"}}.get(option, {})
    factory = resumable_step if option != "timeout" else step
    fn = (lambda wf, it: None) if option != "timeout" else _noop
    for value in (math.nan, math.inf):
        with pytest.raises(StepConfigurationError, match=rf"BoundaryDuration.*{option}="):
            type("BoundaryDuration", (Workflow,), {"a": factory(fn, **base, **{option: value})})


@pytest.mark.parametrize("wait", [math.nan, math.inf])
def test_a_policy_wait_that_is_not_finite_is_refused(wait):
    with pytest.raises(PolicyError, match="must be a finite duration"):
        ExceptionPolicy("reattempt", wait=wait)


# -- item 13: skip_if names, signatures ----------------------------------------------------


def test_skip_if_naming_no_method_is_refused_with_the_closest_name():
    # Before: accepted; the step failed with an AttributeError when it came to run.
    with pytest.raises(
        StepConfigurationError,
        match=r"BoundarySkipName\.step 'a': skip_if='is_digitl' names no method or attribute "
        r"of BoundarySkipName; did you mean 'is_digital'\?",
    ):

        class BoundarySkipName(Workflow):
            def is_digital(self):
                return True

            @step(skip_if="is_digitl")
            def a(self):
                pass


def test_skip_if_may_name_a_method_defined_below_the_step_or_in_a_parent():
    class BoundarySkipBelow(Workflow):
        @step(skip_if="later")
        def a(self):
            pass

        def later(self):
            return False

    child = type("BoundarySkipInherited", (BoundarySkipBelow,), {"b": step(_noop, skip_if="later")})
    assert child.steps.named("b").skip_if == "later"  # type: ignore[attr-defined]


def test_a_plain_step_with_a_required_extra_argument_is_refused():
    with pytest.raises(
        StepConfigurationError,
        match=r"BoundarySignature\.step 'charge': its function must be callable as \(self\), "
        r"but .*charge\(self, amount\).*read inputs from self",
    ):

        class BoundarySignature(Workflow):
            @step
            def charge(self, amount):
                pass


def test_a_step_with_optional_extra_arguments_is_accepted():
    class BoundaryOptionalArgs(Workflow):
        @step
        def a(self, retries=3, *args, **kwargs):
            pass

    assert BoundaryOptionalArgs.steps.names == ["a"]


def test_a_step_function_without_self_is_refused():
    with pytest.raises(StepConfigurationError, match=r"BoundaryNoSelf\.step 'step_1'"):
        type("BoundaryNoSelf", (Workflow,), {"a": step(lambda: None)})


def test_a_resumable_step_without_the_iteration_parameter_is_refused():
    with pytest.raises(
        StepConfigurationError,
        match=r"BoundaryNoIt\.step 'walk': is a resumable step: its function must take "
        r"\(self, it\)",
    ):

        class BoundaryNoIt(Workflow):
            @resumable_step
            def walk(self, *, it):  # keyword-only: the library passes it positionally
                pass


def test_a_skip_if_callable_with_the_wrong_signature_is_refused():
    with pytest.raises(StepConfigurationError, match=r"skip_if= must be callable as \(workflow\)"):
        type("BoundarySkipSig", (Workflow,), {"a": step(_noop, skip_if=lambda wf, extra: True)})


def test_a_hook_with_the_wrong_signature_is_refused():
    with pytest.raises(
        StepConfigurationError,
        match=r"BoundaryHookSig\.around_step_execution must be callable as "
        r"around_step_execution\(self, execution, proceed\)",
    ):

        class BoundaryHookSig(Workflow):
            def around_step_execution(self, execution):  # type: ignore[override]  # the point of the test
                pass


def test_a_handler_with_the_wrong_signature_is_refused():
    with pytest.raises(PolicyError, match=r"handler= must be callable as \(workflow, error\)"):
        ExceptionPolicy(handler=lambda wf: None)  # type: ignore[arg-type,misc]


# -- item 13: unknown options --------------------------------------------------------------


def test_an_unknown_option_names_class_and_step_and_suggests_the_closest():
    # Before: "StepDefinition.__init__() got an unexpected keyword argument 'wiat'".
    with pytest.raises(
        UnknownStepOptionError,
        match=r"BoundaryTypo\.step 'ship': unknown step option 'wiat' \(did you mean 'wait'\?\)",
    ):

        class BoundaryTypo(Workflow):
            @step(wiat=timedelta(hours=1))
            def ship(self):
                pass


def test_an_unknown_option_is_still_a_type_error():
    with pytest.raises(TypeError, match="skip_fi"):
        step(_noop, skip_fi=True)


def test_unknown_options_of_repeat_step_are_refused_naming_the_class():
    with pytest.raises(
        UnknownStepOptionError,
        match=r"BoundaryRepeatTypo\.step '_noop': unknown step option 'on_exeption' \(did you "
        r"mean 'on_exception'\?\)",
    ):

        class BoundaryRepeatTypo(Workflow):
            polls = repeat_step(_noop, waits=[1, 2], on_exeption="skip")


# -- item 13: a bare removed_step() statement ----------------------------------------------


def test_a_bare_removed_step_statement_files_its_gravestone_in_place():
    # Before: the statement's value was thrown away and the gravestone silently missing.
    class BoundaryBareGravestone(Workflow):
        @step
        def kept(self):
            pass

        removed_step("dropped")

        @step
        def last(self):
            pass

    steps = BoundaryBareGravestone.steps
    assert steps.names == ["kept", "dropped", "last"]
    assert steps.named("dropped").removed
    assert steps.next_after("dropped").name == "last"


def test_an_assigned_removed_step_counts_once():
    class BoundaryAssignedGravestone(Workflow):
        @step
        def kept(self):
            pass

        dropped = removed_step("dropped")

    assert BoundaryAssignedGravestone.steps.names == ["kept", "dropped"]


# -- item 11: names longer than their columns ----------------------------------------------


def test_a_workflow_type_longer_than_its_column_is_refused_at_class_definition():
    with pytest.raises(
        StepConfigurationError,
        match=r"BoundaryLongType: workflow_type is stored as the workflow type, a str of at most "
        r"255 characters",
    ):
        type("BoundaryLongType", (Workflow,), {"workflow_type": "t" * 256, "a": step(_noop)})


def test_a_class_name_longer_than_its_column_is_refused_at_class_definition():
    with pytest.raises(StepConfigurationError, match=r"the class name is stored as the workflow"):
        type("C" * 256, (Workflow,), {"a": step(_noop)})


def test_a_queue_name_longer_than_its_column_is_refused_at_class_definition():
    with pytest.raises(
        StepConfigurationError,
        match=r"BoundaryLongQueue\.step 'a': job_options queue= is 256 characters long, over "
        r"the limit of 255",
    ):
        type("BoundaryLongQueue", (Workflow,), {"a": step(_noop, job_options={"queue": "q" * 256})})


@pytest.mark.parametrize("priority", [2**31, -(2**31) - 1, 10**20])
def test_a_priority_outside_the_integer_column_is_refused(priority):
    with pytest.raises(StepConfigurationError, match=r"BoundaryPriority\.job_options: .*range"):
        type("BoundaryPriority", (Workflow,), {"job_options": {"priority": priority}})


# -- item 10: the codec --------------------------------------------------------------------


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_refused_naming_where_they_are(number):
    with pytest.raises(
        SerializationError, match=r"JSON has no NaN or Infinity.*\(at value\['rates'\]\[1\]\)"
    ):
        encode({"rates": [1.5, number]})


def test_nan_inside_a_tuple_or_enum_free_wrapper_is_refused_too():
    with pytest.raises(SerializationError, match="NaN or Infinity"):
        dumps((1, math.nan))


def test_nesting_up_to_the_documented_depth_round_trips():
    value: object = "leaf"
    for _ in range(MAX_DEPTH):
        value = [value]
    assert decode(encode(value)) == value


def test_nesting_beyond_the_documented_depth_is_refused_without_recursion_error():
    # Before: RecursionError (or invalid JSON on MariaDB, whose JSON stops at 32 levels).
    for depth in (MAX_DEPTH + 1, 100_000):
        value: object = 1
        for _ in range(depth):
            value = {"a": value}
        with pytest.raises(SerializationError, match=rf"nested more than {MAX_DEPTH} levels"):
            encode(value)


def test_typed_values_count_their_own_levels():
    value: object = timedelta(seconds=1)
    for _ in range(MAX_DEPTH - 1):
        value = [value]
    with pytest.raises(SerializationError, match="typed values"):
        encode(value)


# -- item 15: job options the backend does not understand ----------------------------------


def test_the_database_and_inline_backends_accept_queue_and_priority():
    assert DatabaseBackend().accepted_job_options == {"queue", "priority"}
    assert InlineBackend().accepted_job_options == {"queue", "priority"}
    assert InlineBackend(accepted_job_options={"queue", "expires"}).accepted_job_options == {
        "queue",
        "expires",
    }


def test_the_celery_backend_accepts_apply_async_options_but_not_the_schedule():
    celery = pytest.importorskip("geneva_drive.contrib.celery")
    accepted = celery.CeleryBackend.accepted_job_options
    assert {"queue", "priority", "routing_key", "expires", "headers"} <= accepted
    assert not {"eta", "countdown", "task_id", "args", "kwargs"} & accepted


def _run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# In a subprocess: a registered class with a bad key would make every later configure() of
# this test session fail, which is exactly the behaviour under test.
_TYPO_CLASS = """
    import geneva_drive
    from geneva_drive import Workflow, step
    from geneva_drive.core.errors import StepConfigurationError

    class Newsletter(Workflow):
        may_proceed_without_hero = True
        job_options = {"queue": "mail"}

        @step(job_options={"priorty": 5})
        def send(self):
            pass
"""


def test_configure_refuses_a_job_option_the_backend_would_ignore_with_did_you_mean():
    result = _run_python(
        _TYPO_CLASS
        + """
    try:
        geneva_drive.configure(backend=geneva_drive.InlineBackend())
    except StepConfigurationError as error:
        print("refused:", error)
    print("backend now:", geneva_drive.core.settings.settings().backend)
    """
    )
    assert result.returncode == 0, result.stderr
    assert (
        "refused: Newsletter.step 'send': job option 'priorty' (did you mean 'priority'?) is "
        "not understood by the configured backend InlineBackend, which accepts: priority, queue"
    ) in result.stdout
    assert "backend now: None" in result.stdout  # the refused configure() changed nothing


def test_create_refuses_a_class_defined_after_configure_with_a_key_the_backend_ignores():
    result = _run_python(
        """
    import geneva_drive
    from sqlalchemy.orm import Session
    geneva_drive.configure(backend=geneva_drive.DatabaseBackend())
    """
        + _TYPO_CLASS
        + """
    try:
        Newsletter.create(Session())
    except StepConfigurationError as error:
        print("refused:", error)
    """
    )
    assert result.returncode == 0, result.stderr
    assert "refused: Newsletter.step 'send': job option 'priorty' (did you mean" in result.stdout


def test_configure_leaves_keys_of_another_backend_to_create():
    # A Celery app's class in a test run on the database backend: configure() must not fail
    # for it, but creating it there would silently drop the option.
    result = _run_python(
        """
    import geneva_drive
    from geneva_drive import Workflow, step
    from geneva_drive.core.errors import StepConfigurationError
    from sqlalchemy.orm import Session

    class Expiring(Workflow):
        may_proceed_without_hero = True

        @step(job_options={"expires": 600})
        def send(self):
            pass

    geneva_drive.configure(backend=geneva_drive.DatabaseBackend())
    print("configured")
    try:
        Expiring.create(Session())
    except StepConfigurationError as error:
        print("refused:", error)
    """
    )
    assert result.returncode == 0, result.stderr
    assert "configured" in result.stdout
    assert (
        "refused: Expiring.step 'send': job option 'expires' is not understood by the "
        "configured backend DatabaseBackend"
    ) in result.stdout


def test_a_backend_that_declares_no_options_accepts_any_key():
    result = _run_python(
        _TYPO_CLASS
        + """
    class Custom:
        def enqueue(self, step):
            pass

    geneva_drive.configure(backend=Custom())
    print("accepted")
    """
    )
    assert result.returncode == 0, result.stderr
    assert "accepted" in result.stdout

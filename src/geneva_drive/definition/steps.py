"""Step definitions, the ``@step`` decorator and the ordered step collection.

``@step`` only records what was written; every check happens when the workflow class is
created (``StepDefinition.validate``), where the class name is known and the error can say
exactly which class and step is wrong and how to fix it.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn, overload

from geneva_drive.core import text
from geneva_drive.core.awaiting import settle
from geneva_drive.core.errors import StepConfigurationError, UnknownStepOptionError
from geneva_drive.definition.callables import (
    is_async_generator,
    is_coroutine_function,
    signature_problem,
)
from geneva_drive.definition.limits import ConcurrencyLimit, RateLimit, check_limit
from geneva_drive.definition.matchers import SignalMatcher as SignalMatcher  # its old home
from geneva_drive.definition.matchers import awaited, names_problem
from geneva_drive.definition.policy import (
    ACTIONS,
    ExceptionPolicy,
    PolicyError,
    PolicyList,
    StepPolicy,
    check_terminal_action,
)
from geneva_drive.definition.until import checked_until, delay_until, until_problem
from geneva_drive.storage.limits import (
    MAX_QUEUE,
    MAX_SIGNAL_NAME,
    MAX_STEP_NAME,
    PRIORITY_RANGE,
    duration_problem,
)

if TYPE_CHECKING:
    from geneva_drive.definition.workflow import Workflow

_UNSET: Any = object()
ALL_CHILDREN = 0  # children_needed of wait_for_children="all": every child started
DEFAULT_MAX_REATTEMPTS = 100
RESERVED_JOB_OPTIONS = {"wait", "wait_until", "eta", "countdown"}


@dataclass
class StepDefinition:
    """One step of a workflow class, as declared. ``name`` is final after registration."""

    callable: Any  # validated: user input is checked at class definition, not trusted
    name: str | None = None
    wait: Any = None
    # An aware datetime, or a callable (workflow) -> one (evaluated in phase 1, like skip_if).
    wait_until: Any = None
    wait_for: Any = None
    skip_if: Any = None
    on_exception: Any = None
    max_reattempts: Any = _UNSET
    terminal_action: Any = _UNSET
    before_step: Any = None
    after_step: Any = None
    job_options: dict[str, Any] | None = None
    resumable: bool = False
    max_iterations: int | None = None
    max_runtime: Any = None
    checkpoint_every: int | None = None
    checkpoint_interval: Any = None
    removed: bool = False
    # Signal timeouts (wait_for= steps only): normalised by validate() to a timedelta and to
    # "skip" | "cancel" | "pause" | <step name>; the step name is checked by _register_dsl.
    timeout: Any = None
    on_timeout: Any = None
    # Fan-in: "all", "any" or how many children must have ended before the step runs
    # (engine.children); validate() sets children_needed (ALL_CHILDREN for "all").
    wait_for_children: Any = None
    # definition.limits: a ConcurrencyLimit (overrides the class's) and a RateLimit.
    concurrency: Any = None
    rate_limit: Any = None
    # Compensation (docs/compensation.md): the name of the method to run if the workflow is
    # canceled after this step succeeded; checked against the class by _register_dsl.
    compensate: Any = None
    # Set on the definition of such a method: it runs as a step of its own when compensating.
    compensation: bool = field(default=False, repr=False)
    # Filled in by validate():
    exception_policy: StepPolicy | None = field(default=None, init=False)
    signal_matcher: Any = field(default=None, init=False)
    children_needed: int | None = field(default=None, init=False)
    # The names its matcher accepts (its ``names``), None for any (see definition.matchers).
    signal_names: tuple[str, ...] | None = field(default=None, init=False)
    wait_delta: timedelta | None = field(default=None, init=False)
    # wait_until= when it is a datetime (aware, UTC): known when the step is scheduled.
    until: datetime | None = field(default=None, init=False)
    defined_in: str = field(default="", init=False)
    # The step of the same method name this one replaced in the class body (see _declare).
    shadows: StepDefinition | None = field(default=None, init=False, repr=False, compare=False)

    # A decorated method stays callable on instances (handy in tests and for reuse).
    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return self.callable.__get__(instance, owner)

    def __set_name__(self, owner: type, attr: str) -> None:
        if self.name is None and getattr(self.callable, "__name__", "<lambda>") != "<lambda>":
            self.name = attr

    @property
    def waits_for_signal(self) -> bool:
        return self.signal_matcher is not None

    @property
    def waits_for_children(self) -> bool:
        return self.children_needed is not None

    def children_ready(self, started: int, ended: int) -> bool:
        """Whether enough of ``started`` children have ended for this fan-in step to run.

        "all" waits for every child started so far; "any" and a number for that many, or
        every child when fewer were started (no step of the parent starts one while it
        waits, so more could never come).
        """
        needed = self.children_needed or started  # ALL_CHILDREN is 0
        return ended >= min(needed, started)

    @property
    def awaiting_children(self) -> str:
        """What a parked fan-in step waits for, as stored and shown: ``children:all``,
        ``children:any`` or ``children:<n>``."""
        return f"children:{self.wait_for_children}"

    @property
    def awaiting(self) -> str:
        """What the step waits for when it parks, as stored and shown: its one signal name,
        ``a | b`` for several, ``*`` when its matcher does not say (``definition.matchers``)."""
        return awaited(self.signal_names)

    @property
    def label(self) -> str:
        return f"{self.defined_in}.step {self.name!r}"

    def run(self, workflow: Workflow, *args: Any) -> Any:
        # An async def body returns a coroutine: awaited here (core.awaiting), so its
        # writes, errors and flow control are the step's like a sync body's.
        return settle(self.callable(workflow, *args))

    def should_skip(self, workflow: Workflow) -> bool:
        condition = self.skip_if
        if condition is None or isinstance(condition, bool):
            return bool(condition)
        if isinstance(condition, str):
            value = getattr(workflow, condition)
            return bool(value() if callable(value) else value)
        return bool(settle(condition(workflow)))

    def copy(self) -> StepDefinition:
        return replace(self)

    # -- validation, at class-definition time ----------------------------------------------

    def validate(self, class_name: str, known: Sequence[str]) -> None:
        self.defined_in = class_name
        fail = self._fail
        if not callable(self.callable):
            fail(f"needs a callable, got {self.callable!r}")
        if is_async_generator(self.callable):
            fail(f"is an async generator; {_NO_ASYNC_GENERATOR}")
        if self.resumable and is_coroutine_function(self.callable):
            # Its iterations commit checkpoints from inside the body (iteration.py): not yet
            # written for a body that awaits between them.
            fail(
                "is a resumable step written async def, which is not supported; make it a "
                "plain def (self, it), or an async def step per unit of work"
            )
        if not isinstance(self.name, str) or not self.name.strip():
            fail(f"name= must be a non-blank str, got {self.name!r}")
        if len(self.name) > MAX_STEP_NAME:
            fail(
                f"name= must be at most {MAX_STEP_NAME} characters (the length of the column "
                f"that stores it), got one of {len(self.name)}; choose a shorter name"
            )
        if self.name in known:
            fail("is already defined in this class or a parent; give the step another name")
        self.wait_delta = self._validate_wait()
        self.until = self._validate_wait_until()
        self.signal_matcher = self._validate_wait_for()
        self._validate_wait_for_children()
        self._validate_timeout()
        self._validate_skip_if()
        check_limit(self.concurrency, f"{self.label}: concurrency=", ConcurrencyLimit)
        check_limit(self.rate_limit, f"{self.label}: rate_limit=", RateLimit)
        self.exception_policy = self._validate_on_exception()
        self._validate_position(known)
        self.job_options = validate_job_options(self.job_options, self.label)
        if self.compensate is not None and (
            not isinstance(self.compensate, str) or not self.compensate.isidentifier()
        ):
            fail(
                f"compensate= takes the name of a method of the class, got {self.compensate!r}; "
                "e.g. @step(compensate='release_stock') with def release_stock(self) on the class"
            )
        if self.resumable:
            self._validate_resumable()
        elif any(
            v is not None
            for v in (
                self.max_iterations,
                self.max_runtime,
                self.checkpoint_every,
                self.checkpoint_interval,
            )
        ):
            fail("max_iterations/max_runtime/checkpoint options need @resumable_step")
        self._validate_signature()

    def _validate_signature(self) -> None:
        if self.removed:
            return
        expected = "(self, it)" if self.resumable else "(self)"
        problem = signature_problem(self.callable, 2 if self.resumable else 1)
        if problem is None:
            return
        if self.resumable:
            self._fail(
                f"is a resumable step: its function must take {expected} — the iteration "
                f"handle as its second argument — but {problem}"
            )
        self._fail(
            f"its function must be callable as {expected}, but {problem}; read inputs from "
            "self (self.hero, self.read_metadata(...), self.received_signal) instead"
        )

    def _validate_skip_if(self) -> None:
        condition = self.skip_if
        if condition is None or isinstance(condition, bool | str):
            return  # a method name is looked up on the class, by _register_dsl
        if not callable(condition):
            self._fail(
                f"skip_if= takes a callable (workflow) -> bool, a method name, True/False or "
                f"None; got {condition!r}"
            )
        if is_async_generator(condition):
            self._fail(f"skip_if= is an async generator; {_NO_ASYNC_GENERATOR}")
        problem = signature_problem(condition, 1)
        if problem is not None:
            self._fail(f"skip_if= must be callable as (workflow) -> bool, but {problem}")

    def _fail(self, message: str) -> NoReturn:
        raise StepConfigurationError(f"{self.label}: {message}")

    def _validate_wait(self) -> timedelta | None:
        wait = self.wait
        if wait is None:
            return None
        if isinstance(wait, str) or hasattr(wait, "matches"):
            self._fail(f"wait= takes a duration, got {wait!r}; to wait for a signal, use wait_for=")
        if isinstance(wait, bool) or not isinstance(wait, timedelta | int | float):
            self._fail(f"wait= takes a timedelta or a number of seconds, got {wait!r}")
        problem = duration_problem(wait)
        if problem is not None:
            self._fail(f"wait={wait!r} {problem}")
        delta = wait if isinstance(wait, timedelta) else timedelta(seconds=wait)
        if delta < timedelta(0):
            self._fail(f"wait= must not be negative, got {wait!r}")
        return delta

    def _validate_wait_until(self) -> datetime | None:
        value = self.wait_until
        if value is None:
            return None
        if self.wait is not None:
            self._fail(
                f"takes wait= or wait_until=, not both (got wait={self.wait!r} and "
                f"wait_until={value!r:.60}); wait_until= alone runs it at that time"
            )
        if callable(value) and not isinstance(value, datetime):
            if is_async_generator(value):
                self._fail(f"wait_until= is an async generator; {_NO_ASYNC_GENERATOR}")
            problem = signature_problem(value, 1)
            if problem is not None:
                self._fail(f"wait_until= must be callable as (workflow) -> datetime, but {problem}")
            return None
        if not isinstance(value, datetime):
            self._fail(
                "wait_until= takes an aware datetime or a callable (workflow) -> datetime, "
                f"got {type(value).__name__} {value!r:.60}"
            )
        problem = until_problem(value)
        if problem is not None:
            self._fail(f"wait_until= {problem}")
        return value.astimezone(UTC)

    def delay(self, now: datetime) -> timedelta | None:
        """How long after ``now`` a new execution of this step is due: its ``wait``, or the
        time to its ``wait_until`` datetime (a callable one is evaluated in phase 1)."""
        if self.wait_delta is not None:
            return self.wait_delta
        return delay_until(self.until, now)

    def until_for(self, workflow: Workflow, now: datetime) -> datetime | None:
        """The instant this step waits until, for ``workflow``: its ``wait_until`` datetime,
        or what its callable returns (checked: a ``ValueError`` naming the step if it is not
        an aware datetime within 100 years of ``now``)."""
        value = self.wait_until
        if value is None or isinstance(value, datetime):
            return self.until
        return checked_until(settle(value(workflow)), f"{self.label} (for {workflow._label})", now)

    def _validate_wait_for(self) -> Any:
        wait_for = self.wait_for
        if wait_for is None:
            return None
        if isinstance(wait_for, timedelta | int | float | datetime | date) and not isinstance(
            wait_for, bool
        ):
            self._fail(
                f"wait_for= takes a signal name or matcher, got {wait_for!r}; to delay the "
                "step, use wait="
            )
        if isinstance(wait_for, str):
            if not wait_for.strip():
                self._fail("wait_for= needs a non-blank signal name")
            problem = text.describe(wait_for)
            if problem is not None:
                self._fail(f"wait_for= names a signal {wait_for!r:.60} that holds {problem}")
            if len(wait_for) > MAX_SIGNAL_NAME:
                self._fail(
                    f"wait_for= names a signal of {len(wait_for)} characters, over the limit "
                    f"of {MAX_SIGNAL_NAME} (the column that stores it); choose a shorter name"
                )
            self.signal_names = (wait_for,)
            return SignalMatcher(wait_for)
        if callable(getattr(wait_for, "matches", None)):
            self.signal_names, problem = names_problem(wait_for)
            if problem is not None:
                self._fail(f"wait_for={wait_for!r}: {problem}")
            return wait_for
        self._fail(
            f"wait_for= must be a signal name, a SignalMatcher, or an object with "
            f"matches(signal) (and, to say which signal names it accepts, names); got "
            f"{wait_for!r}"
        )

    def _validate_wait_for_children(self) -> None:
        spec = self.wait_for_children
        if spec is None:
            return
        if self.signal_matcher is not None:
            self._fail(
                "wait_for_children= cannot be combined with wait_for=; wait for the children "
                "in one step and for the signal in the next"
            )
        if spec == "all":
            self.children_needed = ALL_CHILDREN
        elif spec == "any":
            self.children_needed = 1
        elif isinstance(spec, int) and not isinstance(spec, bool) and spec >= 1:
            self.children_needed = spec
        else:
            self._fail(
                f"wait_for_children= takes 'all', 'any' or how many children must have "
                f"ended (an int >= 1), got {spec!r}"
            )

    def _validate_timeout(self) -> None:
        timeout, on_timeout = self.timeout, self.on_timeout
        if timeout is None:
            if on_timeout is not None:
                self._fail(
                    f"on_timeout={on_timeout!r} needs timeout=; add timeout=timedelta(...) or "
                    "drop on_timeout="
                )
            return
        if self.signal_matcher is None:
            self._fail(
                f"timeout={timeout!r} only applies to a step that waits for a signal; add "
                "wait_for='<signal name>', or use wait= to delay the step"
            )
        seconds: float | None = None
        if isinstance(timeout, timedelta):
            seconds = timeout.total_seconds()
        elif isinstance(timeout, int | float) and not isinstance(timeout, bool):
            seconds = float(timeout)
        if seconds is None or seconds <= 0:
            self._fail(
                f"timeout= must be a positive timedelta or number of seconds, got {timeout!r}"
            )
        problem = duration_problem(seconds)
        if problem is not None:
            self._fail(f"timeout={timeout!r} {problem}")
        self.timeout = timedelta(seconds=seconds)
        if isinstance(on_timeout, StepDefinition):
            on_timeout = on_timeout.name
        if on_timeout is None:
            on_timeout = "skip"
        if not isinstance(on_timeout, str) or not on_timeout.strip():
            self._fail(
                f"on_timeout= must be 'skip', 'cancel', 'pause' or the name of a step of this "
                f"workflow, got {on_timeout!r}"
            )
        if on_timeout == self.name:
            self._fail(
                f"on_timeout={on_timeout!r} names the waiting step itself, which would wait "
                "forever; drop timeout= instead, or name another step"
            )
        self.on_timeout = on_timeout

    def _validate_on_exception(self) -> StepPolicy | None:
        value = self.on_exception
        reattempt_symbol = value == "reattempt"
        if not reattempt_symbol:
            self._refuse_reattempt_options(value)
        try:
            return self._policy_for(value)
        except PolicyError as error:
            self._fail(str(error))

    def _refuse_reattempt_options(self, on_exception: Any) -> None:
        """``max_reattempts=`` and ``terminal_action=`` complete ``on_exception='reattempt'``."""
        for option, given in (
            ("max_reattempts", self.max_reattempts),
            ("terminal_action", self.terminal_action),
        ):
            if given is _UNSET:
                continue
            if isinstance(on_exception, str | type(None)):
                self._fail(f"{option}= needs on_exception='reattempt', got {on_exception!r}")
            self._fail(
                f"{option}= cannot be combined with an ExceptionPolicy, list or handler "
                f"(set {option} on the policy instead)"
            )

    def _policy_for(self, value: Any) -> StepPolicy | None:
        """The policy ``on_exception=`` stands for (ExceptionPolicy may raise PolicyError)."""
        if value is None:
            return None
        if isinstance(value, str):
            return self._policy_for_action(value)
        if isinstance(value, ExceptionPolicy):
            return value
        if isinstance(value, list | tuple):
            return self._policy_list(value)
        if isinstance(value, type) and issubclass(value, BaseException):
            self._fail(
                f"on_exception={value.__name__} is an exception class, not a reaction; write "
                f"on_exception=ExceptionPolicy('reattempt', matching={value.__name__})"
            )
        if callable(value):
            return ExceptionPolicy(handler=value)
        self._fail(
            f"on_exception= must be an action name, an ExceptionPolicy, a list of them, or a "
            f"handler (workflow, error); got {value!r}"
        )

    def _policy_for_action(self, action: str) -> ExceptionPolicy:
        if action not in ACTIONS:
            self._fail(
                f"on_exception= must be one of {', '.join(map(repr, ACTIONS))}, an "
                f"ExceptionPolicy, a list of them, or a handler; got {action!r}"
            )
        if action != "reattempt":
            return ExceptionPolicy(action)
        cap, terminal = self.max_reattempts, self.terminal_action
        if terminal is not _UNSET:
            check_terminal_action(terminal)  # before ExceptionPolicy checks the cap
        return ExceptionPolicy(
            "reattempt",
            max_reattempts=DEFAULT_MAX_REATTEMPTS if cap is _UNSET else cap,
            terminal_action="pause" if terminal is _UNSET else terminal,
        )

    def _policy_list(self, members: list[Any] | tuple[Any, ...]) -> PolicyList:
        bad = [m for m in members if not isinstance(m, ExceptionPolicy)]
        if bad or not members:
            self._fail(f"on_exception= as a list takes ExceptionPolicy objects only; got {bad!r}")
        return PolicyList(members)

    def _validate_position(self, known: Sequence[str]) -> None:
        if self.before_step is not None and self.after_step is not None:
            self._fail("cannot take both before_step= and after_step=; choose one")
        for option in ("before_step", "after_step"):
            ref = getattr(self, option)
            if ref is None:
                continue
            if isinstance(ref, StepDefinition):
                ref = ref.name
                setattr(self, option, ref)
            if ref not in known:
                self._fail(
                    f"{option}={ref!r} references non-existent step; it must name a step that "
                    f"has already been defined (known: {', '.join(known) or 'none'})"
                )

    def _validate_resumable(self) -> None:
        for option in ("max_iterations", "checkpoint_every"):
            value = getattr(self, option)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                self._fail(f"invalid {option}=: must be a positive integer, got {value!r}")
        for option in ("max_runtime", "checkpoint_interval"):
            value = getattr(self, option)
            if value is None:
                continue
            seconds: float | None = None
            if isinstance(value, timedelta):
                seconds = value.total_seconds()
            elif isinstance(value, int | float) and not isinstance(value, bool):
                seconds = float(value)
            if seconds is None or seconds <= 0:
                self._fail(f"invalid {option}=: must be a positive duration, got {value!r}")
            problem = duration_problem(seconds)
            if problem is not None:
                self._fail(f"invalid {option}={value!r}: it {problem}")
            setattr(self, option, timedelta(seconds=seconds))


def validate_job_options(options: Any, context: str) -> dict[str, Any] | None:
    """Check job options (``queue``: str, ``priority``: int, others passed to the backend)."""
    if options is None:
        return None
    if not isinstance(options, dict):
        raise StepConfigurationError(
            f"{context}: job_options= must be a dict such as {{'queue': 'mail'}}, got {options!r}"
        )
    reserved = sorted(RESERVED_JOB_OPTIONS & set(options))
    if reserved:
        raise StepConfigurationError(
            f"{context}: job_options cannot set {', '.join(reserved)}; geneva-drive schedules "
            "steps itself — use the step's wait= instead"
        )
    for key, value in options.items():
        if not isinstance(key, str):
            raise StepConfigurationError(f"{context}: job_options keys must be str, got {key!r}")
        text.check(key, f"{context}: job option")
        if isinstance(value, str):
            text.check(value, f"{context}: job_options {key}=")
    queue = options.get("queue")
    if queue is not None and (not isinstance(queue, str) or not queue):
        raise StepConfigurationError(
            f"{context}: job_options queue= must be a non-empty str, got {queue!r}"
        )
    if queue is not None and len(queue) > MAX_QUEUE:
        raise StepConfigurationError(
            f"{context}: job_options queue= is {len(queue)} characters long, over the limit of "
            f"{MAX_QUEUE} (the column that stores it); choose a shorter queue name"
        )
    priority = options.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise StepConfigurationError(
            f"{context}: job_options priority= must be an int, got {priority!r}"
        )
    low, high = PRIORITY_RANGE
    if priority is not None and not low <= priority <= high:
        raise StepConfigurationError(
            f"{context}: job_options priority={priority} is outside the stored range "
            f"{low}..{high}; lower runs first, so small numbers such as 0..10 are plenty"
        )
    return dict(options)


@overload
def step(fn: Callable[..., Any], /, **options: Any) -> StepDefinition: ...
@overload
def step(fn: None = None, /, **options: Any) -> Callable[[Callable[..., Any]], StepDefinition]: ...
def step(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Declare a step: ``@step``, ``@step(wait=...)``, or ``step(fn, ...)`` as a class attribute.

    Options: ``name, wait, wait_until, wait_for, skip_if, on_exception, max_reattempts,
    terminal_action, before_step, after_step, job_options, wait_for_children, concurrency,
    rate_limit, compensate``, and with ``wait_for``: ``timeout, on_timeout``.
    A lambda (or ``name=None`` with a lambda) becomes an anonymous step named ``step_N``.
    """
    if fn is not None:
        return _declare(fn, options)
    return lambda f: _declare(f, options)


def resumable_step(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Declare a resumable step taking ``(self, it)``; see ``iteration.py``.

    Extra options: ``max_iterations``, ``max_runtime``, ``checkpoint_every``,
    ``checkpoint_interval``.
    """
    if fn is not None:
        return _declare(fn, {**options, "resumable": True})
    return lambda f: _declare(f, {**options, "resumable": True})


def _declare(fn: Callable[..., Any], options: dict[str, Any]) -> StepDefinition:
    """A StepDefinition that remembers a same-named step it replaces in the class body.

    Python keeps only the last of two ``def a`` in a class body, so a copy-pasted step would
    vanish silently; the class refuses that when it registers its steps (``_register_dsl``).
    """
    namespace = _class_body(3)  # the class body calling @step / step()
    _refuse_unknown_options(fn, options, namespace)
    definition = StepDefinition(callable=fn, **options)
    if namespace is None:
        return definition
    previous = namespace.get(getattr(fn, "__name__", ""))
    if isinstance(previous, StepDefinition):
        definition.shadows = previous
    return definition


def repeat_step(
    fn: Callable[..., Any], *, waits: Iterable[timedelta | float], **options: Any
) -> list[StepDefinition]:
    """Many anonymous steps from one callable, one per wait (the staged-retry pattern).

    ``polls = repeat_step(check_status, waits=[60, 300, 3600])`` adds ``step_N`` steps that run
    ``check_status`` after each wait; call ``self.finish()`` or ``self.skip()`` from it to stop.
    """
    _refuse_unknown_options(
        fn, options, _class_body(2), allowed=_STEP_OPTIONS - {"wait", "wait_until"}
    )
    return [StepDefinition(callable=fn, wait=w, **options) for w in waits]


class StepCollection(Sequence[StepDefinition]):
    """The steps of a workflow class in positional order."""

    def __init__(
        self,
        definitions: Sequence[StepDefinition],
        compensations: Sequence[StepDefinition] = (),
    ) -> None:
        self._compensations = {d.name: d for d in compensations}
        ordered: list[StepDefinition] = [
            d for d in definitions if d.before_step is None and d.after_step is None
        ]
        for d in definitions:
            if d.before_step is not None:
                ordered.insert(_index(ordered, d.before_step), d)
            elif d.after_step is not None:
                ordered.insert(_index(ordered, d.after_step) + 1, d)
        self._ordered = ordered
        self._by_name = {d.name: d for d in ordered}

    @overload
    def __getitem__(self, index: int) -> StepDefinition: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[StepDefinition]: ...
    def __getitem__(self, index: int | slice) -> Any:
        return self._ordered[index]

    def __len__(self) -> int:
        return len(self._ordered)

    def __iter__(self) -> Iterator[StepDefinition]:
        return iter(self._ordered)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def names(self) -> list[str]:
        return [d.name for d in self._ordered if d.name is not None]

    def named(self, name: str | None) -> StepDefinition | None:
        """The step called ``name`` — or the compensation: a compensation runs as a step of
        its own (executions, attempts, policies), outside the positional order."""
        if name is None:
            return None
        return self._by_name.get(name) or self._compensations.get(name)

    def compensation(self, name: str | None) -> StepDefinition | None:
        """The compensation called ``name`` (None for a step or an unknown name)."""
        return None if name is None else self._compensations.get(name)

    @property
    def compensated(self) -> dict[str, str]:
        """Step name → the name of its compensation, for the steps that declare one."""
        return {d.name: d.compensate for d in self._ordered if d.name and d.compensate}

    def runnable(self) -> list[StepDefinition]:
        return [d for d in self._ordered if not d.removed]

    def next_after(self, name: str | None) -> StepDefinition | None:
        """The next runnable step after ``name`` (the first when None); None at the end."""
        if name is None:
            start = 0
        elif name in self._by_name:
            start = self._ordered.index(self._by_name[name]) + 1
        else:
            return None
        return next((d for d in self._ordered[start:] if not d.removed), None)

    def previous_before(self, name: str | None) -> StepDefinition | None:
        if name is None or name not in self._by_name:
            return None
        index = self._ordered.index(self._by_name[name])
        return next((d for d in reversed(self._ordered[:index]) if not d.removed), None)


def _index(ordered: list[StepDefinition], name: str) -> int:
    for i, d in enumerate(ordered):
        if d.name == name:
            return i
    raise StepConfigurationError(f"step {name!r} is not in the ordered list")  # pragma: no cover


def _removed(workflow: Any) -> None:  # pragma: no cover - never run: the executor skips it
    raise RuntimeError("a removed step never runs")


def removed_step(name: str) -> StepDefinition:
    """A gravestone for a deleted step: rows still naming it are skipped past, not stranded.

    Keep it where the step was until ``geneva-drive check`` reports no in-flight rows for it,
    either as a statement (``removed_step("old_name")``) or assigned
    (``old_name = removed_step("old_name")``).
    """
    definition = StepDefinition(callable=_removed, name=name, removed=True)
    namespace = _class_body(2)
    if namespace is not None:
        # A bare statement's value is thrown away, so the gravestone files itself in the class
        # body, at this position (it marks where the step was); an assigned one is found twice
        # and counted once (_register_dsl dedupes by identity).
        namespace[f"{_GRAVESTONE_PREFIX}{name}"] = definition
    return definition


_GRAVESTONE_PREFIX = "geneva_drive removed step "  # a space: never a Python identifier
_NO_ASYNC_GENERATOR = (
    "a step is awaited to one outcome, and an async generator yields many (nothing would "
    "iterate it, so the step would be recorded as done without running) — write `async def` "
    "without `yield`, or a @resumable_step to work through items with checkpoints"
)
# What @step / @resumable_step accept; the other fields are set by the library.
_STEP_OPTIONS = frozenset(
    {
        "name",
        "wait",
        "wait_until",
        "wait_for",
        "skip_if",
        "on_exception",
        "max_reattempts",
        "terminal_action",
        "before_step",
        "after_step",
        "job_options",
        "timeout",
        "on_timeout",
        "wait_for_children",
        "max_iterations",
        "max_runtime",
        "checkpoint_every",
        "checkpoint_interval",
        "concurrency",
        "rate_limit",
        "compensate",
    }
)


def _class_body(depth: int) -> dict[str, Any] | None:
    """The namespace of the class body ``depth`` frames up, or None when it is no class body.

    A class body's namespace is the dict being built (writes go into the class), and it has
    ``__module__`` and ``__qualname__``; a module's globals have no ``__qualname__``.
    """
    try:
        namespace = sys._getframe(depth).f_locals
    except ValueError:  # pragma: no cover - called from a shallow stack
        return None
    if "__qualname__" in namespace and "__module__" in namespace:
        return namespace
    return None


def _refuse_unknown_options(
    fn: Any,
    options: dict[str, Any],
    namespace: dict[str, Any] | None,
    allowed: frozenset[str] = _STEP_OPTIONS | {"resumable"},
) -> None:
    unknown = sorted(set(options) - allowed)
    if not unknown:
        return
    owner = namespace.get("__qualname__") if namespace is not None else None
    if owner is None:
        owner = getattr(fn, "__qualname__", "").rpartition(".")[0] or "<no class>"
    name = options.get("name") or getattr(fn, "__name__", None)
    label = f"{owner}.step {name!r}" if name and name != "<lambda>" else f"{owner} (anonymous step)"
    public = sorted(allowed - {"resumable"})
    hints = []
    for option in unknown:
        close = difflib.get_close_matches(option, public, n=1)
        if option == "if":
            close = ["skip_if"]  # the gem's alias, refused: it would invert the condition
        hints.append(f"{option!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise UnknownStepOptionError(
        f"{label}: unknown step option{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; "
        f"the options are: {', '.join(public)}"
    )

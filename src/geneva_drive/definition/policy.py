"""Exception policies: what happens when a step raises.

Resolution is a pure function of the step, the class policies, the error and the number of
consecutive reattempts so far; it returns a :class:`Decision` that the executor applies.
Imperative handlers are the one impure part: they run user code that calls a flow-control verb.

Resolution order (first that captures the error wins):
1. the step's own policy (a single policy, or its list as one member),
2. class-level policies that name exception types, newest first (inherited ones included),
3. class-level blanket policies, newest first,
4. the default: pause.
A reattempt is turned into the terminal action once the consecutive count reaches the
smallest ``max_reattempts`` declared anywhere in that stack (the global cap).

A policy that cannot be applied — a dotted ``matching=`` name that does not import, a matcher
predicate or handler that raises — is a configuration error found only when an error reaches
it. Resolution never raises for it (phase 3 must still record the outcome): the error gets the
default pause, and the problem, naming the class, step and policy, is logged, added to the
error as a note (so the stored backtrace shows it) and returned in ``Decision.problem``.
"""

from __future__ import annotations

import builtins
import importlib
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from geneva_drive.core.awaiting import settle
from geneva_drive.core.errors import PolicyResolutionError
from geneva_drive.definition.callables import is_async_generator, signature_problem
from geneva_drive.definition.flow import Action, FlowControl
from geneva_drive.storage.limits import duration_problem

if TYPE_CHECKING:
    from geneva_drive.definition.workflow import Workflow

ACTIONS = ("pause", "cancel", "reattempt", "skip")
TERMINAL_ACTIONS = ("pause", "cancel", "skip")
REPORTS = ("always", "never", "terminal_only")

WaitSpec = timedelta | float | int | Callable[[int], timedelta | float] | None
Matcher = type[BaseException] | str | Callable[[BaseException], bool]
Handler = Callable[["Workflow", BaseException], Any]


class PolicyError(ValueError):
    """An ExceptionPolicy was built with options that do not fit together."""


def exponential_backoff(
    base: timedelta | float = 1.0,
    *,
    factor: float = 2.0,
    cap: timedelta | float = timedelta(hours=1),
    jitter: float = 0.15,
) -> Callable[[int], timedelta]:
    """A wait for reattempt N: ``base * factor**N`` capped at ``cap``, ± ``jitter`` fraction."""
    base_s = base.total_seconds() if isinstance(base, timedelta) else float(base)
    cap_s = cap.total_seconds() if isinstance(cap, timedelta) else float(cap)

    def wait(attempt: int) -> timedelta:
        seconds = min(cap_s, base_s * factor**attempt)
        spread = seconds * jitter
        return timedelta(seconds=max(0.0, seconds + random.uniform(-spread, spread)))

    wait.__qualname__ = f"exponential_backoff(base={base_s}s, factor={factor}, cap={cap_s}s)"
    return wait


def _check_wait(wait: WaitSpec) -> None:
    if wait is None or callable(wait):
        return
    if isinstance(wait, bool) or not isinstance(wait, timedelta | int | float):
        raise PolicyError(
            f"wait= takes a timedelta, seconds, or a callable (attempt) -> timedelta; got {wait!r}"
        )
    problem = duration_problem(wait)
    if problem is not None:
        raise PolicyError(f"wait={wait!r} {problem}")
    if (wait.total_seconds() if isinstance(wait, timedelta) else wait) < 0:
        raise PolicyError(f"wait= must not be negative, got {wait!r}")


def _check_action_is_no_exception_class(action: Any) -> None:
    if isinstance(action, type) and issubclass(action, BaseException):
        raise PolicyError(
            f"ExceptionPolicy({action.__name__}): the first argument is the action; to match "
            f"this exception write ExceptionPolicy('pause', matching={action.__name__})"
        )


def _check_imperative(
    handler: Any, action: Any, wait: WaitSpec, max_reattempts: Any, terminal_action: Any
) -> None:
    """A handler policy: the handler decides, so the declarative options must be left out."""
    if action is not None or wait is not None or max_reattempts is not None:
        raise PolicyError(
            "an imperative policy (handler=) decides for itself: drop action=, wait= "
            "and max_reattempts= (call workflow.reattempt(wait=...) in the handler)"
        )
    if terminal_action != "pause":
        raise PolicyError("terminal_action= has no meaning for an imperative policy")
    if not callable(handler):
        raise PolicyError(f"handler= must be callable, got {handler!r}")
    _check_handler(handler)


def _check_declarative(
    action: Any, wait: WaitSpec, max_reattempts: Any, terminal_action: Any
) -> None:
    if action not in ACTIONS:
        raise PolicyError(f"action must be one of {', '.join(map(repr, ACTIONS))}; got {action!r}")
    if action != "reattempt":
        _check_reattempt_options_unused(action, wait, max_reattempts, terminal_action)
    _check_wait(wait)
    _check_max_reattempts(max_reattempts)
    check_terminal_action(terminal_action)


def _check_reattempt_options_unused(
    action: Any, wait: WaitSpec, max_reattempts: Any, terminal_action: Any
) -> None:
    given = {
        "wait": wait is not None,
        "max_reattempts": max_reattempts is not None,
        "terminal_action": terminal_action != "pause",
    }
    for option, is_given in given.items():
        if is_given:
            raise PolicyError(f"{option}= only applies to 'reattempt', not {action!r}")


def _check_max_reattempts(max_reattempts: Any) -> None:
    if max_reattempts is None:
        return
    if (
        isinstance(max_reattempts, bool)
        or not isinstance(max_reattempts, int)
        or max_reattempts < 1
    ):
        raise PolicyError(
            f"max_reattempts= must be a positive integer or None, got {max_reattempts!r}"
        )


def check_terminal_action(terminal_action: Any) -> None:
    """What a reattempt turns into at the cap; also checked for a step's ``terminal_action=``."""
    if terminal_action not in TERMINAL_ACTIONS:
        raise PolicyError(
            f"terminal_action= must be one of {', '.join(map(repr, TERMINAL_ACTIONS))}; "
            f"got {terminal_action!r}"
        )


def wait_for_attempt(wait: WaitSpec, attempt: int, error: BaseException | None) -> timedelta | None:
    """The concrete delay for reattempt number ``attempt`` (0-based)."""
    result: timedelta | None
    if wait is None:
        result = None
    elif callable(wait):
        try:
            value = wait(attempt)
            problem = duration_problem(value)
            if problem is not None:
                raise ValueError(f"the wait {problem}")
            result = value if isinstance(value, timedelta) else timedelta(seconds=value)
        except Exception as failure:  # left to phase 3, it would strand the execution
            raise PolicyResolutionError(
                f"its wait= callable {wait!r} failed for attempt {attempt}: "
                f"{type(failure).__name__}: {failure}"
            ) from failure
    else:
        result = wait if isinstance(wait, timedelta) else timedelta(seconds=wait)
    retry_after = getattr(error, "retry_after", None)
    if isinstance(retry_after, int | float) and not isinstance(retry_after, bool):
        retry_after = timedelta(seconds=retry_after)
    if isinstance(retry_after, timedelta) and (result is None or retry_after > result):
        result = retry_after  # the remote side knows better than our guess
    return result


class ExceptionPolicy:
    """What to do when a step raises a matching exception.

    Declarative: ``ExceptionPolicy("reattempt", matching=TimeoutError, wait=15,
    max_reattempts=5, terminal_action="cancel")``. Imperative: ``ExceptionPolicy(handler=fn)``
    where ``fn(workflow, error)`` calls a flow-control verb (returning normally means pause).
    ``report`` is ``"always"`` (default), ``"never"`` or ``"terminal_only"``.
    """

    def __init__(
        self,
        action: Any = None,
        *,
        matching: Matcher | Iterable[Matcher] | None = None,
        wait: WaitSpec = None,
        max_reattempts: int | None = None,
        terminal_action: str = "pause",
        report: str = "always",
        handler: Handler | None = None,
    ) -> None:
        # An exception class is callable too, but never meant as a handler.
        if callable(action) and handler is None and not isinstance(action, type):
            action, handler = None, action
        _check_action_is_no_exception_class(action)
        if report not in REPORTS:
            raise PolicyError(f"report= must be one of {', '.join(REPORTS)}; got {report!r}")
        if handler is not None:
            _check_imperative(handler, action, wait, max_reattempts, terminal_action)
        else:
            _check_declarative(action, wait, max_reattempts, terminal_action)
        self.action = action
        self.wait = wait
        self.max_reattempts = max_reattempts
        self.terminal_action = terminal_action
        self.report = report
        self.handler = handler
        self.matchers: list[Matcher] = []
        for matcher in _as_list(matching):
            self.add_matcher(matcher)

    def add_matcher(self, matcher: Matcher) -> None:
        if isinstance(matcher, type):
            if not issubclass(matcher, BaseException):
                raise PolicyError(
                    f"matching= takes exception classes, dotted class names or predicates; "
                    f"{matcher.__name__} is not an exception class"
                )
        elif isinstance(matcher, str):
            if not all(part.isidentifier() for part in matcher.split(".")):
                raise PolicyError(
                    f"matching={matcher!r} is no dotted class name; write it as "
                    "'package.module.ErrorClass' (or 'ValueError' for a builtin)"
                )
        elif not callable(matcher):
            raise PolicyError(
                f"matching= takes exception classes, dotted class names or predicates; "
                f"got {matcher!r}"
            )
        self.matchers.append(matcher)

    @property
    def blanket(self) -> bool:
        return not self.matchers

    @property
    def declarative(self) -> bool:
        return self.handler is None

    def captures(self, error: BaseException) -> bool:
        try:
            return self.blanket or any(_matches(m, error) for m in self.matchers)
        except PolicyResolutionError as problem:
            problem.policy = problem.policy or self
            raise

    @property
    def policies(self) -> list[ExceptionPolicy]:
        return [self]

    def __repr__(self) -> str:
        what = f"handler={self.handler!r}" if self.handler else repr(self.action)
        return f"ExceptionPolicy({what}, matching={self.matchers!r})"


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list | tuple | set | frozenset):
        return list(value)
    return [value]


def _matches(matcher: Matcher, error: BaseException) -> bool:
    if isinstance(matcher, type):
        return isinstance(error, matcher)
    if isinstance(matcher, str):
        return isinstance(error, _resolve_dotted(matcher))
    try:
        return bool(matcher(error))
    except Exception as failure:
        raise PolicyResolutionError(
            f"its matching= predicate {matcher!r} raised {type(failure).__name__}: {failure}"
        ) from failure


def _resolve_dotted(name: str) -> type:
    """``"package.module.Error"`` → the class; a name that does not resolve is refused."""
    module_name, _, attr = name.rpartition(".")
    if not module_name:
        found = getattr(builtins, name, None)
        reason = f"there is no builtin {name!r}"
    else:
        try:
            found = getattr(importlib.import_module(module_name), attr, None)
        except ImportError as error:
            raise PolicyResolutionError(
                f"matching={name!r} cannot be imported ({error}); fix the dotted name, or make "
                "the module importable in the worker"
            ) from error
        reason = f"module {module_name!r} has no attribute {attr!r}"
    if isinstance(found, type) and issubclass(found, BaseException):
        return found
    if found is not None:
        reason = f"{found!r} is not an exception class"
    raise PolicyResolutionError(f"matching={name!r} names no exception class ({reason})")


def _check_handler(handler: Handler) -> None:
    if is_async_generator(handler):
        raise PolicyError(
            f"handler={handler!r} is an async generator; nothing would iterate it — make it "
            "a def (or async def) handler(workflow, error) without yield"
        )
    problem = signature_problem(handler, 2)
    if problem is not None:
        raise PolicyError(f"handler= must be callable as (workflow, error), but {problem}")


class PolicyList:
    """A step-level list of policies: the first member (in list order) that captures wins."""

    def __init__(self, members: Sequence[ExceptionPolicy]) -> None:
        self.members = list(members)

    def captures(self, error: BaseException) -> bool:
        return any(m.captures(error) for m in self.members)

    def pick(self, error: BaseException) -> ExceptionPolicy | None:
        return next((m for m in self.members if m.captures(error)), None)

    @property
    def policies(self) -> list[ExceptionPolicy]:
        return self.members


StepPolicy = ExceptionPolicy | PolicyList

DEFAULT_POLICY = ExceptionPolicy("pause")


@dataclass(frozen=True)
class Decision:
    """The resolved reaction to one error."""

    action: Action
    wait: timedelta | None
    terminal: bool
    report: str
    policy: ExceptionPolicy
    problem: PolicyResolutionError | None = None  # the policy that could not be applied

    @property
    def should_report(self) -> bool:
        if self.report == "never":
            return False
        if self.report == "terminal_only":
            return self.terminal
        return True


def policy_stack(
    step_policy: StepPolicy | None, class_policies: Sequence[ExceptionPolicy]
) -> list[StepPolicy]:
    newest_first = list(reversed(class_policies))
    stack: list[StepPolicy] = [step_policy] if step_policy is not None else []
    stack += [p for p in newest_first if not p.blanket]
    stack += [p for p in newest_first if p.blanket]
    stack.append(DEFAULT_POLICY)
    return stack


def resolve(
    error: BaseException,
    *,
    step_policy: StepPolicy | None,
    class_policies: Sequence[ExceptionPolicy],
    reattempt_count: int,
    workflow: Workflow,
) -> Decision:
    """Pick the policy for ``error`` and turn it into a Decision (runs imperative handlers)."""
    stack = policy_stack(step_policy, class_policies)
    try:
        return _resolve(error, stack, reattempt_count, workflow)
    except PolicyResolutionError as problem:
        return _misconfigured(problem, error, step_policy, workflow)


def _resolve(
    error: BaseException, stack: list[StepPolicy], reattempt_count: int, workflow: Workflow
) -> Decision:
    chosen = next(p for p in stack if p.captures(error))
    policy = chosen.pick(error) if isinstance(chosen, PolicyList) else chosen
    assert policy is not None  # captures() guaranteed a member
    caps = [m.max_reattempts for p in stack for m in p.policies if m.max_reattempts is not None]
    cap = min(caps) if caps else None

    try:
        if policy.handler is not None:
            action, wait = _run_handler(policy.handler, workflow, error)
        else:
            action = Action(str(policy.action))
            wait = wait_for_attempt(policy.wait, reattempt_count, error)
    except PolicyResolutionError as problem:
        problem.policy = policy
        raise
    if action is Action.REATTEMPT and cap is not None and reattempt_count >= cap:
        return Decision(Action(policy.terminal_action), None, True, policy.report, policy)
    return Decision(action, wait, False, policy.report, policy)


def _misconfigured(
    problem: PolicyResolutionError,
    error: BaseException,
    step_policy: StepPolicy | None,
    workflow: Workflow,
) -> Decision:
    """The default pause for ``error``, carrying the policy problem that prevented better."""
    policy = problem.policy
    cls = type(workflow)
    owner = f"{cls.__name__} (class-level exception_policies)"
    if step_policy is not None and policy in step_policy.policies:
        step = next((d for d in cls.steps if d.exception_policy is step_policy), None)
        owner = step.label if step is not None else f"{cls.__name__} (a step's on_exception=)"
    message = (
        f"{owner}: {policy!r} could not be applied to {type(error).__name__}: {problem}; the "
        "default policy (pause) was used instead"
    )
    full = PolicyResolutionError(message)
    full.__cause__ = problem.__cause__
    error.add_note(f"geneva-drive: {message}")
    workflow.logger.error("%s", message)
    return Decision(Action.PAUSE, None, True, "always", DEFAULT_POLICY, full)


def _run_handler(handler: Handler, workflow: Workflow, error: BaseException) -> tuple[Action, Any]:
    with workflow._in_step_context():
        try:
            settle(handler(workflow, error))  # an async def handler is awaited
        except FlowControl as signal:
            # A handler's reattempt keeps its wait; rewind is a resumable-step concern only.
            return signal.action, signal.wait
        except Exception as failure:  # left to phase 3, it would strand the execution
            raise PolicyResolutionError(
                f"its handler raised {type(failure).__name__}: {failure}"
            ) from failure
    return Action.PAUSE, None

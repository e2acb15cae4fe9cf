"""Concurrency and rate limits as declared: ``ConcurrencyLimit`` and ``RateLimit``.

Values, checked when they are made, and the one rule that turns a limit and a workflow into
the key stored with an execution (:func:`keys_for`). Enforcing them is ``engine.limits``'s.

Which limits a step has (:func:`limits_of`): its own ``concurrency=`` if given, else its
class's ``concurrency``; and its own ``rate_limit=``. A concurrency key is its owner's
(``Class`` for a class-level limit, ``Class.step`` for a step's) followed by the key's value,
so two limits of different classes never share slots by accident; a rate-limit key is the
value alone (``"gateway"``): it names the resource every class that calls it shares.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from geneva_drive.core.awaiting import settle
from geneva_drive.core.errors import StepConfigurationError

if TYPE_CHECKING:
    from geneva_drive.definition.steps import StepDefinition
    from geneva_drive.definition.workflow import Workflow

# The column that stores a key (``models.LimitSlot.key``).
MAX_KEY_LENGTH = 255

Key = str | Callable[[Any], Any] | None


def _count_problem(n: Any) -> str | None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        return (
            f"the limit must be a whole number of at least 1, got {n!r}; to stop a step "
            "from running, pause its workflows instead"
        )
    return None


def _key_problem(key: Any) -> str | None:
    if key is None or callable(key):
        return None
    if isinstance(key, str) and key and len(key) <= MAX_KEY_LENGTH:
        return None
    return (
        f"key= takes a non-empty str of at most {MAX_KEY_LENGTH} characters or a callable "
        f"(workflow) -> str, got {key!r}"
    )


@dataclass(frozen=True)
class ConcurrencyLimit:
    """At most ``n`` steps with the same key in progress at once, across every worker.

    ``key``: a constant (or None: one limit for the class or step), or a callable of the
    workflow returning the key (``lambda wf: wf.hero.tenant_id``). It is computed once per
    execution, stored with it, and never again.
    """

    n: int
    key: Key = None

    def problem(self) -> str | None:
        """What is wrong with it, checked when the class that uses it is defined."""
        return _count_problem(self.n) or _key_problem(self.key)


@dataclass(frozen=True)
class RateLimit:
    """At most ``n`` starts per ``per`` with the same key, across every worker."""

    n: int
    per: timedelta
    key: Key = None

    def problem(self) -> str | None:
        """What is wrong with it, checked when the class that uses it is defined."""
        if not isinstance(self.per, timedelta) or self.per <= timedelta(0):
            return f"per= takes a positive timedelta, e.g. timedelta(seconds=1), got {self.per!r}"
        return _count_problem(self.n) or _key_problem(self.key)


@dataclass(frozen=True)
class StepLimits:
    """The limits that apply to one step of one class, and who declared the concurrency one."""

    concurrency: ConcurrencyLimit | None
    concurrency_owner: str
    rate: RateLimit | None
    rate_owner: str


def check_limit(value: Any, where: str, kind: type[ConcurrencyLimit] | type[RateLimit]) -> None:
    """A class attribute or step option that must hold a ``kind`` (or None)."""
    if isinstance(value, kind):
        problem = value.problem()
        if problem is not None:
            raise StepConfigurationError(f"{where} {value!r}: {problem}")
    elif value is not None:
        raise StepConfigurationError(
            f"{where} takes a {kind.__name__}(…) or None, got {value!r}; e.g. "
            + (
                "ConcurrencyLimit(5, key=lambda wf: wf.hero.tenant_id)"
                if kind is ConcurrencyLimit
                else 'RateLimit(10, per=timedelta(seconds=1), key="gateway")'
            )
        )


def limits_of(cls: type[Workflow], step_def: StepDefinition) -> StepLimits | None:
    """The limits of ``step_def`` in ``cls``; None for a step without any (the usual case).

    Worked out once per class when it is defined (``Workflow._step_limits``); read per step.
    """
    return cls._step_limits.get(str(step_def.name))


def resolve(cls: type[Workflow], step_def: StepDefinition) -> StepLimits | None:
    """What :func:`limits_of` returns, worked out from the declarations."""
    own = step_def.concurrency
    class_level = getattr(cls, "concurrency", None)
    concurrency = own if own is not None else class_level
    rate = step_def.rate_limit
    if concurrency is None and rate is None:
        return None
    owner = f"{cls.__name__}.{step_def.name}" if own is not None else _declaring_class(cls)
    return StepLimits(concurrency, owner, rate, f"{cls.__name__}.{step_def.name}")


def _declaring_class(cls: type[Workflow]) -> str:
    """The class whose body set ``concurrency``: its subclasses share its slots."""
    for klass in cls.__mro__:
        if "concurrency" in vars(klass):
            return klass.__name__
    return cls.__name__


def keys_for(
    workflow: Workflow, step_def: StepDefinition, limits: StepLimits, whose: str | None = None
) -> dict[str, str]:
    """The keys stored with an execution of ``step_def``: ``{"concurrency": …, "rate": …}``.

    Runs the key callables (the application's code): an error there, or a value that is no
    key, is a ``StepConfigurationError`` naming the class and step, and the workflow — by its
    id, or by ``whose`` for one not inserted yet (``hero Account '7'``, ``inputs[2] of
    create_many()``).
    """
    which = f"workflow id={workflow.id}" if whose is None else f"for the {whose}"
    keys = {}
    if limits.concurrency is not None:
        value = _value(workflow, step_def, limits.concurrency.key, "concurrency", which)
        owner = limits.concurrency_owner
        keys["concurrency"] = owner if value is None else f"{owner}:{value}"
    if limits.rate is not None:
        value = _value(workflow, step_def, limits.rate.key, "rate_limit", which)
        keys["rate"] = limits.rate_owner if value is None else value
    for kind, key in keys.items():
        if len(key) > MAX_KEY_LENGTH:
            raise StepConfigurationError(
                f"{step_def.label}: its {kind} key {key[:80]!r}… is {len(key)} characters "
                f"long; a key is at most {MAX_KEY_LENGTH} (the column that stores it)"
            )
    return keys


def _value(
    workflow: Workflow, step_def: StepDefinition, key: Key, option: str, which: str
) -> str | None:
    if key is None:
        return None
    if not callable(key):
        return key
    try:
        value = settle(key(workflow))
    except Exception as error:
        raise StepConfigurationError(
            f"{step_def.label}: the {option} key callable raised "
            f"{type(error).__name__}: {error} ({which}); make it return a "
            "str or int for every workflow of the class"
        ) from error
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise StepConfigurationError(
            f"{step_def.label}: the {option} key callable returned {value!r} "
            f"({which}); it must return a non-empty str or an int"
        )
    return str(value)

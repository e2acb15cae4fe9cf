"""Signal matchers: what a ``wait_for=`` step accepts, and the names it says it waits for.

The protocol: a matcher is any object with ``matches(signal) -> bool``, which owns the whole
decision. It may also say which signal names it accepts with ``names`` (a tuple, list or set
of them): those are what the admin API, ``show`` and the dashboard give as what the step
waits for, and what ``Workflow.signal()`` checks a name against. Without ``names`` the
matcher may accept any name: the step waits for ``*``, and no signal to that class is refused
as unknown. :class:`SignalMatcher` (``wait_for="name"``) accepts exactly its one name.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from geneva_drive.core import text
from geneva_drive.core.awaiting import settle
from geneva_drive.storage.limits import MAX_SIGNAL_NAME

if TYPE_CHECKING:
    from geneva_drive.definition.workflow import Workflow

ANY_NAME = "*"  # what a step waits for when its matcher does not say which names


class SignalMatcher:
    """Matches signals by name, optionally narrowed by ``predicate(workflow, payload)``."""

    def __init__(self, name: str, predicate: Callable[[Any, Any], Any] | None = None) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"SignalMatcher needs a non-blank signal name, got {name!r}")
        self.name = name
        self.predicate = predicate

    @property
    def names(self) -> tuple[str]:
        return (self.name,)

    def matches(self, signal: Any) -> bool:
        if signal.name != self.name:
            return False
        if self.predicate is None:
            return True
        # settle(): an ``async def`` predicate is awaited (a coroutine object is truthy).
        return bool(settle(self.predicate(signal.workflow, signal.payload)))

    def __repr__(self) -> str:
        return self.name if self.predicate is None else f"{self.name} (narrowed by payload)"


def names_problem(matcher: Any) -> tuple[tuple[str, ...] | None, str | None]:
    """(the names ``matcher`` accepts or None for any, None) — or (None, what is wrong)."""
    names = getattr(matcher, "names", None)
    if names is None:
        return None, None
    example = "e.g. names = ('approved', 'rejected')"
    if isinstance(names, str | bytes) or not isinstance(names, Iterable):
        return None, (
            f"its names= must be a tuple, list or set of signal names ({example}), got {names!r}"
        )
    found = tuple(names)
    bad = [n for n in found if not isinstance(n, str) or not n.strip() or len(n) > MAX_SIGNAL_NAME]
    if bad or not found:
        return None, (
            f"its names= must hold one or more signal names, each a non-blank str of at most "
            f"{MAX_SIGNAL_NAME} characters ({example}); got {names!r}"
        )
    unstorable = [(n, text.describe(n)) for n in found if text.describe(n) is not None]
    if unstorable:
        name, problem = unstorable[0]
        return None, f"its names= holds {name!r:.60}, with {problem}; {text.RULE}"
    return tuple(dict.fromkeys(found)), None


def awaited(names: tuple[str, ...] | None) -> str:
    """What a step parked on a matcher accepting ``names`` waits for, as stored and shown:
    its one name, ``a | b`` for several, ``*`` for any (cut to the column's length)."""
    if names is None:
        return ANY_NAME
    joined = " | ".join(names)
    return joined if len(joined) <= MAX_SIGNAL_NAME else joined[: MAX_SIGNAL_NAME - 1] + "…"


def awaited_names(cls: type[Workflow]) -> tuple[str, ...] | None:
    """Every signal name a step of ``cls`` waits for, in step order; None if one of its
    matchers may take any name (it has no ``names``), or if ``cls`` has no steps at all — the
    base class standing in for a class this process has not loaded, which cannot say."""
    if not cls.steps:
        return None
    found: dict[str, None] = {}
    for step_def in cls.steps:
        if step_def.signal_matcher is None:
            continue
        if step_def.signal_names is None:
            return None
        found.update(dict.fromkeys(step_def.signal_names))
    return tuple(found)


def unknown_signal(cls: type[Workflow], label: str, name: str) -> str | None:
    """Why no step of ``cls`` could take a signal ``name`` (the refusal), or None if one may.

    ``label``: ``"<Class> id=<id>"``. The names its steps do wait for are listed closest
    first.
    """
    names = awaited_names(cls)
    if names is None or name in names:
        return None
    fix = (
        "check the spelling; to store it for a step not deployed yet, pass allow_unknown=True "
        "(geneva-drive signal --allow-unknown)"
    )
    if not names:
        return f"{label}: signal {name!r}: no step of {cls.__name__} waits for a signal; {fix}"
    closest = difflib.get_close_matches(name, names, n=len(names), cutoff=0.0)
    return (
        f"{label}: signal {name!r}: no step of {cls.__name__} waits for it; its steps wait for "
        f"{', '.join(repr(n) for n in closest)}; {fix}"
    )

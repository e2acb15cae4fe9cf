"""Checks on the user's callables (steps, hooks, conditions, policy handlers), done when a
class is defined: is it async, can it take the arguments geneva-drive will pass.

A leaf of ``definition``: ``steps``, ``policy`` and ``workflow`` all import it, so none of them
has to import another just for these checks.
"""

from __future__ import annotations

import inspect
from typing import Any


def is_coroutine_function(fn: Any) -> bool:
    """An ``async def`` function (also behind a partial or as ``__call__``): awaited when it
    runs (``core.awaiting``)."""
    return any(inspect.iscoroutinefunction(c) for c in _candidates(fn))


def is_async_generator(fn: Any) -> bool:
    """An ``async def`` with ``yield``: nothing could await it to an outcome."""
    return any(inspect.isasyncgenfunction(c) for c in _candidates(fn))


def _candidates(fn: Any) -> list[Any]:
    return [fn, inspect.getattr_static(type(fn), "__call__", None)]


def signature_problem(fn: Any, arguments: int) -> str | None:
    """Why ``fn`` cannot be called with ``arguments`` positional arguments, or None."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: trust it
        return None
    try:
        signature.bind(*range(arguments))
    except TypeError as error:
        return f"{getattr(fn, '__qualname__', fn)}{signature} cannot be: {error}"
    return None

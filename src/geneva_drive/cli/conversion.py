"""The command line's strings converted to the types the options declare, without pydantic.

Typer 0.29 converts every option's value (all but a boolean flag's) through a pydantic
``TypeAdapter`` it builds when the command line is parsed: importing pydantic for it is ~45 ms
of the ~480 ms a ``geneva-drive list`` takes (issue 42). This CLI's options are all a ``str``,
``int``, ``float``, ``bool`` or ``Path``, or a list of one, which need no pydantic:
:func:`convert_without_pydantic` gives each parameter of the built Click command a converter
of its own before the command line is parsed.

It sets Typer 0.29's private ``_runtime_param`` (the converter Typer builds on first use), and
only where Typer has one and the parameter's type is one of those: an older Typer converts
through Click's types and imports no pydantic, and a type not listed here keeps Typer's own
conversion. Either way the command behaves the same, only the import differs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args, get_origin

import typer


def _whole(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        pass
    try:
        number = float(value)  # "5.0", as pydantic took it
    except (TypeError, ValueError):
        number = math.nan
    if number.is_integer():
        return int(number)
    raise ValueError(f"{value!r} is not a whole number")


def _number(value: Any) -> float:
    try:
        return float(value)  # NaN and infinity too: the options' callbacks say why not
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not a number") from None


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise ValueError(f"{value!r} is not text")


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(f"{value!r} is not true or false")


def _path(value: Any) -> Path:
    return Path(value)


_LEAVES: dict[Any, Callable[[Any], Any]] = {
    int: _whole,
    float: _number,
    str: _text,
    bool: _flag,
    Path: _path,
}


def converted(annotation: Any, value: Any) -> Any:
    """``value`` (a string from the command line, or the option's default) as ``annotation``;
    a ValueError that quotes it if it is not one."""
    return _LEAVES[annotation](value)


class _Conversion:
    """What Typer 0.29 asks of a parameter's converter: ``coerce(value, param, ctx)``, with
    Typer's handling of a missing value and of a list given a single string."""

    def __init__(self, leaf: Callable[[Any], Any], *, many: bool) -> None:
        self.leaf = leaf
        self.many = many

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        several = param.multiple or param.nargs == -1
        if value is None:
            return () if several else None
        if several and isinstance(value, str):
            raise typer.BadParameter("Value must be an iterable.", ctx=ctx, param=param)
        try:
            if self.many:
                return [self.leaf(item) for item in value]
            return self.leaf(value)
        except ValueError as error:
            raise typer.BadParameter(str(error), ctx=ctx, param=param) from None


def _conversion(annotation: Any) -> _Conversion | None:
    if get_origin(annotation) is list:
        (item,) = get_args(annotation) or (None,)
        leaf = _LEAVES.get(item)
        return None if leaf is None else _Conversion(leaf, many=True)
    leaf = _LEAVES.get(annotation)
    return None if leaf is None else _Conversion(leaf, many=False)


def convert_without_pydantic(command: Any) -> None:
    """Give every parameter of ``command`` (a Click command or group built by Typer, and its
    subcommands) whose type is listed here a converter that needs no pydantic — ``--help``
    too, which Click creates on first use and keeps."""
    context = command.context_class(command, **command.context_settings)
    for param in [*command.params, command.get_help_option(context)]:
        descriptor = getattr(param, "type_descriptor", None)  # None: no --help option
        if descriptor is None or getattr(param, "_runtime_param", False) is not None:
            continue  # not Typer 0.29's parameter, or its converter is already built
        conversion = _conversion(descriptor.annotation)
        if conversion is not None:
            param._runtime_param = conversion
    for subcommand in getattr(command, "commands", {}).values():
        convert_without_pydantic(subcommand)

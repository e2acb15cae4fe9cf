"""Option values checked as the command line is parsed: a bad one is a usage error (exit 2)
that Click words as ``Invalid value for '--poll-interval': …``, before anything connects.

Click's own ``FloatRange`` lets NaN through (every comparison with NaN is false) and takes
``inf``, so seconds are checked here; whole numbers get the same wording (the value, the
rule, an example).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import typer

from geneva_drive.runtime.worker_options import WorkerOptionError

SecondsCheck = Callable[[typer.CallbackParam, float | None], float | None]


def seconds(*, above_zero: bool, example: str) -> SecondsCheck:
    """A callback refusing NaN, infinity, negative values and (``above_zero``) 0."""
    rule = "above 0" if above_zero else "0 or more"

    def check(param: typer.CallbackParam, value: float | None) -> float | None:
        if value is None:
            return None
        if not math.isfinite(value) or value < 0 or (above_zero and value == 0):
            raise typer.BadParameter(
                f"{value:g} is not a number of seconds {rule}; e.g. {param.opts[0]} {example}"
            )
        return value

    return check


CountCheck = Callable[[typer.CallbackParam, int | None], int | None]


def whole(*, minimum: int, maximum: int | None = None, example: str) -> CountCheck:
    """A callback refusing whole numbers outside ``minimum``..``maximum``."""
    rule = f"from {minimum} to {maximum}" if maximum is not None else f"{minimum} or more"

    def check(param: typer.CallbackParam, value: int | None) -> int | None:
        if value is None:
            return None
        if value < minimum or (maximum is not None and value > maximum):
            raise typer.BadParameter(f"{value} is not {rule}; e.g. {param.opts[0]} {example}")
        return value

    return check


def queue_names(value: str | None) -> str | None:
    """``--queues``: comma-separated names, none of them empty (``''`` used to serve all)."""
    if value is None:
        return None
    names = [name.strip() for name in value.split(",")]
    if not any(names):
        raise typer.BadParameter(
            f"{value!r} names no queue; pass comma-separated queue names (e.g. --queues "
            "orders,default), or leave out --queues to serve every queue"
        )
    if not all(names):
        raise typer.BadParameter(
            f"{value!r} has an empty queue name between its commas; e.g. --queues orders,default"
        )
    return value


def log_format(value: str) -> str:
    """``--log-format``: ``text`` or ``json``."""
    from geneva_drive.runtime.logs import FORMATS

    if value not in FORMATS:
        raise typer.BadParameter(
            f"{value!r} is not a log format; expected one of {', '.join(sorted(FORMATS))}, "
            "e.g. --log-format json"
        )
    return value


def log_level(value: str) -> str:
    """``--log-level``: a standard level name, in any case."""
    from geneva_drive.runtime.logs import LEVELS

    if value.upper() not in LEVELS:
        raise typer.BadParameter(
            f"{value!r} is not a log level; expected one of {', '.join(LEVELS)}, "
            "e.g. --log-level WARNING"
        )
    return value.upper()


def split_queues(value: str | None) -> list[str] | None:
    return None if value is None else [name.strip() for name in value.split(",")]


# Worker(...)'s keyword → the worker command's flag, where they differ.
_FLAGS = {"startup_wait": "--wait-for-database"}


def as_usage_error(error: WorkerOptionError) -> typer.BadParameter:
    """A ``Worker(...)`` refusal of an option (one only the options together reveal, such as
    a heartbeat too slow for the lease) as the usage error naming the flag."""
    flag = _FLAGS.get(error.parameter, "--" + error.parameter.replace("_", "-"))
    return typer.BadParameter(str(error), param_hint=f"'{flag}'")

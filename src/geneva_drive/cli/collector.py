"""Python's cyclic garbage collector, paused while a reading command runs (issue 42).

A ``list`` allocates mostly the modules it imports — SQLAlchemy, Typer, Rich, ours — which
live until the process ends: the ~150 collections its start-up triggered freed a few hundred
objects of ~65,000 and cost ~5 % of its instructions. Reference counting still frees
everything else at once, and a reading command's rows are bounded by its page.

Only commands that read, print and end pause it. A command that runs for long (a worker, the
dashboard, ``stats --watch``) or that works through many rows (a bulk action) keeps it, and so
does any command not named here: forgetting one costs a new command a few milliseconds,
never its memory.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Sequence

READING_COMMANDS = frozenset({"list", "show", "stats", "limits"})
RUNS_FOR_LONG = "--watch"  # `stats --watch` refreshes until Ctrl-C


def pauses_collector(args: Sequence[str]) -> bool:
    """Whether the command line ``args`` (without the program's name) runs a command that
    reads, prints and ends. The command is the first argument that is not an option, as in
    ``cli.main``."""
    command = next((a for a in args if not a.startswith("-")), None)
    return command in READING_COMMANDS and RUNS_FOR_LONG not in args


@contextlib.contextmanager
def collector_paused(args: Sequence[str]) -> Iterator[None]:
    """The collector off while ``args``' command runs, if it reads and ends; then as it was
    (a test running commands in-process gets it back)."""
    if not pauses_collector(args) or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()

"""The options of a :class:`~geneva_drive.runtime.worker.Worker`, checked before it is built.

A number that makes no sense — zero or negative where it cannot be, NaN, infinity — or an empty
queue name is refused here with :class:`WorkerOptionError`, which names the parameter, so that
``geneva-drive worker`` can turn it into a usage error naming its flag. Without it a poll
interval of 0 made an idle worker spin on a core, and ``queues=[""]`` served every queue.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

# How long a worker (and the other long-running commands) keeps retrying an unreachable
# database at startup; here, with the options, so the CLI can show it without the database code.
DEFAULT_WAIT_SECONDS = 30.0


class WorkerOptionError(ValueError):
    """A ``Worker(...)`` option out of its range; ``parameter`` is the keyword's name."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter


@dataclass(frozen=True)
class WorkerOptions:
    """What a worker runs with, every value checked."""

    queues: list[str] | None
    concurrency: int
    poll_interval: float
    lease: timedelta
    heartbeat_interval: timedelta
    grace_period: timedelta
    housekeeping_interval: timedelta | None
    startup_wait: float


def check_options(
    *,
    queues: Any,
    concurrency: Any,
    poll_interval: Any,
    lease: Any,
    grace_period: Any,
    housekeeping_interval: Any,
    heartbeat_interval: Any,
    startup_wait: Any,
) -> WorkerOptions:
    """The options as the worker uses them, or :class:`WorkerOptionError` for the first bad one.

    ``concurrency`` is already resolved (its default depends on the database).
    """
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise WorkerOptionError(
            "concurrency",
            f"Worker(concurrency={concurrency!r}): expected at least 1 (step threads, a whole "
            "number)",
        )
    checked_lease = _duration(
        "lease",
        lease,
        positive=True,
        why="it is how long a dead worker's step stays claimed before another worker recovers "
        "it (default 30 s)",
    )
    return WorkerOptions(
        queues=_queues(queues),
        concurrency=concurrency,
        poll_interval=_duration(
            "poll_interval",
            poll_interval,
            positive=True,
            why="an idle step thread looks for due steps this often (default 1 s)",
        ).total_seconds(),
        lease=checked_lease,
        heartbeat_interval=_heartbeat(heartbeat_interval, checked_lease, lease),
        grace_period=_duration(
            "grace_period",
            grace_period,
            positive=False,
            why="running steps get this long to finish when the worker stops (0: none)",
        ),
        housekeeping_interval=None
        if housekeeping_interval is None
        else _duration(
            "housekeeping_interval",
            housekeeping_interval,
            positive=True,
            why="pass None to leave housekeeping to another process",
        ),
        startup_wait=_duration(
            "startup_wait",
            startup_wait,
            positive=False,
            why="how long to retry an unreachable database at startup (0: fail at once)",
        ).total_seconds(),
    )


def _duration(name: str, value: Any, *, positive: bool, why: str) -> timedelta:
    """``value`` (seconds, or a timedelta) as a timedelta, finite and above 0 (``positive``)
    or at least 0."""
    rule = "above 0" if positive else "0 or more"
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and value is not True and value is not False:
        seconds = float(value)
    else:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        if name == "lease" and math.isfinite(seconds):
            raise WorkerOptionError(
                name, f"Worker(lease={value!r}): a lease must be positive; {why}"
            )
        raise WorkerOptionError(
            name,
            f"Worker({name}={value!r}): expected a finite number of seconds {rule} (or a "
            f"timedelta); {why}",
        )
    return value if isinstance(value, timedelta) else timedelta(seconds=seconds)


def _heartbeat(value: Any, lease: timedelta, given_lease: Any) -> timedelta:
    # The heartbeat renews leases every third of the lease by default: two renewals can fail
    # (a database restart, a long GC pause) before a running step's lease runs out.
    if value is None:
        return lease / 3
    interval = _duration(
        "heartbeat_interval",
        value,
        positive=False,  # 0 is refused below, with the rule that relates it to the lease
        why="leases are renewed this often (default: a third of the lease)",
    )
    if not timedelta(0) < interval <= lease / 3:
        raise WorkerOptionError(
            "heartbeat_interval",
            f"Worker(heartbeat_interval={value!r}, lease={given_lease!r}): the heartbeat must "
            "renew at least three times per lease (0 < interval <= lease / 3 = "
            f"{(lease / 3).total_seconds()}s), or one slow renewal lets a running step's lease "
            "run out; shorten the interval or lengthen the lease",
        )
    return interval


def _queues(queues: Any) -> list[str] | None:
    if queues is None:
        return None
    if not isinstance(queues, list | tuple) or not all(isinstance(q, str) for q in queues):
        raise WorkerOptionError(
            "queues",
            f"Worker(queues={queues!r}): expected a list of queue names, e.g. "
            "queues=['orders', 'default'], or None to serve every queue",
        )
    names = list(queues)
    if not names:
        raise WorkerOptionError(
            "queues",
            "Worker(queues=[]): an empty list serves no queue at all; pass None to serve every "
            "queue, or name the queues",
        )
    if any(not name.strip() for name in names):
        raise WorkerOptionError(
            "queues",
            f"Worker(queues={names!r}): a queue name cannot be empty or blank; name the queues "
            "to serve, or pass None to serve every queue",
        )
    return names

"""What a caller tells a run of step executions: the options of ``executor.run_execution``
and ``executor.claim_and_run``, which the resumable runner (``iteration``) reads too.

Plain options, decided by the caller. What runs learn and keep for the next one (how wide
a handover claims) is the chaining module's own (``chaining.Handovers``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta


@dataclass
class RunOptions:
    interruptible: bool = True
    max_iterations: int | None = None
    should_exit: Callable[[], bool] | None = None
    worker_id: str | None = None
    lease: timedelta | None = None
    # Chaining (the database worker): given the queue of a next step that is due now, True
    # means "start it in the transaction that completes this one and run it here next".
    chain: Callable[[str], bool] | None = None
    # Told of every step started without a claim of its own: True when it is the next step
    # of the workflow that just ran (chaining), False when the transaction that finished a
    # workflow claimed it (see chaining.claim_next).
    on_chained: Callable[[bool], None] | None = None
    # Told the id of every step this run starts (the first and each chained one), in the
    # running thread: what a heartbeat renews (leases.RunningExecutions.started).
    on_started: Callable[[int], None] | None = None
    # Hold one connection for the whole run (a step thread: a checkout per transaction saved),
    # or take one per transaction, and for the body only once it touches the database (the
    # async lane: steps awaiting I/O hold none, see runtime.async_lane).
    hold_connection: bool = True

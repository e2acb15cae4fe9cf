"""Running the async lane in the test's process: the worker's lane, without the worker."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from geneva_drive.core.settings import Settings
from geneva_drive.engine.leases import RunningExecutions
from geneva_drive.engine.run_options import RunOptions
from geneva_drive.runtime.async_lane import AsyncLane
from geneva_drive.storage.queries.claims import ClaimScope


@contextmanager
def lane(
    config: Settings,
    *,
    concurrency: int = 4,
    pool_size: int | None = 2,
    running: RunningExecutions | None = None,
    poll_interval: float = 0.05,
    before_start: Callable[[AsyncLane], None] | None = None,
) -> Iterator[AsyncLane]:
    """An async lane claiming every class, running in a thread until the block ends.

    ``before_start``: called with the lane before its thread starts (to watch its engine).
    """
    stop = threading.Event()
    the_lane = AsyncLane(
        config,
        RunOptions(),
        running or RunningExecutions(),
        concurrency=concurrency,
        poll_interval=poll_interval,
        should_exit=stop.is_set,
        scope=lambda: ClaimScope(),
        count=lambda: None,
        pool_size=pool_size,
    )
    if before_start is not None:
        before_start(the_lane)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            the_lane.run()
        except BaseException as error:  # surfaced in the test below
            failed.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield the_lane
    finally:
        stop.set()
        thread.join(timeout=30)
    # Stopping is honoured however long the poll interval: an idle lane does not sleep it out.
    assert not thread.is_alive(), "the lane did not stop within 30 s of should_exit()"
    assert not failed, failed


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Block until ``condition()`` holds, checking whenever the lane may have moved on."""
    done = threading.Event()
    deadline = threading.Timer(timeout, done.set)
    deadline.start()
    try:
        while not condition():
            if done.wait(0.01):
                raise AssertionError(f"timed out after {timeout}s waiting for {condition}")
    finally:
        deadline.cancel()

"""One racer for the schedule race test, run as a process: ``python -m tests.schedules.race
URL AT``. Connects, prints "ready", waits for a line on stdin (the start: all racers begin
together), runs one schedule pass at the frozen time AT, and prints how many workflows it
created."""

from __future__ import annotations

import sys
from datetime import datetime

from geneva_drive import DatabaseBackend, FrozenClock, create_engine
from geneva_drive.engine.schedules import run_due_schedules
from geneva_drive.runtime.configure import configured
from tests.schedules.apps import NightlyBackfill


def main(url: str, at: str) -> None:
    engine = create_engine(url)
    clock = FrozenClock(datetime.fromisoformat(at))
    with configured(engine=engine, clock=clock, backend=DatabaseBackend()) as config:
        with engine.connect():  # a pooled connection, so the start is the race, not connecting
            pass
        print("ready", flush=True)
        sys.stdin.readline()
        created = run_due_schedules(config, [NightlyBackfill])
    print(len(created), flush=True)
    engine.dispose()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""Worker options are checked when the worker is built: a number that makes no sense (zero,
negative, NaN, infinity) or an empty queue name is refused with the option named, before any
thread starts — the same for ``geneva-drive worker`` (exit 2) and ``Worker(...)`` in Python."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from geneva_drive.runtime.worker import Worker
from geneva_drive.runtime.worker_options import WorkerOptionError

NAN = math.nan
INF = math.inf


@pytest.mark.parametrize(
    ("options", "parameter", "says"),
    [
        ({"poll_interval": 0}, "poll_interval", "poll_interval=0): expected a finite number"),
        ({"poll_interval": -1}, "poll_interval", "above 0"),
        ({"poll_interval": NAN}, "poll_interval", "poll_interval=nan)"),
        ({"poll_interval": INF}, "poll_interval", "poll_interval=inf)"),
        ({"grace_period": -1}, "grace_period", "0 or more"),
        ({"grace_period": NAN}, "grace_period", "grace_period=nan)"),
        ({"grace_period": timedelta(seconds=-1)}, "grace_period", "0 or more"),
        ({"startup_wait": -5}, "startup_wait", "startup_wait=-5): expected"),
        ({"startup_wait": INF}, "startup_wait", "startup_wait=inf)"),
        ({"housekeeping_interval": 0}, "housekeeping_interval", "above 0"),
        ({"housekeeping_interval": NAN}, "housekeeping_interval", "nan"),
        ({"lease": NAN}, "lease", "lease=nan)"),
        ({"lease": INF}, "lease", "lease=inf)"),
        ({"heartbeat_interval": NAN}, "heartbeat_interval", "heartbeat_interval=nan"),
        ({"concurrency": 0}, "concurrency", "concurrency=0): expected at least 1"),
        ({"concurrency": 1.5}, "concurrency", "concurrency=1.5)"),
        ({"queues": [""]}, "queues", "queues=['']): a queue name cannot be empty"),
        ({"queues": ["orders", "  "]}, "queues", "cannot be empty"),
        ({"queues": []}, "queues", "pass None to serve every queue"),
        ({"queues": "orders"}, "queues", "a list of queue names"),
        ({"poll_interval": "1"}, "poll_interval", "poll_interval='1')"),
    ],
)
def test_a_nonsense_option_is_refused_naming_it(gd, options, parameter, says):
    with pytest.raises(WorkerOptionError) as refused:
        Worker(config=gd, **options)

    assert refused.value.parameter == parameter
    assert f"Worker({parameter}=" in str(refused.value)
    assert says in str(refused.value)
    assert isinstance(refused.value, ValueError)  # what Worker(...) always raised


def test_sensible_edge_values_are_accepted(gd):
    worker = Worker(
        config=gd,
        queues=["orders"],
        poll_interval=0.01,
        grace_period=0,
        startup_wait=0,
        housekeeping_interval=timedelta(minutes=5),
    )

    assert worker.queues == ["orders"]
    assert worker.grace_period == timedelta(0)
    assert worker.housekeeping_interval == timedelta(minutes=5)
    assert worker.poll_interval == 0.01

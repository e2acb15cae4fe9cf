"""The per-step metrics — step outcomes, step durations, queue lag, claims — counted without
prometheus-client on the step's path, and exported by a collector of its own.

Why not prometheus-client's ``Counter`` and ``Histogram``: each ``inc()`` and ``observe()``
checks its metric and takes a lock, and a step makes five of them, a claim one. On a no-op
step that was 4 % of what the step costs (``benchmarks/instructions.py --observe``). Here each
step thread counts into a :class:`Tally` of its own, which nothing else writes, so it needs
no lock; a scrape (:meth:`StepCollector.collect`) adds the threads' tallies up.

What a scrape reads, while steps run, is each tally as it is at that moment: copying a dict
or a list is one step of the interpreter, so every figure read is one the thread wrote. A
histogram's ``_count`` is the sum of its buckets, so the two always agree; its ``_sum`` may
miss the observation the thread is making. The tally of a thread that has ended is folded
into one kept for ended threads, so that no count goes down.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

# Step bodies run from milliseconds to minutes; queue lag from milliseconds to hours.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
LAG_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)

# How prometheus-client writes a bucket's bound ("0.005", "1.0", "+Inf"), typed for mypy.
_go_string = cast(Callable[[float], str], floatToGoString)

StepKey = tuple[str, str, str]  # workflow class, step, outcome
Pair = tuple[str, str]  # workflow class and step (durations) or queue (lag)


class Tally:
    """One thread's counts. A histogram's row holds a count per bucket (not cumulative; the
    last one is ``+Inf``), then the sum of the values observed."""

    __slots__ = ("claims", "durations", "lags", "steps")

    def __init__(self) -> None:
        self.steps: dict[StepKey, int] = {}
        self.durations: dict[Pair, list[float]] = {}
        self.lags: dict[Pair, list[float]] = {}
        self.claims = 0

    def step(
        self, key: StepKey, step_key: Pair, lag_key: Pair, seconds: float, lag: float | None
    ) -> None:
        steps = self.steps
        steps[key] = steps.get(key, 0) + 1
        row = self.durations.get(step_key)
        if row is None:
            row = self.durations[step_key] = [0.0] * (len(DURATION_BUCKETS) + 2)
        row[bisect_left(DURATION_BUCKETS, seconds)] += 1  # first bound >= the value: le
        row[-1] += seconds
        if lag is not None:
            row = self.lags.get(lag_key)
            if row is None:
                row = self.lags[lag_key] = [0.0] * (len(LAG_BUCKETS) + 2)
            row[bisect_left(LAG_BUCKETS, lag)] += 1
            row[-1] += lag

    def add(self, other: Tally) -> None:
        """Add ``other``'s counts to this one's (``other`` copied first if it is live)."""
        for key, count in other.steps.items():
            self.steps[key] = self.steps.get(key, 0) + count
        for mine, theirs in ((self.durations, other.durations), (self.lags, other.lags)):
            for pair, row in theirs.items():
                into = mine.get(pair)
                if into is None:
                    mine[pair] = list(row)
                else:
                    mine[pair] = [a + b for a, b in zip(into, row, strict=True)]
        self.claims += other.claims

    def copy(self) -> Tally:
        """A snapshot of a tally its thread may be writing: each dict and row copied at once."""
        copied = Tally()
        copied.steps = dict(self.steps)
        copied.durations = {pair: list(row) for pair, row in list(self.durations.items())}
        copied.lags = {pair: list(row) for pair, row in list(self.lags.items())}
        copied.claims = self.claims
        return copied


class StepCollector(Collector):
    """The tallies of every thread that counted, as four metric families on a registry."""

    def __init__(self) -> None:
        self._local = threading.local()
        # Taken to add a thread's tally, and by a scrape to fold ended threads' tallies into
        # _ended: a thread registering while a scrape walks the list would change it under it.
        self._lock = threading.Lock()
        self._live: list[tuple[threading.Thread, Tally]] = []
        self._ended = Tally()

    def tally(self) -> Tally:
        """This thread's tally, made the first time the thread asks."""
        mine: Tally | None = getattr(self._local, "tally", None)
        if mine is None:
            mine = self._local.tally = Tally()
            with self._lock:
                self._live.append((threading.current_thread(), mine))
        return mine

    def total(self) -> Tally:
        """Every thread's counts added up (ended threads' folded in for good)."""
        with self._lock:
            ended = [entry for entry in self._live if not entry[0].is_alive()]
            for entry in ended:  # its thread writes no more: no copy needed
                self._ended.add(entry[1])
                self._live.remove(entry)
            live = [tally for _, tally in self._live]
            total = self._ended.copy()
        for tally in live:
            total.add(tally.copy())
        return total

    def describe(self) -> Iterable[Metric]:
        """The families, without samples: lets a registry refuse a second install's names."""
        return _families(Tally())

    def collect(self) -> Iterable[Metric]:
        return _families(self.total())


def _families(tally: Tally) -> Iterator[Metric]:
    steps = CounterMetricFamily(
        "geneva_drive_steps",
        "Step executions run, by workflow class, step and outcome",
        labels=["workflow", "step", "outcome"],
    )
    for key, count in sorted(tally.steps.items()):
        steps.add_metric(list(key), count)
    yield steps
    yield _histogram(
        "geneva_drive_step_duration_seconds",
        "Time a step's body took (hooks included), by workflow class and step",
        ["workflow", "step"],
        DURATION_BUCKETS,
        tally.durations,
    )
    yield _histogram(
        "geneva_drive_queue_lag_seconds",
        "Time from a step execution's due time to its start, by workflow class and queue",
        ["workflow", "queue"],
        LAG_BUCKETS,
        tally.lags,
    )
    claims = CounterMetricFamily(
        "geneva_drive_claims", "Step executions claimed by this process", labels=[]
    )
    claims.add_metric([], tally.claims)
    yield claims


def _histogram(
    name: str,
    documentation: str,
    labels: list[str],
    bounds: tuple[float, ...],
    rows: dict[Pair, list[float]],
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=labels)
    edges = [_go_string(bound) for bound in bounds] + ["+Inf"]
    for pair, row in sorted(rows.items()):
        buckets: list[Any] = []
        running = 0.0
        for edge, count in zip(edges, row[:-1], strict=True):
            running += count
            buckets.append((edge, running))
        family.add_metric(list(pair), buckets, row[-1])
    return family

"""The overview's sparkline: the last hour's step outcomes as stacked bars, drawn on the server.

Pure geometry from ``admin.Stats.buckets``; the template writes it out as inline SVG, so the
page needs no script to show it, and a screen reader gets every number from the labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from geneva_drive.admin import OutcomeBucket
from geneva_drive.admin.measure import BUCKET

HEIGHT = 40  # viewBox units; the bars scale to the busiest bucket
BAR = 10
GAP = 2
KINDS = ("success", "failed", "other")  # bottom to top
TICK_EVERY = 3  # buckets between time labels: a quarter hour
AXIS = 17  # viewBox units below the bars: the tick labels, then the axis's name


@dataclass(frozen=True)
class Segment:
    kind: str
    y: float
    height: float


@dataclass(frozen=True)
class Bar:
    x: int
    label: str  # "20:05–20:10 UTC: 3 succeeded, 1 failed, 0 other"
    segments: tuple[Segment, ...]


@dataclass(frozen=True)
class Tick:
    x: int  # where the bucket starting at this time begins (the last one: where it ends)
    label: str  # "12:15"


@dataclass(frozen=True)
class Sparkline:
    width: int
    height: int  # of the bars; the time axis is drawn below, down to view_height
    label: str  # every bucket's numbers, for the SVG's <title> and aria-label
    bars: tuple[Bar, ...]
    ticks: tuple[Tick, ...] = ()
    axis_label: str = "Time (UTC)"

    @property
    def view_height(self) -> int:
        return self.height + AXIS


def sparkline(buckets: Sequence[OutcomeBucket]) -> Sparkline:
    top = max((b.total for b in buckets), default=0) or 1
    bars = tuple(_bar(n * (BAR + GAP), b, top) for n, b in enumerate(buckets))
    total = sum(b.total for b in buckets)
    label = f"Step outcomes over the last hour, per 5 minutes ({total:,} in all): " + "; ".join(
        bar.label for bar in bars
    )
    width = max(0, len(buckets) * (BAR + GAP) - GAP)
    return Sparkline(width=width, height=HEIGHT, label=label, bars=bars, ticks=_ticks(buckets))


def _ticks(buckets: Sequence[OutcomeBucket]) -> tuple[Tick, ...]:
    """A time under every quarter hour's first bar, and the hour's end under the last bar's
    right edge (so the axis reads from an hour ago to now)."""
    if not buckets:
        return ()
    ticks = [
        Tick(n * (BAR + GAP), b.start.strftime("%H:%M"))
        for n, b in enumerate(buckets)
        if n % TICK_EVERY == 0
    ]
    end = len(buckets) * (BAR + GAP) - GAP
    return (*ticks, Tick(end, (buckets[-1].start + BUCKET).strftime("%H:%M")))


def _bar(x: int, bucket: OutcomeBucket, top: int) -> Bar:
    segments = []
    y = float(HEIGHT)
    for kind, count in zip(KINDS, (bucket.success, bucket.failed, bucket.other), strict=True):
        if count:
            height = round(HEIGHT * count / top, 2)
            y = round(y - height, 2)
            segments.append(Segment(kind, y, height))
    return Bar(x=x, label=_label(bucket), segments=tuple(segments))


def _label(bucket: OutcomeBucket) -> str:
    start = bucket.start.strftime("%H:%M")
    end = (bucket.start + BUCKET).strftime("%H:%M")
    return (
        f"{start}–{end} UTC: {bucket.success:,} succeeded, {bucket.failed:,} failed, "
        f"{bucket.other:,} other"
    )

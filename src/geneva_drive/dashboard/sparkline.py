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
class Sparkline:
    width: int
    height: int
    label: str  # every bucket's numbers, for the SVG's <title> and aria-label
    bars: tuple[Bar, ...]


def sparkline(buckets: Sequence[OutcomeBucket]) -> Sparkline:
    top = max((b.total for b in buckets), default=0) or 1
    bars = tuple(_bar(n * (BAR + GAP), b, top) for n, b in enumerate(buckets))
    total = sum(b.total for b in buckets)
    label = f"Step outcomes over the last hour, per 5 minutes ({total:,} in all): " + "; ".join(
        bar.label for bar in bars
    )
    width = max(0, len(buckets) * (BAR + GAP) - GAP)
    return Sparkline(width=width, height=HEIGHT, label=label, bars=bars)


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

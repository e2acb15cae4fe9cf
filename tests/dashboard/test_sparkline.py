"""The overview's sparkline: bars scaled to the busiest bucket, every number in its labels."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from geneva_drive.admin import OutcomeBucket
from geneva_drive.dashboard.sparkline import HEIGHT, sparkline

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def buckets(*counts: tuple[int, int, int]) -> list[OutcomeBucket]:
    return [OutcomeBucket(T0 + timedelta(minutes=5 * n), *c) for n, c in enumerate(counts)]


def test_bars_stack_success_failed_other_scaled_to_the_busiest_bucket():
    spark = sparkline(buckets((2, 1, 1), (0, 0, 0), (1, 0, 0)))

    first, empty, last = spark.bars
    assert [(s.kind, s.y, s.height) for s in first.segments] == [
        ("success", HEIGHT / 2, HEIGHT / 2),
        ("failed", HEIGHT / 4, HEIGHT / 4),
        ("other", 0, HEIGHT / 4),
    ]
    assert empty.segments == ()
    assert [(s.kind, s.height) for s in last.segments] == [("success", HEIGHT / 4)]
    assert [b.x for b in spark.bars] == [0, 12, 24] and spark.width == 34


def test_the_labels_name_each_buckets_time_and_numbers():
    spark = sparkline(buckets((2, 1, 0), (0, 0, 3)))

    assert spark.bars[0].label == "12:00–12:05 UTC: 2 succeeded, 1 failed, 0 other"
    assert spark.bars[1].label == "12:05–12:10 UTC: 0 succeeded, 0 failed, 3 other"
    assert spark.label.startswith("Step outcomes over the last hour, per 5 minutes (6 in all): ")
    assert re.findall(r"\d+ succeeded", spark.label) == ["2 succeeded", "0 succeeded"]


def test_an_hour_without_endings_draws_no_bar_and_says_so():
    spark = sparkline(buckets(*[(0, 0, 0)] * 12))

    assert all(b.segments == () for b in spark.bars)
    assert "(0 in all)" in spark.label


def test_the_time_axis_marks_every_quarter_hour_and_the_end_in_utc():
    spark = sparkline(buckets(*[(1, 0, 0)] * 12))

    assert [(t.x, t.label) for t in spark.ticks] == [
        (0, "12:00"),
        (36, "12:15"),
        (72, "12:30"),
        (108, "12:45"),
        (142, "13:00"),
    ]
    assert spark.axis_label == "Time (UTC)"
    assert spark.view_height > spark.height  # the axis sits below the bars, not on them

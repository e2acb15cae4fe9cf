"""The Grafana dashboard in the docs asks only for metrics a worker exports."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry

from geneva_drive.runtime import housekeeping, metrics
from geneva_drive.testing import perform_next_step, speedrun
from tests.observability.test_metrics import MetricTwoSteps, MetricWaits, _start

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
METRIC = re.compile(r"\bgeneva_drive_[a-z_]+")


def _queries() -> dict[str, list[str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return {
        panel["title"]: [target["expr"] for target in panel["targets"]]
        for panel in dashboard["panels"]
    }


def _exported(registry: CollectorRegistry) -> set[str]:
    """Every series name the registry serves, including those of labelled metrics that have
    no series yet (a counter's _total, a histogram's _bucket, _sum and _count)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    names = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    return names


def test_every_panel_has_a_query_and_every_query_names_an_exported_metric(session, gd, clock):
    registry = CollectorRegistry()
    uninstall = metrics.install(registry)
    try:
        speedrun(_start(session, MetricTwoSteps))
        perform_next_step(_start(session, MetricWaits))  # waiting
        _start(session, MetricTwoSteps).pause()
        session.commit()
        clock.advance(timedelta(days=8))  # the waiting one is overdue
        housekeeping.run(gd, registry=registry)
    finally:
        uninstall()
    exported = _exported(registry)

    queries = _queries()
    assert len(queries) >= 8
    for title, expressions in queries.items():
        named = {name for expr in expressions for name in METRIC.findall(expr)}
        assert named, f"panel {title!r} names no geneva_drive metric"
        assert named <= exported, f"panel {title!r}: {sorted(named - exported)} not exported"

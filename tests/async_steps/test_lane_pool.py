"""The async lane's pool grows with its slots, within bounds (``async_lane.lane_pool_size``)."""

from __future__ import annotations

import pytest

from geneva_drive.runtime.async_lane import LANE_POOL_MAX, LANE_POOL_MIN, lane_pool_size
from tests.async_steps._support import lane


@pytest.mark.parametrize(
    ("slots", "connections"),
    [(1, LANE_POOL_MIN), (100, 4), (200, 8), (500, LANE_POOL_MAX), (5000, LANE_POOL_MAX)],
)
def test_the_lane_holds_a_connection_per_25_slots_within_its_bounds(slots, connections):
    assert lane_pool_size(slots) == connections


def test_a_lane_of_500_slots_has_a_pool_of_16_not_4(gd):
    with lane(gd, concurrency=500, pool_size=None) as the_lane:
        pool = the_lane.engine.sync_engine.pool
        assert pool.size() == LANE_POOL_MAX  # type: ignore[attr-defined]

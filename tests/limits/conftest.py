from __future__ import annotations

from typing import Any

import pytest

from tests.limits.apps import LimitsBase


@pytest.fixture(autouse=True)
def _body_runs_table(request: pytest.FixtureRequest) -> None:
    if "gd" in request.fixturenames:
        gd: Any = request.getfixturevalue("gd")
        LimitsBase.metadata.create_all(gd.engine)

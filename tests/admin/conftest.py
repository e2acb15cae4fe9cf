"""Fixtures for the admin tests: heroes, and workflows in the states an operator meets."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.orm import Session

from geneva_drive import Workflow
from geneva_drive.testing import perform_next_step, speedrun
from tests.support.app import Order


def start(session: Session, cls: type[Workflow], status: str = "new") -> Any:
    order = Order(status=status)
    session.add(order)
    wf = cls.create(session, hero=order)
    session.commit()
    return wf


@pytest.fixture
def make(session: Session) -> Any:
    """``make(cls, status=..., run=n)``: a committed workflow, with ``run`` steps performed."""

    def build(cls: type[Workflow], status: str = "new", run: int | str = 0) -> Any:
        wf = start(session, cls, status)
        if run == "all":
            speedrun(wf, raise_errors=False)
        for _ in range(int(run) if run != "all" else 0):
            perform_next_step(wf, raise_errors=False)
        session.commit()
        return wf

    return build

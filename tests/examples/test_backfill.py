"""examples/backfill: the resumable backfill, driven by the pytest plugin's fixtures, and its
start command run as its README says."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType

import pytest
from sqlalchemy import select

from geneva_drive.housekeeping import run as run_housekeeping
from geneva_drive.testing import (
    assert_cursor,
    crash_next_step,
    history,
    run_iterations,
    speedrun,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "backfill" / "backfill.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("examples_backfill", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its annotations name classes of the module
    spec.loader.exec_module(module)
    return module


backfill = _load()


@pytest.fixture
def invoices(geneva_drive_engine, geneva_drive_session):
    backfill.Base.metadata.drop_all(geneva_drive_engine)
    backfill.Base.metadata.create_all(geneva_drive_engine)
    backfill.seed(geneva_drive_session, 250)
    return geneva_drive_session


def _totals(session) -> list[int | None]:
    totals = list(session.scalars(select(backfill.Invoice.total_cents).order_by("id")))
    session.commit()
    return totals


def _expected(n: int) -> int:
    return sum(100 * n + k for k in range(3))


def test_the_backfill_fills_every_invoice(invoices):
    wf = backfill.start_or_continue(invoices)

    speedrun(wf)

    assert wf.state == "finished"
    assert _totals(invoices) == [_expected(n) for n in range(250)]


def test_a_crashed_backfill_goes_on_after_its_last_checkpoint(invoices, frozen_clock):
    wf = backfill.start_or_continue(invoices)
    run_iterations(wf, 100)  # 100 invoices (one checkpoint), then a successor
    assert backfill.missing_totals(invoices) == 150
    assert_cursor(wf, 100)

    # The successor walks the rest and dies before its hand-back: the checkpoint at 200
    # committed, the 50 invoices after it roll back.
    crash_next_step(wf)
    assert backfill.missing_totals(invoices) == 50
    frozen_clock.advance(timedelta(hours=1, seconds=1))  # stuck_in_progress_threshold
    assert run_housekeeping()["stuck_in_progress_recovered"] == 1
    speedrun(wf)

    assert wf.state == "finished"
    assert _totals(invoices) == [_expected(n) for n in range(250)]  # each once, none skipped
    assert [outcome for _, _, outcome in history(wf)] == [
        "continued",
        "recovered",
        "success",
    ]


@pytest.mark.slow
def test_the_start_command_runs_the_backfill_to_the_end(tmp_path):
    url = f"sqlite:///{tmp_path / 'backfill.db'}"
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--database-url", url, "--invoices", "300"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "backfill workflow 1: 300 invoices to fill", result.stdout
    assert lines[-1] == "backfill workflow 1: finished, 0 invoices left", result.stdout

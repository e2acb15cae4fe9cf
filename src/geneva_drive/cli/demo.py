"""``geneva-drive demo``: three small workflows driven by the real worker on a SQLite file.

Shows waits (seconds, not days), a skip condition, a reattempt policy riding out a flaky
payment gateway, a step that pauses itself until an operator resumes it, and the audit
trail every execution leaves behind.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table
from sqlalchemy import Engine, String, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from geneva_drive.definition.policy import ExceptionPolicy
from geneva_drive.definition.steps import step
from geneva_drive.definition.workflow import Workflow
from geneva_drive.runtime.configure import configured
from geneva_drive.runtime.worker import Worker
from geneva_drive.storage.db import create_engine
from geneva_drive.storage.migrate import install


class DemoBase(DeclarativeBase):
    pass


class DemoCustomer(DemoBase):
    __tablename__ = "demo_customers"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(50))
    wants_tips: Mapped[bool] = mapped_column(default=True)
    emails_sent: Mapped[int] = mapped_column(default=0)
    charged_cents: Mapped[int] = mapped_column(default=0)
    shipped: Mapped[bool] = mapped_column(default=False)


class DemoWarehouse(DemoBase):
    __tablename__ = "demo_warehouse"

    id: Mapped[int] = mapped_column(primary_key=True)
    open: Mapped[bool] = mapped_column(default=False)


class GatewayTimeout(Exception):
    """The demo payment gateway is slow the first two times."""


class DemoOnboarding(Workflow):
    workflow_type = "demo.Onboarding"

    @step
    def send_welcome(self) -> None:
        self.hero.emails_sent += 1

    @step(wait=2, skip_if=lambda wf: not wf.hero.wants_tips)
    def send_tips(self) -> None:
        self.hero.emails_sent += 1

    @step(wait=2)
    def ask_for_feedback(self) -> None:
        self.hero.emails_sent += 1


class DemoPayment(Workflow):
    workflow_type = "demo.Payment"
    exception_policies = [
        ExceptionPolicy("reattempt", matching=GatewayTimeout, wait=1, max_reattempts=3)
    ]

    @step
    def authorize(self) -> None:
        pass

    @step
    def capture(self) -> None:
        earlier = [e for e in self.execution_history if e.step_name == "capture"]
        if len(earlier) < 3:  # this attempt plus fewer than two before it
            raise GatewayTimeout("gateway did not answer in 5s")
        self.hero.charged_cents += 12_500

    @step
    def send_receipt(self) -> None:
        self.hero.emails_sent += 1


class DemoFulfillment(Workflow):
    workflow_type = "demo.Fulfillment"

    @step
    def pick_items(self) -> None:
        pass

    @step
    def check_warehouse(self) -> None:
        warehouse = self.session.get(DemoWarehouse, 1)
        if warehouse is None or not warehouse.open:
            self.pause()  # an operator resumes us once the warehouse opens

    @step(wait=1)
    def ship(self) -> None:
        self.hero.shipped = True


def run_demo(path: Path) -> None:
    console = Console()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    engine = create_engine(f"sqlite:///{path}")
    install(engine)
    DemoBase.metadata.create_all(engine)
    started = time.monotonic()

    def report(error: BaseException, context: dict[str, object]) -> None:
        console.print(
            f"[red]reported:[/] {type(error).__name__}: {error} in "
            f"{context['workflow_class']} #{context['workflow_id']} step {context['step_name']!r}"
            f" → {context['action']}"
        )

    logging.getLogger("geneva_drive").setLevel(logging.ERROR)  # the timelines tell the story
    with (
        configured(engine=engine, error_reporter=report) as config,
        Session(engine, expire_on_commit=False) as s,
    ):
        s.add(DemoWarehouse(id=1, open=False))
        ada = DemoCustomer(name="Ada", wants_tips=True)
        bob = DemoCustomer(name="Bob", wants_tips=False)
        cy = DemoCustomer(name="Cy")
        s.add_all([ada, bob, cy])
        s.flush()
        workflows: list[Workflow] = [
            DemoOnboarding.create(s, hero=ada),
            DemoOnboarding.create(s, hero=bob),
            DemoPayment.create(s, hero=cy),
            DemoFulfillment.create(s, hero=cy),
        ]
        s.commit()
        ids = [wf.id for wf in workflows]
        console.print(f"[bold]Started {len(ids)} workflows[/] in {path}; running the worker…")

        def all_done() -> bool:
            with Session(engine) as check:
                left = check.execute(
                    select(func.count())
                    .select_from(Workflow)
                    .where(Workflow.id.in_(ids), Workflow.state.notin_(("finished", "canceled")))
                ).scalar_one()
            return left == 0

        worker = Worker(config=config, poll_interval=0.2)
        thread = threading.Thread(
            target=worker.run, kwargs={"until": all_done, "install_signals": False}
        )
        thread.start()
        _operator_opens_warehouse(engine, workflows[3].id, console)
        thread.join(timeout=50)
        if thread.is_alive():
            worker.stop()
            thread.join()
        console.print(
            f"[bold]Done[/] in {time.monotonic() - started:.1f}s: {worker.steps_run} step runs\n"
        )
        for wf_id in ids:
            _print_timeline(console, engine, wf_id)


def _operator_opens_warehouse(engine: Engine, workflow_id: int, console: Console) -> None:
    """Plays the operator: waits for the fulfillment to pause, opens the warehouse, resumes."""
    deadline = time.monotonic() + 30
    with Session(engine) as s:
        while time.monotonic() < deadline:
            wf = s.get(Workflow, workflow_id, populate_existing=True)
            assert wf is not None
            if wf.state == "paused":
                console.print(
                    "[yellow]operator:[/] fulfillment paused (warehouse closed) — "
                    "opening it and resuming"
                )
                warehouse = s.get(DemoWarehouse, 1)
                assert warehouse is not None
                warehouse.open = True
                wf.resume()
                s.commit()
                return
            s.rollback()
            time.sleep(0.2)  # a human operator, not a test: polling is fine here


def _print_timeline(console: Console, engine: Engine, workflow_id: int) -> None:
    with Session(engine) as s:
        wf = s.get(Workflow, workflow_id)
        assert wf is not None
        history = wf.execution_history
        origin = history[0].created_at if history else datetime.now()
        table = Table(
            title=f"{type(wf).__name__} #{wf.id} (hero {wf.hero_type} {wf.hero_id}) → {wf.state}",
            title_justify="left",
        )
        for column in ("exec", "step", "state", "outcome", "due", "ran", "note"):
            table.add_column(column)
        for e in history:
            info = e.exception_info or {}
            note = e.error_message or (
                f"{e.reattempt_reason}: {info.get('message', '')}" if e.reattempt_reason else ""
            )
            table.add_row(
                str(e.id),
                e.step_name,
                e.state,
                e.outcome or "",
                _offset(e.scheduled_for, origin),
                _offset(e.started_at, origin) if e.started_at else "",
                note,
            )
        console.print(table)


def _offset(moment: datetime, origin: datetime) -> str:
    return f"+{max(0.0, (moment - origin).total_seconds()):.1f}s"

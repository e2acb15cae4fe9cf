"""A bulk backfill with a resumable step: fill in every invoice's total, 100 rows per commit.

    python examples/backfill/backfill.py                    # SQLite file backfill.db, here
    python examples/backfill/backfill.py --database-url postgresql+psycopg://app@localhost/app

Stop it at any moment (Ctrl-C, a deploy, a killed process) and start it again: it goes on
after the last committed checkpoint — no invoice done twice, none skipped.
"""

from __future__ import annotations

import argparse
from datetime import timedelta

from sqlalchemy import Engine, ForeignKey, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

import geneva_drive
from geneva_drive import Workflow, resumable_step
from geneva_drive.worker import Worker


class Base(DeclarativeBase):
    pass


class Invoice(Base):
    __tablename__ = "example_invoices"

    id: Mapped[int] = mapped_column(primary_key=True)
    total_cents: Mapped[int | None]
    lines: Mapped[list[InvoiceLine]] = relationship()


class InvoiceLine(Base):
    __tablename__ = "example_invoice_lines"

    id: Mapped[int] = mapped_column(primary_key=True)
    invoice_id: Mapped[int] = mapped_column(ForeignKey("example_invoices.id"))
    cents: Mapped[int]


class BackfillInvoiceTotals(Workflow):
    may_proceed_without_hero = True  # a job over a table, not about one record

    # A checkpoint every 100 invoices commits their totals with the cursor (the last id done);
    # after 5 minutes the execution hands over to a successor, so other work gets a turn.
    @resumable_step(max_runtime=timedelta(minutes=5), checkpoint_every=100)
    def fill_totals(self, it):
        missing = select(Invoice).where(Invoice.total_cents.is_(None))
        for invoice in it.iterate_over_records(missing, batch_size=500):
            invoice.total_cents = sum(line.cents for line in invoice.lines)


def seed(session: Session, invoices: int) -> None:
    """Invoices without totals, three lines each (only into an empty table)."""
    if session.scalar(select(func.count()).select_from(Invoice)):
        return
    for n in range(invoices):
        session.add(Invoice(lines=[InvoiceLine(cents=100 * n + k) for k in range(3)]))
    session.commit()


def start_or_continue(session: Session) -> BackfillInvoiceTotals:
    """The ongoing backfill, or a new one: running the script again continues the first."""
    ongoing = session.scalars(
        select(BackfillInvoiceTotals).where(
            BackfillInvoiceTotals.state.in_(["ready", "performing"])
        )
    ).first()
    if ongoing is not None:
        return ongoing
    workflow = BackfillInvoiceTotals.create(session, hero=None)
    session.commit()
    return workflow


def missing_totals(session: Session) -> int:
    return session.scalar(select(func.count()).where(Invoice.total_cents.is_(None))) or 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="sqlite:///backfill.db")
    parser.add_argument("--invoices", type=int, default=2000)
    args = parser.parse_args(argv)

    engine: Engine = geneva_drive.create_engine(args.database_url)
    geneva_drive.install(engine)  # geneva-drive's tables (its own migrations)
    Base.metadata.create_all(engine)  # the application's
    geneva_drive.configure(engine=engine)

    with Session(engine) as session:
        seed(session, args.invoices)
        workflow = start_or_continue(session)
        print(f"backfill workflow {workflow.id}: {missing_totals(session)} invoices to fill")
        workflow_id = workflow.id

    def done() -> bool:
        with Session(engine) as session:
            found = session.get(Workflow, workflow_id)
            return found is None or found.state in ("finished", "canceled", "paused")

    # The database worker, in this process, until the backfill is over (Ctrl-C stops it at
    # the next checkpoint; run the script again to go on).
    Worker(concurrency=1, poll_interval=0.2).run(until=done)

    with Session(engine) as session:
        state = session.get(Workflow, workflow_id).state
        print(f"backfill workflow {workflow_id}: {state}, {missing_totals(session)} invoices left")
    engine.dispose()


if __name__ == "__main__":
    main()

"""The order service's own tables: orders, and the stock they reserve."""

from __future__ import annotations

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

# What a fresh database holds, so the example can be tried at once.
SHELVES = {"widget": 100, "gadget": 5}


class Base(DeclarativeBase):
    pass


# Not "Order": a workflow stores its hero's type as the bare class name (hero_type), so it must
# be the only mapped class of that name in the process — and geneva-drive's test suite, which
# runs this example, has an Order of its own.
class ShopOrder(Base):
    __tablename__ = "example_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    sku: Mapped[str] = mapped_column(String(50))
    quantity: Mapped[int]
    # new → awaiting_payment → paid → shipped; or out_of_stock, or canceled (never paid)
    status: Mapped[str] = mapped_column(String(20), default="new")
    paid_cents: Mapped[int | None]


class Stock(Base):
    __tablename__ = "example_stock"

    sku: Mapped[str] = mapped_column(String(50), primary_key=True)
    available: Mapped[int]


def stock_shelves(session: Session) -> None:
    """Put :data:`SHELVES` in an empty stock table."""
    if session.get(Stock, next(iter(SHELVES))) is None:
        session.add_all(Stock(sku=sku, available=n) for sku, n in SHELVES.items())
    session.commit()

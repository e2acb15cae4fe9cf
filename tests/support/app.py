"""A tiny application schema that test workflows use as heroes (its own MetaData)."""

from __future__ import annotations

import uuid

from sqlalchemy import ForeignKey, String, Uuid
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class AppBase(DeclarativeBase):
    pass


class Order(AppBase):
    """Integer primary key."""

    __tablename__ = "app_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(String(50), default="new")
    counter: Mapped[int] = mapped_column(default=0)
    canceled: Mapped[bool] = mapped_column(default=False)


class Account(AppBase):
    """String primary key."""

    __tablename__ = "app_accounts"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    email: Mapped[str] = mapped_column(String(100), default="")


class Device(AppBase):
    """UUID primary key."""

    __tablename__ = "app_devices"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    label: Mapped[str] = mapped_column(String(50), default="")


class AuditEntry(AppBase):
    """Rows steps write, to prove a step's writes commit (or roll back) with its outcome."""

    __tablename__ = "app_audit"

    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int | None] = mapped_column(ForeignKey("app_orders.id"), nullable=True)
    note: Mapped[str] = mapped_column(String(200))

"""The shop's own table. Imports nothing of Celery, so tests and scripts can read it without
configuring anything."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "example_celery_users"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200))
    welcomed_at: Mapped[datetime | None]
    nudged_at: Mapped[datetime | None]

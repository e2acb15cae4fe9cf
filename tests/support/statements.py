"""Watching the statements an engine sends (a listener, so every statement takes SQLAlchemy's
path: see ``geneva_drive.direct``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event


@contextmanager
def first_words(engine: Any) -> Iterator[list[str]]:
    """The first word of every statement sent while inside, upper-cased (``UPDATE``, ``WITH``…)."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement.lstrip().split()[0].upper())

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)

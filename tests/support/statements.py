"""Watching the statements an engine sends (a listener, so every statement takes SQLAlchemy's
path: see ``geneva_drive.direct``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

# A data-modifying statement or CTE ("FOR UPDATE" is a read's lock, not a write).
WRITES = re.compile(r"\b(INSERT INTO|UPDATE \w+( AS \w+)? SET|DELETE FROM)\b", re.IGNORECASE)


def first_word(statement: str) -> str:
    """``statement``'s first word, upper-cased; ``SELECT`` for a ``WITH`` that writes nothing
    (PostgreSQL's claim, for one, begins with a CTE of the first due rows)."""
    word = statement.lstrip().split()[0].upper()
    return "SELECT" if word == "WITH" and not WRITES.search(statement) else word


@contextmanager
def first_words(engine: Any) -> Iterator[list[str]]:
    """The first word of every statement sent while inside (see :func:`first_word`)."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(first_word(statement))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)

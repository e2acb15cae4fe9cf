"""Fixtures for the async API's tests: the same fresh database reached by an async engine,
through SQLite's aiosqlite, psycopg's async mode and MariaDB's aiomysql."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa

import geneva_drive

T = TypeVar("T")

ASYNC_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+psycopg",
    "mariadb": "mariadb+aiomysql",
}


def async_url(url: str) -> sa.URL:
    """``url`` with the async driver of its database (the same database)."""
    parsed = sa.make_url(url)
    return parsed.set(drivername=ASYNC_DRIVERS[parsed.get_backend_name()])


@pytest.fixture
def async_engine(installed_database_url: str) -> Iterator[Any]:
    """An async engine on the database of ``engine``/``gd`` (made with create_async_engine).

    No pool: each test's ``asyncio.run`` is a new event loop, and an async driver's connection
    belongs to the loop that opened it.
    """
    engine = geneva_drive.create_async_engine(
        async_url(installed_database_url), poolclass=sa.NullPool
    )
    yield engine
    run(engine.dispose())


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Await ``coroutine`` from a sync test (pytest-asyncio is not a dependency)."""
    return asyncio.run(coroutine)

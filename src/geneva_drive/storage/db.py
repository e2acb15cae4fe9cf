"""Engines and sessions: an engine prepared for the database it talks to (what differs per
database lives in ``storage.dialects``), and the factory of geneva-drive's own sessions."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import sqlalchemy
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from geneva_drive.core.settings import SESSION_SETTINGS, Settings
from geneva_drive.storage.dialects import dialect_named, dialect_of

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine


def create_engine(url: str | sqlalchemy.URL, **kwargs: Any) -> Engine:
    """``sqlalchemy.create_engine`` plus the settings geneva-drive needs for ``url``'s dialect.

    MySQL/MariaDB: READ COMMITTED for every connection (unless ``isolation_level`` is given)
    and the utf8mb4 connection character set (unless the URL names a ``charset``). SQLite: WAL
    and a busy timeout (see :func:`prepare_engine`).
    """
    url = sqlalchemy.make_url(url)
    engine = dialect_named(url.get_backend_name()).create_engine(url, **kwargs)
    prepare_engine(engine)
    return engine


def create_async_engine(url: str | sqlalchemy.URL, **kwargs: Any) -> AsyncEngine:
    """``sqlalchemy.ext.asyncio.create_async_engine`` set up as :func:`create_engine` sets up
    a sync one, for the async API (``acreate``, ``asignal``…) on an ``AsyncSession``:
    ``sqlite+aiosqlite://…``, ``postgresql+psycopg://…`` or ``mariadb+aiomysql://…``.

    The same engine arguments (MySQL/MariaDB: READ COMMITTED, utf8mb4) and the same listeners,
    on the engine's ``sync_engine`` (SQLite: WAL, the busy timeout, our BEGIN).
    """
    from sqlalchemy.ext.asyncio import create_async_engine as create

    url = sqlalchemy.make_url(url)
    url, kwargs = dialect_named(url.get_backend_name()).engine_arguments(url, kwargs)
    engine = create(url, **kwargs)
    prepare_engine(engine.sync_engine)
    return engine


def prepare_engine(engine: Engine) -> Engine:
    """Make an application's engine safe for concurrent workflows. Idempotent.

    SQLite has no row locks: geneva-drive's own transactions begin ``BEGIN IMMEDIATE`` (its
    stand-in for ``SELECT … FOR UPDATE``), the application's keep a deferred ``BEGIN``, and
    WAL keeps plain readers unblocked (``storage.dialects.sqlite``). Other databases: as is.
    """
    return dialect_of(engine).prepare(engine)


def immediate_transactions(engine: Engine) -> Engine:
    """On SQLite, ``engine`` with every transaction beginning ``BEGIN IMMEDIATE``; elsewhere
    ``engine`` itself.

    For an application's sessions that read and then write under concurrency — a webhook
    handler that loads the order and its workflow, then calls ``signal()``. SQLite begins a
    transaction deferred and fixes its snapshot at the first read; if another connection
    commits before the first write, that write fails at once with "database is locked" and
    no busy timeout helps. Beginning with the write lock makes such transactions queue on the
    busy timeout instead (read-only ones too: give them a session on the plain engine).
    """
    return dialect_of(engine).immediate_transactions(engine)


def engine_for_workers(engine: Engine) -> Engine:
    """The engine geneva-drive's own sessions use.

    On SQLite, transactions BEGIN IMMEDIATE. On MySQL/MariaDB they run at READ COMMITTED even
    when the application's engine defaults to another level.
    """
    return dialect_of(engine).for_workers(engine)


def async_engine_like(engine: Engine, *, pool_size: int) -> AsyncEngine:
    """An asyncio engine on ``engine``'s database, over its dialect's async driver, prepared
    like ``engine`` (its ``sync_engine`` fires the same events: SQLite's ``BEGIN IMMEDIATE``)
    and with the arguments :func:`create_async_engine` gives (MariaDB: READ COMMITTED and
    utf8mb4 on connect), whether or not the application's engine was made by geneva-drive.

    For a worker's event loop (``runtime.async_lane``). ``pool_size`` bounds the connections
    it holds however many steps are in flight: a step waits on the loop for a free one.
    """
    from sqlalchemy.ext.asyncio import create_async_engine as create  # only where async runs

    dialect = dialect_of(engine)
    url = _async_url(engine)
    if url is None:  # pragma: no cover - every dialect names one today
        raise ValueError(f"async steps are not supported on {engine.dialect.name}")
    url, kwargs = dialect.engine_arguments(url, {"pool_size": pool_size, "max_overflow": 0})
    built = create(url, **kwargs)
    prepare_engine(built.sync_engine)
    return built


def _async_url(engine: Engine) -> sqlalchemy.URL | None:
    """``engine``'s database through its dialect's async driver; None if it names none."""
    driver = dialect_of(engine).async_driver
    if driver is None:
        return None
    return engine.url.set(drivername=f"{engine.url.get_backend_name()}+{driver}")


# The extra that installs a module an async driver imports; the others come with ``async``.
_EXTRA_OF_MODULE = {"psycopg": "postgres", "pymysql": "mysql"}


def missing_async_driver(engine: Engine) -> tuple[str, str, str] | None:
    """Why :func:`async_engine_like` cannot work here: (the async driver, the module that
    does not import, the extra that installs it) — or None when it can."""
    url = _async_url(engine)
    if url is None:  # pragma: no cover - every dialect names one today
        return None
    driver = url.get_driver_name()
    try:
        importlib.import_module("greenlet")  # SQLAlchemy's asyncio runs on it
        url.get_dialect(_is_async=True).import_dbapi()
    except ModuleNotFoundError as error:
        module = (error.name or "?").partition(".")[0]
        return driver, module, _EXTRA_OF_MODULE.get(module, "async")
    return None


def session_factory(config: Settings) -> sessionmaker[Session]:
    """The factory of geneva-drive's own sessions for ``config``, made once per ``Settings``.

    Each session remembers the settings it was made from, so what runs in it (the step's own
    verbs and signals, the wake-ups after commit) uses these settings' backend and clock rather
    than the process-wide ones (see ``settings_of``).
    """
    factory: sessionmaker[Session] | None = config.__dict__.get("_factory")
    if factory is None:
        factory = sessionmaker(
            bind=engine_for_workers(config.require_engine()),
            expire_on_commit=False,
            info={SESSION_SETTINGS: config},
        )
        object.__setattr__(config, "_factory", factory)  # cache on the frozen dataclass
    return factory

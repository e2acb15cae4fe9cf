"""``--database-url``: the engine for it, or a usage error that says what to write instead.

The common mistakes, each answered with the URL to write and the extra to install:

- ``postgres://…`` (Heroku's and many tools' spelling), which SQLAlchemy does not know;
- ``postgresql://…`` and ``mysql://…``, which mean drivers geneva-drive does not install
  (psycopg2, mysqlclient): its extras bring psycopg 3 and PyMySQL;
- the right URL without its extra installed.

And SQLite: only ``migrate`` may create a database file. Anywhere else a relative path run
from the wrong directory used to leave an empty database there and fail on its schema; now
the command stops, naming the absolute file it looked for.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from sqlalchemy import URL, Engine, make_url
from sqlalchemy.exc import NoSuchModuleError

from geneva_drive.storage.db import create_engine

# backend → (the drivername geneva-drive's extra supports, the extra, its driver module)
_SUPPORTED = {
    "postgresql": ("postgresql+psycopg", "postgres", "psycopg"),
    "mysql": ("mysql+pymysql", "mysql", "pymysql"),
    "mariadb": ("mariadb+pymysql", "mysql", "pymysql"),
}
_MISSPELLED = {"postgres": "postgresql", "pgsql": "postgresql", "psql": "postgresql"}


class DatabaseUrlError(Exception):
    """A ``--database-url`` that cannot work as written (a usage mistake: exit code 2); the
    message says what to write or do instead."""


def open_engine(url: str, *, may_create: bool = False, **kwargs: Any) -> Engine:
    """``create_engine(url)``, or :class:`DatabaseUrlError` with the fix. A SQLite file that
    does not exist is refused unless ``may_create`` (``migrate``)."""
    parsed = make_url(url)  # an unparsable URL raises ArgumentError: its own message
    if not may_create:
        _require_sqlite_file(parsed)
    try:
        return create_engine(url, **kwargs)
    except NoSuchModuleError as error:
        raise DatabaseUrlError(_unknown_scheme(parsed, error)) from error
    except ModuleNotFoundError as error:
        hint = _missing_driver(parsed, error)
        if hint is None:
            raise
        raise DatabaseUrlError(hint) from error


def _shown(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def _unknown_scheme(url: URL, error: NoSuchModuleError) -> str:
    backend, _, driver = url.drivername.partition("+")
    known = _MISSPELLED.get(backend)
    if known is None:
        return (
            f"--database-url {_shown(url)}: SQLAlchemy has no database {url.drivername!r} "
            f"({error}); e.g. postgresql+psycopg://user@host/db, mysql+pymysql://user@host/db "
            "or sqlite:///app.db"
        )
    drivername, extra, module = _SUPPORTED[known]
    fixed = url.set(drivername=f"{known}+{driver}" if driver else drivername)
    install = "" if _installed(module) else f" (its driver: pip install 'geneva-drive[{extra}]')"
    return (
        f"--database-url {_shown(url)}: SQLAlchemy calls this database {known!r}, not "
        f"{backend!r}; write {_shown(fixed)}{install}"
    )


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _missing_driver(url: URL, error: ModuleNotFoundError) -> str | None:
    supported = _SUPPORTED.get(url.get_backend_name())
    if supported is None or not error.name:
        return None
    drivername, extra, module = supported
    missing = error.name.partition(".")[0]
    steps = [] if _installed(module) else [f"pip install 'geneva-drive[{extra}]'"]
    if url.drivername != drivername:
        steps.append(f"write {_shown(url.set(drivername=drivername))}")
    fix = " and ".join(steps)
    if missing == module:
        return f"--database-url {_shown(url)}: its driver {module} is not installed; {fix}"
    return (
        f"--database-url {_shown(url)}: this URL means the driver {missing}, which is not "
        f"installed; geneva-drive's is {module}: {fix}"
    )


def _require_sqlite_file(url: URL) -> None:
    if url.get_backend_name() != "sqlite":
        return
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return  # in memory, or a URI filename (uri=true): SQLite's own rules apply
    path = os.path.abspath(database)
    if os.path.exists(path):
        return
    relative = "" if os.path.isabs(database) else f" (a relative path is taken from {os.getcwd()})"
    raise DatabaseUrlError(
        f"--database-url {_shown(url)}: no SQLite database at {path}{relative}; only "
        "`geneva-drive migrate` creates one — run it first, or point at the existing file "
        "(sqlite:////absolute/path.db)"
    )

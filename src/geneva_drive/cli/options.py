"""What the command modules share: the Typer app, its common options, ``--app`` loading.

:mod:`geneva_drive.cli.main`, :mod:`geneva_drive.cli.ops` and :mod:`geneva_drive.cli.dashboard`
all import from here, and this module imports none of them, so there is no import circle inside
the package. It imports Typer and nothing heavy — SQLAlchemy and the library's engine are
imported by :func:`engine` and :func:`load_app` when a command runs — and an optional extra
(Celery, the dashboard's Starlette/uvicorn/Jinja2) is imported by the command that needs it,
when it runs, through :func:`import_extra`.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from geneva_drive.cli.values import seconds

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from geneva_drive.core.settings import Settings

PROG = "geneva-drive"
TRACEBACK_FLAG = "--traceback"
APP_ENVVAR = "GENEVA_DRIVE_APP"  # --app's, as GENEVA_DRIVE_DATABASE_URL is --database-url's

# Plain help (no boxes): with rich, every flag showed a "<bool>" metavar and errors a panel.
app = typer.Typer(
    help="Durable multi-step workflows in your own SQL database.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)

DatabaseUrl = Annotated[
    str,
    typer.Option(
        "--database-url",
        envvar="GENEVA_DRIVE_DATABASE_URL",
        help="SQLAlchemy URL, e.g. postgresql+psycopg://user@host/db or sqlite:///app.db",
    ),
]
AppModules = Annotated[
    list[str] | None,
    typer.Option(
        "--app",
        metavar="MODULE[:ATTR]",
        envvar=APP_ENVVAR,
        help="Module defining your workflows, imported first (repeatable; in "
        f"{APP_ENVVAR}, separated by spaces); module:attr also checks that the attribute "
        "exists.",
    ),
]
WaitForDatabase = Annotated[
    float,
    typer.Option(
        metavar="SECONDS",
        callback=seconds(above_zero=False, example="30"),
        help="How long to keep retrying an unreachable database at startup before giving up.",
    ),
]


# Click's exceptions, wherever this Typer takes them from (Typer 0.29 ships its own copy of
# Click; earlier versions use the click package).
_CLICK: Any = sys.modules[typer.BadParameter.__module__]
_NO_ARGS_IS_HELP: Any = getattr(_CLICK, "NoArgsIsHelpError", ())


class AppImportError(Exception):
    """An ``--app`` reference that does not import; the message names it and the fix."""


class MissingExtra(Exception):
    """A command needs an optional extra that is not installed; the message names the extra
    and how to install it (exit code 2, a setup mistake)."""


def import_extra(module: str, *, needs: str, extra: str, provides: tuple[str, ...]) -> ModuleType:
    """Import ``module`` for the command running; if that fails because one of the
    ``provides`` distributions (the extra's top-level modules) is not installed, raise
    :class:`MissingExtra` naming the extra. Any other import error propagates as it is."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        missing = _missing_module(error, provides)
        if missing is None:
            raise
        raise MissingExtra(
            f"this command needs {needs}: pip install 'geneva-drive[{extra}]' "
            f"(no module named {missing!r})"
        ) from error


def _missing_module(error: ImportError, provides: tuple[str, ...]) -> str | None:
    """The top-level module of ``provides`` whose absence caused ``error``: the error itself
    or one it was raised from (geneva_drive.contrib.celery words its own ImportError)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ModuleNotFoundError) and seen.name:
            top = seen.name.partition(".")[0]
            if top in provides:
                return top
        seen = seen.__cause__ or seen.__context__
    return None


def engine(
    url: str, *, worker_threads: int | None = None, worker: bool = False, may_create: bool = False
) -> Engine:
    """The engine for ``url`` (a mistaken URL or a missing SQLite file, unless ``may_create``:
    :class:`~geneva_drive.cli.database_url.DatabaseUrlError`). For a worker (of
    ``worker_threads`` step threads, None: the database's default), a pool that keeps a
    connection open for each thread, its heartbeat and LISTEN — SQLAlchemy's default keeps 5
    and opens more for a moment only."""
    from sqlalchemy.pool import QueuePool

    from geneva_drive.cli.database_url import open_engine
    from geneva_drive.runtime.pool import connections_needed
    from geneva_drive.storage.dialects import dialect_of

    built = open_engine(url, may_create=may_create)
    if not worker or not isinstance(built.pool, QueuePool):
        return built
    dialect = dialect_of(built)
    needed = connections_needed(
        worker_threads or dialect.default_concurrency, listen=dialect.notifies
    )
    if built.pool.size() >= needed:
        return built
    built.dispose()
    return open_engine(url, pool_size=needed)


def import_app(spec: str) -> Any:
    """Import ``module`` or ``module:attr`` (the forms every ``--app`` takes); returns the
    module or the attribute."""
    module_name, _, attribute = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # --app modules are named relative to where you run it
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is None or not module_name.startswith(error.name):
            raise _import_failed(spec, error) from error
        raise AppImportError(
            f"--app {spec!r}: no module named {error.name!r} (from {os.getcwd()}); run the "
            "command from your project's directory, or check the module path"
        ) from error
    except Exception as error:
        raise _import_failed(spec, error) from error
    for part in attribute.split(".") if attribute else ():
        if not hasattr(target, part):
            raise AppImportError(
                f"--app {spec!r}: module {module_name!r} has no attribute {attribute!r}; "
                "name one as module:attribute, or pass just the module"
            )
        target = getattr(target, part)
    return target


def _import_failed(spec: str, error: Exception) -> AppImportError:
    return AppImportError(
        f"--app {spec!r}: importing it raised {type(error).__name__}: {error}; run with "
        f"{TRACEBACK_FLAG} to see where"
    )


def setup_logging(log_format: str = "text", log_level: str = "INFO") -> None:
    from geneva_drive.runtime.logs import setup

    setup(log_format, log_level)


def load_app(
    database_url: str,
    modules: list[str] | None,
    *,
    worker: bool = False,
    worker_threads: int | None = None,
    log_format: str = "text",
    log_level: str = "INFO",
    trace_claims: bool = False,
) -> Settings:
    """The prelude of every long-running command: logging, the app's workflows, the engine
    (for a worker: sized for its threads, see :func:`engine`). ``trace_claims`` turns claim
    spans on; off, the app's own ``configure(trace_claims=…)`` stands."""
    from geneva_drive.runtime.configure import configure

    setup_logging(log_format, log_level)
    for spec in modules or []:
        import_app(spec)
    changes = {"trace_claims": True} if trace_claims else {}
    return configure(
        engine=engine(database_url, worker=worker, worker_threads=worker_threads), **changes
    )

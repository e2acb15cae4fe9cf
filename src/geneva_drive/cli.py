"""The ``geneva-drive`` command: a thin layer over the library's Python functions.

An error is one line on stderr that says what failed and how to fix it; ``--traceback`` (in
any position) shows the full traceback instead. Exit codes: 2 for a usage or setup mistake
(a bad option, an ``--app`` that does not import, no workflows loaded), 1 for anything else
(the database unreachable or at another schema revision, a failed run).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from . import __version__
from . import housekeeping as hk
from .config import Settings, configure
from .contrib import celery as gd_celery
from .engine import create_engine
from .errors import GenevaDriveError, StepConfigurationError
from .loaded import NoWorkflowsLoaded
from .migrate import current_revision, install
from .startup import DEFAULT_WAIT_SECONDS, StartupError, check_database, first_line
from .startup import wait_for_database as wait_for
from .worker import Worker

PROG = "geneva-drive"
TRACEBACK_FLAG = "--traceback"

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
        help="Module defining your workflows, imported first (repeatable); module:attr also "
        "checks that the attribute exists.",
    ),
]
WaitForDatabase = Annotated[
    float,
    typer.Option(
        metavar="SECONDS",
        help="How long to keep retrying an unreachable database at startup before giving up.",
    ),
]


# Click's exceptions, wherever this Typer takes them from (Typer 0.29 ships its own copy of
# Click; earlier versions use the click package).
_CLICK: Any = sys.modules[typer.BadParameter.__module__]
_NO_ARGS_IS_HELP: Any = getattr(_CLICK, "NoArgsIsHelpError", ())


class AppImportError(Exception):
    """An ``--app`` reference that does not import; the message names it and the fix."""


def _version(value: bool) -> None:
    if value:
        typer.echo(f"{PROG} {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
    traceback: Annotated[
        bool,
        typer.Option(TRACEBACK_FLAG, help="On an error, show the full traceback (any position)."),
    ] = False,
) -> None:
    """Durable multi-step workflows in your own SQL database."""


def _engine(url: str):  # type: ignore[no-untyped-def]
    return create_engine(url)


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


def _logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # the startup revision check


def _load_app(database_url: str, modules: list[str] | None) -> Settings:
    """The prelude of every long-running command: logging, the app's workflows, the engine."""
    _logging()
    for spec in modules or []:
        import_app(spec)
    return configure(engine=_engine(database_url))


@app.command()
def migrate(database_url: DatabaseUrl, wait_for_database: WaitForDatabase = 0.0) -> None:
    """Create or upgrade geneva-drive's tables (its own Alembic version table)."""
    engine = _engine(database_url)
    wait_for(engine, wait=wait_for_database)
    install(engine)
    typer.echo(f"geneva-drive schema at revision {current_revision(engine)}")


@app.command()
def worker(
    database_url: DatabaseUrl,
    app_module: AppModules = None,
    queues: Annotated[
        str | None, typer.Option(help="Comma-separated queues to serve (default: all).")
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option(help="Worker threads (default: 4; 1 on SQLite).")
    ] = None,
    poll_interval: Annotated[float, typer.Option(help="Seconds between idle polls.")] = 1.0,
    lease: Annotated[
        float,
        typer.Option(
            help="Seconds a claimed step stays claimed without a heartbeat (heartbeats every "
            "third of it); a dead worker's step is recovered by another worker after this."
        ),
    ] = 30.0,
    grace_period: Annotated[
        float,
        typer.Option(help="Seconds running steps get to finish after SIGTERM/SIGINT."),
    ] = 30.0,
    housekeeping_interval: Annotated[
        float | None,
        typer.Option(
            help="Also run housekeeping every N seconds (one worker at a time). Default: off."
        ),
    ] = None,
    wait_for_database: WaitForDatabase = DEFAULT_WAIT_SECONDS,
) -> None:
    """Run steps from the database until SIGINT/SIGTERM (a second signal exits at once).

    It claims only steps of the workflow classes --app loaded, and refuses to start with none.
    """
    config = _load_app(database_url, app_module)
    running = Worker(
        config=config,
        queues=[q.strip() for q in queues.split(",") if q.strip()] if queues else None,
        concurrency=concurrency,
        poll_interval=poll_interval,
        lease=lease,
        grace_period=grace_period,
        housekeeping_interval=housekeeping_interval or None,
        startup_wait=wait_for_database,
    )
    running.run()  # checks the database and the loaded classes first
    if running.abandoned:
        raise typer.Exit(1)  # steps were cut off; their leases were released for recovery


@app.command()
def housekeeping(
    database_url: DatabaseUrl,
    app_module: AppModules = None,
    recover_scheduled: Annotated[
        bool | None,
        typer.Option(
            "--recover-scheduled/--no-recover-scheduled",
            help="Recover overdue scheduled steps (default: only with an external backend).",
        ),
    ] = None,
    wait_for_database: WaitForDatabase = DEFAULT_WAIT_SECONDS,
) -> None:
    """Delete old finished workflows, recover lost steps, publish gauges; prints the counts."""

    config = _load_app(database_url, app_module)
    check_database(config.require_engine(), wait=wait_for_database)
    result = hk.run_exclusive(config, recover_scheduled=recover_scheduled)
    if result is None:
        typer.echo("housekeeping is already running elsewhere; nothing done", err=True)
        return
    typer.echo(json.dumps(result, sort_keys=True))


@app.command()
def dispatch(
    database_url: DatabaseUrl,
    celery_app: Annotated[
        str,
        typer.Option(
            "--app",
            metavar="MODULE[:ATTR]",
            help="Your Celery app as module:attribute, or a module with an `app` attribute "
            "(the module imports your workflows).",
        ),
    ],
    interval: Annotated[
        float, typer.Option(help="Seconds between passes; keep it well below the ETA horizon.")
    ] = 10.0,
    once: Annotated[bool, typer.Option("--once", help="One pass: print the count, exit.")] = False,
    wait_for_database: WaitForDatabase = DEFAULT_WAIT_SECONDS,
) -> None:
    """Celery: send steps whose wait was beyond the ETA horizon, and re-send lost messages."""
    _logging()
    import_app(celery_app)  # the same errors as every --app; load_backend finds the app in it
    try:
        backend = gd_celery.load_backend(celery_app)
    except StepConfigurationError as error:
        raise AppImportError(str(error)) from error
    config = configure(engine=_engine(database_url), backend=backend)
    check_database(config.require_engine(), wait=wait_for_database)
    if once:
        typer.echo(f"dispatched {gd_celery.dispatch(config)}")
        return
    gd_celery.run_dispatcher(interval=interval, config=config)


@app.command()
def demo(
    path: Annotated[
        Path, typer.Option(help="SQLite file to create (replaced if it exists).")
    ] = Path("geneva_drive_demo.db"),
) -> None:
    """Run example workflows on a local SQLite file with the real worker, then show timelines."""
    # Imported here, not at the top: importing the demo defines its workflow classes, and a
    # worker started without --app must see no workflows loaded.
    from .demo import run_demo

    run_demo(path)


# list, show, the verbs, stats and check: commands of this app, defined in ops_cli.py.
from . import ops_cli as _ops_cli  # noqa: E402, F401 - after `app` and the options it reuses

# The dashboard's command lives in its package (it imports Starlette only when it runs).
from .dashboard.command import dashboard as _dashboard  # noqa: E402

app.command()(_dashboard)


# -- errors: one line each -------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    """The console script: run a command, turning any error into one line and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    show_traceback = TRACEBACK_FLAG in args
    args = [a for a in args if a != TRACEBACK_FLAG]
    command = next((a for a in args if not a.startswith("-")), None)
    where = f"{PROG} {command}" if command else PROG
    try:
        code = app(args=args, prog_name=PROG, standalone_mode=False)
    except _NO_ARGS_IS_HELP as error:
        error.show()
        code = error.exit_code
    except _CLICK.ClickException as error:
        typer.echo(f"{where}: error: {_usage_message(error)}", err=True)
        code = error.exit_code
    except typer.Abort:
        code = 1
    except Exception as error:
        if show_traceback:
            raise
        message, code = describe(error)
        typer.echo(f"{where}: error: {message}", err=True)
    sys.exit(code if isinstance(code, int) else 0)


def _usage_message(error: Any) -> str:
    message = str(error.format_message())
    if "--database-url" in message:
        message += " Pass --database-url or set GENEVA_DRIVE_DATABASE_URL."
    ctx = getattr(error, "ctx", None)
    if ctx is not None:
        message += f" (see {ctx.command_path} --help)"
    return message


def describe(error: Exception) -> tuple[str, int]:
    """The one line and the exit code for an error that ended a command."""
    from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

    if isinstance(error, NoWorkflowsLoaded | AppImportError):
        return str(error), 2
    if isinstance(error, ArgumentError | NoSuchModuleError):
        return f"--database-url: {error}", 2
    if isinstance(error, StartupError | GenevaDriveError):
        return str(error), 1
    if isinstance(error, DBAPIError):
        return f"the database said: {first_line(error)}", 1
    if isinstance(error, ModuleNotFoundError):
        return (
            f"{error}; install the package that provides it (a database driver: e.g. "
            "pip install 'geneva-drive[postgres]' for postgresql+psycopg://)",
            1,
        )
    return f"{type(error).__name__}: {error} (run with {TRACEBACK_FLAG} to see where)", 1


if __name__ == "__main__":
    main()

"""The ``geneva-drive`` command: a thin layer over the library's Python functions.

Importing this module imports Typer and registers the commands, nothing more: each command
imports what it uses when it runs (``migrate`` Alembic, ``worker`` the engine, ``list`` the
admin API and Rich), so ``--version`` and ``--help`` start at once. A command that needs an
optional extra (``dispatch``: Celery; ``dashboard``: Starlette, uvicorn, Jinja2) imports it
when it runs, and without it exits with code 2 and the ``pip install 'geneva-drive[...]'``
that fixes it. The
options and helpers several command modules share are in :mod:`geneva_drive.cli.options`.

An error is one line on stderr that says what failed and how to fix it; ``--traceback`` (in
any position) shows the full traceback instead. Exit codes: 2 for a usage or setup mistake
(a bad option or option value, an ``--app`` that does not import, no workflows loaded, an
optional extra the command needs not installed, a ``--database-url`` that cannot work as
written or names a SQLite file that does not exist), 1 for anything else
(the database unreachable or at another schema revision, a failed run).
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from geneva_drive import __version__
from geneva_drive.cli.options import (
    _CLICK,
    _NO_ARGS_IS_HELP,
    APP_ENVVAR,
    PROG,
    TRACEBACK_FLAG,
    AppImportError,
    AppModules,
    DatabaseUrl,
    MissingExtra,
    WaitForDatabase,
    app,
    engine,
    import_app,
    import_extra,
    load_app,
    setup_logging,
)
from geneva_drive.cli.values import (
    as_usage_error,
    queue_names,
    seconds,
    split_queues,
    whole,
)
from geneva_drive.cli.values import log_format as log_format_value
from geneva_drive.cli.values import log_level as log_level_value
from geneva_drive.core.errors import AsyncDriverMissing, GenevaDriveError, StepConfigurationError
from geneva_drive.runtime.worker_options import DEFAULT_WAIT_SECONDS, WorkerOptionError

# ``app`` here has every command registered (the tests drive it); the shared options are
# cli/options.py's.
__all__ = ["app", "describe", "main"]


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


@app.command()
def migrate(database_url: DatabaseUrl, wait_for_database: WaitForDatabase = 0.0) -> None:
    """Create or upgrade geneva-drive's tables (its own Alembic version table)."""
    from geneva_drive.runtime.startup import wait_for_database as wait_for
    from geneva_drive.storage.migrate import current_revision, install

    db = engine(database_url, may_create=True)  # the one command that may create a SQLite file
    wait_for(db, wait=wait_for_database)
    install(db)
    typer.echo(f"geneva-drive schema at revision {current_revision(db)}")


@app.command()
def worker(
    database_url: DatabaseUrl,
    app_module: AppModules = None,
    queues: Annotated[
        str | None,
        typer.Option(callback=queue_names, help="Comma-separated queues to serve (default: all)."),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            callback=whole(minimum=1, example="4"), help="Worker threads (default: 4; 1 on SQLite)."
        ),
    ] = None,
    poll_interval: Annotated[
        float,
        typer.Option(
            callback=seconds(above_zero=True, example="1"), help="Seconds between idle polls."
        ),
    ] = 1.0,
    lease: Annotated[
        float,
        typer.Option(
            callback=seconds(above_zero=True, example="30"),
            help="Seconds a claimed step stays claimed without a heartbeat (heartbeats every "
            "third of it); a dead worker's step is recovered by another worker after this.",
        ),
    ] = 30.0,
    grace_period: Annotated[
        float,
        typer.Option(
            callback=seconds(above_zero=False, example="30"),
            help="Seconds running steps get to finish after SIGTERM/SIGINT.",
        ),
    ] = 30.0,
    housekeeping_interval: Annotated[
        float | None,
        typer.Option(
            callback=seconds(above_zero=True, example="300"),
            help="Also run housekeeping every N seconds (one worker at a time). Default: off.",
        ),
    ] = None,
    heartbeat_interval: Annotated[
        float | None,
        typer.Option(
            callback=seconds(above_zero=True, example="10"),
            help="Seconds between lease renewals (default: a third of --lease; at most that).",
        ),
    ] = None,
    wait_for_database: WaitForDatabase = DEFAULT_WAIT_SECONDS,
    async_concurrency: Annotated[
        int,
        typer.Option(
            callback=whole(minimum=0, example="100"),
            help="async def steps run at once on the worker's event loop (classes with an "
            "async step run there; sync ones keep the threads).",
        ),
    ] = 100,
    log_format: Annotated[
        str,
        typer.Option(
            callback=log_format_value,
            metavar="text|json",
            help="text, or json: one object per line, with the workflow and step as fields.",
        ),
    ] = "text",
    log_level: Annotated[
        str,
        typer.Option(
            callback=log_level_value,
            metavar="LEVEL",
            help="Log records from this level up: DEBUG, INFO, WARNING, ERROR or CRITICAL.",
        ),
    ] = "INFO",
    metrics_port: Annotated[
        int | None,
        typer.Option(
            callback=whole(minimum=1, maximum=65535, example="9464"),
            help="Serve Prometheus metrics on http://ADDR:PORT/metrics (needs the metrics "
            "extra). Default: off.",
        ),
    ] = None,
    metrics_addr: Annotated[
        str, typer.Option(help="The address --metrics-port listens on.")
    ] = "127.0.0.1",
    trace_claims: Annotated[
        bool,
        typer.Option(
            "--trace-claims",
            help="Also make an OpenTelemetry span per claim (with tracing set up by --app). "
            "Default: off — an idle worker's polls would outnumber its steps' spans.",
        ),
    ] = False,
) -> None:
    """Run steps from the database until SIGINT/SIGTERM (a second signal exits at once).

    It claims only steps of the workflow classes --app loaded, and refuses to start with none.
    Its connection pool is sized for --concurrency (step threads, heartbeat, LISTEN).
    """
    from geneva_drive.runtime.worker import Worker

    # Before anything connects: a port in use is a usage error, found at once.
    metrics = None if metrics_port is None else serve_metrics(metrics_port, metrics_addr)
    config = load_app(
        database_url,
        app_module,
        worker=True,
        worker_threads=concurrency,
        log_format=log_format,
        log_level=log_level,
        trace_claims=trace_claims,
    )
    try:
        running = Worker(
            config=config,
            queues=split_queues(queues),
            concurrency=concurrency,
            poll_interval=poll_interval,
            lease=lease,
            grace_period=grace_period,
            housekeeping_interval=housekeeping_interval,
            heartbeat_interval=heartbeat_interval,
            startup_wait=wait_for_database,
            async_concurrency=async_concurrency,
        )
    except WorkerOptionError as error:  # options that are wrong together (heartbeat vs lease)
        raise as_usage_error(error) from error
    if metrics is not None:
        metrics.install(running=running.running)
    running.run()  # checks the database and the loaded classes first
    if running.abandoned:
        raise typer.Exit(1)  # steps were cut off; their leases were released for recovery


def serve_metrics(port: int, addr: str) -> Any:
    """Serve /metrics on ``addr:port``; returns ``runtime.metrics`` to install the collectors."""
    metrics = import_extra(
        "geneva_drive.runtime.metrics",
        needs="Prometheus metrics",
        extra="metrics",
        provides=("prometheus_client",),
    )
    try:
        metrics.serve(port, addr)
    except OSError as error:
        raise typer.BadParameter(
            f"cannot serve metrics on {addr}:{port}: {error.strerror or error}; pick a free "
            "port (or stop what listens there)",
            param_hint="'--metrics-port'",
        ) from error
    return metrics


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
    from geneva_drive.runtime import housekeeping as hk
    from geneva_drive.runtime.startup import check_database

    config = load_app(database_url, app_module)
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
            envvar=APP_ENVVAR,
            help="Your Celery app as module:attribute, or a module with an `app` attribute "
            "(the module imports your workflows).",
        ),
    ],
    interval: Annotated[
        float,
        typer.Option(
            callback=seconds(above_zero=True, example="10"),
            help="Seconds between passes; keep it well below the ETA horizon.",
        ),
    ] = 10.0,
    once: Annotated[bool, typer.Option("--once", help="One pass: print the count, exit.")] = False,
    wait_for_database: WaitForDatabase = DEFAULT_WAIT_SECONDS,
) -> None:
    """Celery: send steps whose wait was beyond the ETA horizon, and re-send lost messages."""
    # First of all: without Celery nothing here runs (and --help, above, needs none).
    import_extra(
        "geneva_drive.contrib.celery",
        needs="Celery",
        extra="celery",
        provides=("celery", "kombu", "billiard", "vine", "redis"),
    )
    from geneva_drive.contrib import celery as gd_celery
    from geneva_drive.runtime.configure import configure
    from geneva_drive.runtime.startup import check_database

    setup_logging()
    import_app(celery_app)  # the same errors as every --app; load_backend finds the app in it
    try:
        backend = gd_celery.load_backend(celery_app)
    except StepConfigurationError as error:
        raise AppImportError(str(error)) from error
    config = configure(engine=engine(database_url), backend=backend)
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
    from geneva_drive.cli.demo import run_demo

    run_demo(path)


# list, show, the verbs, stats and check: commands of this app, defined (registered on the
# shared `app` of options.py) by importing ops.py.
# Imported last so that the commands above come first in --help.
from geneva_drive.cli import ops as _ops  # noqa: E402, F401
from geneva_drive.cli import schedules as _schedules  # noqa: E402, F401

# The dashboard's command: it imports Starlette, uvicorn and Jinja2 only when it runs.
from geneva_drive.cli.dashboard import dashboard as _dashboard  # noqa: E402

app.command()(_dashboard)


# -- errors: one line each -------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    """The console script: run a command, turning any error into one line and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    show_traceback = TRACEBACK_FLAG in args
    args = [a for a in args if a != TRACEBACK_FLAG]
    command = next((a for a in args if not a.startswith("-")), None)
    where = f"{PROG} {command}" if command else PROG
    # `--help` before the command's name shows the whole group's help: every command in it.
    group_help = command is not None and "--help" in args[: args.index(command)]
    try:
        built = command_line(None if group_help else command)
        code = built.main(args=args, prog_name=PROG, standalone_mode=False)
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


def command_line(name: str | None) -> Any:
    """The Click command that runs ``geneva-drive`` with the command ``name``: built with that
    command alone when there is one of that name (building all 17 is ~12 ms of a `list`:
    Typer reads every command's signature and evaluates its annotations), with all of them
    otherwise (``--help``, a mistyped name); its options converted without pydantic."""
    from geneva_drive.cli.conversion import convert_without_pydantic

    chosen = [info for info in app.registered_commands if _command_name(info) == name]
    if chosen:
        narrowed = copy.copy(app)
        narrowed.registered_commands = chosen
    built = typer.main.get_command(narrowed if chosen else app)
    convert_without_pydantic(built)
    return built


def _command_name(info: Any) -> str:
    """The name Typer gives a registered command (its function's name, dashed, unless named)."""
    return str(info.name or info.callback.__name__.lower().replace("_", "-"))


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
    # Imported here: an error that needs them to be described came from code that loaded them.
    from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

    from geneva_drive.cli.database_url import DatabaseUrlError
    from geneva_drive.runtime.loaded import NoWorkflowsLoaded
    from geneva_drive.runtime.startup import StartupError, first_line

    if isinstance(
        error,
        NoWorkflowsLoaded | AppImportError | MissingExtra | DatabaseUrlError | AsyncDriverMissing,
    ):
        return str(error), 2
    if isinstance(error, ArgumentError | NoSuchModuleError):
        return f"--database-url: {error}", 2
    if isinstance(error, StartupError | GenevaDriveError):
        return str(error), 1
    if isinstance(error, DBAPIError):
        return f"the database said: {first_line(error)}", 1
    if isinstance(error, ModuleNotFoundError):
        return f"{error}; install the package that provides it", 1
    return f"{type(error).__name__}: {error} (run with {TRACEBACK_FLAG} to see where)", 1

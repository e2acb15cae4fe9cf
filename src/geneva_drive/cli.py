"""The ``geneva-drive`` command: a thin layer over the library's Python functions."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from .config import Settings

app = typer.Typer(
    help="Durable multi-step workflows in your own SQL database.",
    no_args_is_help=True,
    add_completion=False,
)

DatabaseUrl = Annotated[
    str,
    typer.Option(
        "--database-url",
        envvar="GENEVA_DRIVE_DATABASE_URL",
        help="SQLAlchemy URL, e.g. postgresql+psycopg://user@host/db or sqlite:///app.db",
    ),
]


def _engine(url: str):  # type: ignore[no-untyped-def]
    from .engine import create_engine

    return create_engine(url)


def _load_app(database_url: str, modules: list[str] | None) -> Settings:
    """The prelude of every long-running command: logging, the app's workflows, the engine."""
    from .config import configure

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    sys.path.insert(0, os.getcwd())  # --app modules are named relative to where you run it
    for module in modules or []:
        importlib.import_module(module)
    return configure(engine=_engine(database_url))


@app.command()
def migrate(database_url: DatabaseUrl) -> None:
    """Create or upgrade geneva-drive's tables (its own Alembic version table)."""
    from .migrate import current_revision, install

    engine = _engine(database_url)
    install(engine)
    typer.echo(f"geneva-drive schema at revision {current_revision(engine)}")


@app.command()
def worker(
    database_url: DatabaseUrl,
    app_module: Annotated[
        list[str] | None,
        typer.Option("--app", help="Module(s) defining your workflows; imported first."),
    ] = None,
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
) -> None:
    """Run steps from the database until SIGINT/SIGTERM (a second signal exits at once)."""
    from .worker import Worker

    config = _load_app(database_url, app_module)
    running = Worker(
        config=config,
        queues=[q.strip() for q in queues.split(",") if q.strip()] if queues else None,
        concurrency=concurrency,
        poll_interval=poll_interval,
        lease=lease,
        grace_period=grace_period,
        housekeeping_interval=housekeeping_interval or None,
    )
    running.run()
    if running.abandoned:
        raise typer.Exit(1)  # steps were cut off; their leases were released for recovery


@app.command()
def housekeeping(
    database_url: DatabaseUrl,
    app_module: Annotated[
        list[str] | None,
        typer.Option("--app", help="Module(s) defining your workflows; imported first."),
    ] = None,
    recover_scheduled: Annotated[
        bool | None,
        typer.Option(
            "--recover-scheduled/--no-recover-scheduled",
            help="Recover overdue scheduled steps (default: only with an external backend).",
        ),
    ] = None,
) -> None:
    """Delete old finished workflows, recover lost steps, publish gauges; prints the counts."""
    import json

    from . import housekeeping as hk

    config = _load_app(database_url, app_module)
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
            help="Your Celery app as module:attribute (the module imports your workflows).",
        ),
    ],
    interval: Annotated[
        float, typer.Option(help="Seconds between passes; keep it well below the ETA horizon.")
    ] = 10.0,
    once: Annotated[bool, typer.Option("--once", help="One pass: print the count, exit.")] = False,
) -> None:
    """Celery: send steps whose wait was beyond the ETA horizon, and re-send lost messages."""
    from .config import configure
    from .contrib import celery as gd_celery
    from .errors import StepConfigurationError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        backend = gd_celery.load_backend(celery_app)
    except StepConfigurationError as error:
        raise typer.BadParameter(str(error), param_hint="--app") from error
    config = configure(engine=_engine(database_url), backend=backend)
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
    from .demo import run_demo

    run_demo(path)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

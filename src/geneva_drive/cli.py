"""The ``geneva-drive`` command: a thin layer over the library's Python functions."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

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
) -> None:
    """Run steps from the database until SIGINT/SIGTERM (a second signal exits at once)."""
    from .config import configure
    from .worker import Worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    sys.path.insert(0, os.getcwd())
    for module in app_module or []:
        importlib.import_module(module)
    config = configure(engine=_engine(database_url))
    Worker(
        config=config,
        queues=[q.strip() for q in queues.split(",") if q.strip()] if queues else None,
        concurrency=concurrency,
        poll_interval=poll_interval,
    ).run()


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

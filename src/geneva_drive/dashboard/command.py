"""``geneva-drive dashboard``: serve the dashboard with uvicorn (registered in ``cli.py``).

Read-only unless ``--token`` is given; then the pages show a login form and every action needs
the token. One of the two must be chosen explicitly, so nobody serves a writable dashboard by
accident.
"""

from __future__ import annotations

from typing import Annotated

import typer

from ..cli import _CLICK, AppModules, DatabaseUrl, _load_app


def dashboard(
    database_url: DatabaseUrl,
    app_module: AppModules = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on; only this machine can reach 127.0.0.1.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="GENEVA_DRIVE_DASHBOARD_TOKEN",
            help="Allow actions (pause, resume, cancel, ...) to whoever logs in with this "
            "token; pass it in the environment to keep it out of the process list.",
        ),
    ] = None,
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Serve the pages without any action.")
    ] = False,
    title: Annotated[str, typer.Option(help="Shown in the header and the tab.")] = "geneva-drive",
) -> None:
    """Serve the web dashboard (needs the dashboard extra); read-only unless --token is given."""
    if bool(token) == read_only:
        raise _CLICK.UsageError(
            "pass --token TOKEN to allow actions (or set GENEVA_DRIVE_DASHBOARD_TOKEN), or "
            "--read-only to serve the pages without any"
            if not read_only
            else "--token and --read-only contradict each other; pass one of them"
        )
    settings = _load_app(database_url, app_module)
    from ..startup import check_database

    check_database(settings.require_engine(), wait=0)
    try:
        import uvicorn

        from .app import create_app
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            f"geneva-drive dashboard needs {error.name!r}: pip install 'geneva-drive[dashboard]'",
            name=error.name,
        ) from error
    app = create_app(engine=settings.require_engine(), token=token or None, title=title)
    uvicorn.run(app, host=host, port=port, log_level="info", proxy_headers=False)

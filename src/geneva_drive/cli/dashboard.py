"""``geneva-drive dashboard``: serve the dashboard with uvicorn (registered in ``cli/main.py``).

It needs the ``dashboard`` extra (Starlette, uvicorn, Jinja2), imported when the command runs:
without it the command exits with code 2 and says what to install.

Read-only unless ``--token`` is given; then the pages show a login form and every action needs
the token. One of the two must be chosen explicitly, so nobody serves a writable dashboard by
accident.
"""

from __future__ import annotations

from typing import Annotated

import typer

from geneva_drive.cli.options import _CLICK, AppModules, DatabaseUrl, import_extra, load_app
from geneva_drive.cli.values import whole


def dashboard(
    database_url: DatabaseUrl,
    app_module: AppModules = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on; only this machine can reach 127.0.0.1.")
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option(
            callback=whole(minimum=0, maximum=65535, example="8000"),
            help="Port to listen on (0: any free port).",
        ),
    ] = 8000,
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
    # Before the app and the database: without the extra nothing else is worth checking.
    for module in ("uvicorn", "geneva_drive.dashboard.app"):
        import_extra(
            module,
            needs="the dashboard extra (Starlette, uvicorn, Jinja2)",
            extra="dashboard",
            provides=("starlette", "uvicorn", "jinja2", "markupsafe", "anyio"),
        )
    import uvicorn

    from geneva_drive.dashboard.app import create_app
    from geneva_drive.runtime.startup import check_database

    settings = load_app(database_url, app_module)
    check_database(settings.require_engine(), wait=0)
    app = create_app(engine=settings.require_engine(), token=token or None, title=title)
    uvicorn.run(app, host=host, port=port, log_level="info", proxy_headers=False)

"""``geneva-drive schedules``: list the cron schedules; ``schedules pause|resume CLASS``.

One call into :mod:`geneva_drive.admin` (``schedules``, ``pause_schedule``,
``resume_schedule``) plus formatting, like the commands of :mod:`geneva_drive.cli.ops`.
CLASS is the workflow type (the class name unless ``workflow_type`` is set); ``--app`` is
needed only for ``missed=`` in the list and to pause a class no worker has seen yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from geneva_drive import admin
from geneva_drive.cli.ops import JsonOutput, connected, console, echo_json, usage_errors
from geneva_drive.cli.options import AppModules, DatabaseUrl, app

if TYPE_CHECKING:
    from rich.console import RenderableType

ACTIONS = ("pause", "resume")


@app.command()
def schedules(
    database_url: DatabaseUrl,
    arguments: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[pause|resume CLASS]",
            help="Nothing: list the schedules. pause CLASS / resume CLASS: stop or restart "
            "creating the class's workflows (resume follows its missed=).",
            show_default=False,
        ),
    ] = None,
    app_module: AppModules = None,
    json_output: JsonOutput = False,
) -> None:
    """Cron schedules: next and last tick, paused or not; pause or resume one."""
    action, name = _parse(arguments or [])
    with (
        usage_errors(),
        connected(database_url, app_module) as sessions,
        sessions.begin() as session,
    ):
        if action is None:
            found: list[admin.ScheduleInfo] = admin.schedules(session)
        elif action == "pause":
            found = [admin.pause_schedule(session, name)]
        else:
            found = [admin.resume_schedule(session, name)]
    if json_output:
        echo_json(admin.to_json(found))
        return
    console().print(render(found))


def _parse(arguments: list[str]) -> tuple[str | None, str]:
    if not arguments:
        return None, ""
    if len(arguments) == 2 and arguments[0] in ACTIONS:
        return arguments[0], arguments[1]
    raise typer.BadParameter(
        f"expected nothing (list), or pause CLASS or resume CLASS; got {' '.join(arguments)!r}",
        param_hint="[pause|resume CLASS]",
    )


def render(found: list[admin.ScheduleInfo]) -> RenderableType:
    from rich.text import Text

    from geneva_drive.cli.render import _table, when

    if not found:
        return Text("no schedules (a class gets one with schedule = Schedule(...))")
    table = _table("TYPE", "CRON", "TIME ZONE", "MISSED", "NEXT TICK (UTC)", "LAST TICK", "STATE")
    for s in found:
        table.add_row(
            s.workflow_type,
            s.cron,
            s.timezone,
            s.missed or "",
            when(s.next_tick) if s.next_tick else "(no worker yet)",
            when(s.last_tick) + (f" id={s.last_workflow_id}" if s.last_workflow_id else ""),
            "paused" if s.paused else "active",
        )
    return table

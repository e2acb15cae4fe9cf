"""Operating it from a terminal: ``list``, ``show``, the verbs, ``stats``, ``limits`` and
``check``.

Each command is one call into :mod:`geneva_drive.admin` (or
:mod:`geneva_drive.runtime.deploy_check`) plus formatting: Rich tables for people
(:mod:`geneva_drive.cli.render`), ``--json`` for scripts. They are commands of
``cli.options.app`` and take ``--database-url`` and ``--app`` as the
others do. Exit codes: 0 done, 1 refused or problems found, 2 a usage mistake.

A verb acts at once on the ids it is given. Given ``--where`` filters instead, it first shows
what it would change (a dry run: nothing written) and asks; ``--yes`` skips the question.
Every action records ``--actor`` (the OS user unless given) and ``--reason``.

Importing this module registers the commands and imports little: :mod:`geneva_drive.admin`
loads its parts when first used, the tables (:mod:`geneva_drive.cli.render`, Rich) are
imported where they are printed, and the database by :func:`connected` — so ``--version``
and ``--help`` stay quick and ``--json`` loads no Rich.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from geneva_drive import admin
from geneva_drive.cli.options import AppModules, DatabaseUrl, app, import_app
from geneva_drive.cli.values import seconds, whole
from geneva_drive.core.errors import GenevaDriveError

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from sqlalchemy.orm import Session, sessionmaker

JsonOutput = Annotated[
    bool, typer.Option("--json", help="Print JSON (for scripts) instead of tables.")
]
Where = Annotated[
    list[str] | None,
    typer.Option(
        "--where",
        metavar="KEY=VALUE",
        help="Filter (repeatable, all must match): type=, state=, current_step=, hero_type=, "
        "hero_id=, error_class=, awaiting_signal=, created_after=, created_before=, "
        "transitioned_after=, transitioned_before=, has_failed_execution=.",
    ),
]
Ids = Annotated[
    list[int] | None,
    typer.Argument(metavar="ID", help="Workflow ids.", show_default=False),
]
Actor = Annotated[
    str | None,
    typer.Option(
        metavar="NAME", help="Who is acting, recorded with the action (default: the OS user)."
    ),
]
Reason = Annotated[
    str | None,
    typer.Option(metavar="TEXT", help="Why, recorded with the action and shown by `show`."),
]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="With --where: apply without asking first.")]


# -- the prelude every command shares ------------------------------------------------------


@contextlib.contextmanager
def connected(database_url: str, app_modules: list[str] | None) -> Iterator[sessionmaker[Session]]:
    """Import the ``--app`` modules, connect, check the schema; yields the sessions to use,
    and the settings are restored after.

    ``configured`` (not ``configure``) so that a command run in-process, as the tests run it,
    leaves the caller's settings (clock, backend) as they were: only the engine is ours.
    """
    from geneva_drive.cli.database_url import open_engine
    from geneva_drive.runtime.configure import configured
    from geneva_drive.runtime.startup import check_database
    from geneva_drive.storage.db import session_factory

    for spec in app_modules or []:
        import_app(spec)
    engine = open_engine(database_url)  # a mistaken URL, a missing SQLite file: exit 2
    try:
        with configured(engine=engine) as settings:
            check_database(engine, wait=0.0)  # one try: an operator wants the error now
            yield session_factory(settings)
    finally:
        engine.dispose()


@contextlib.contextmanager
def usage_errors() -> Iterator[None]:
    """Bad operator input (a filter, a cursor, a limit) is a usage mistake: exit code 2."""
    try:
        yield
    except admin.AdminInputError as error:
        raise typer.BadParameter(str(error)) from error


def default_actor() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        return f"uid {os.getuid()}"


def parse_where(items: list[str] | None, **fields: Any) -> admin.WorkflowFilter:
    """``--where`` items, then the dedicated options (``--type``…) that were given."""
    where = admin.WorkflowFilter.parse(items or [])
    given: dict[str, Any] = {k: (v[0] if len(v) == 1 else tuple(v)) for k, v in fields.items() if v}
    return replace(where, **given) if given else where


def console() -> Console:
    from geneva_drive.cli import render

    return render.console()  # fitted to a terminal; in a pipe, never wrapped or cut


def echo_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str))


# -- reading -------------------------------------------------------------------------------


@app.command("list")
def list_workflows(
    database_url: DatabaseUrl,
    app_module: AppModules = None,
    where: Where = None,
    workflow_type: Annotated[
        list[str] | None,
        typer.Option("--type", metavar="CLASS", help="Workflow type (repeatable: any of them)."),
    ] = None,
    state: Annotated[
        list[str] | None,
        typer.Option(metavar="STATE", help="ready, performing, paused, finished, canceled."),
    ] = None,
    current_step: Annotated[
        str | None, typer.Option("--step", metavar="STEP", help="The step it stands at.")
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            callback=whole(minimum=1, maximum=admin.MAX_PAGE, example="50"),
            help="Workflows per page.",
        ),
    ] = 50,
    after: Annotated[
        str | None,
        typer.Option(metavar="CURSOR", help="The next page: the cursor the last page printed."),
    ] = None,
    oldest_first: Annotated[bool, typer.Option("--oldest-first", help="Oldest first.")] = False,
    json_output: JsonOutput = False,
) -> None:
    """List workflows, newest first, a page at a time."""
    with usage_errors(), connected(database_url, app_module) as sessions:
        filters = parse_where(
            where, workflow_type=workflow_type, state=state, current_step=current_step
        )
        with sessions.begin() as session:
            page = admin.find(
                session, filters, newest_first=not oldest_first, limit=limit, after=after
            )
            total = None if json_output or after else admin.count(session, filters)
    if json_output:
        echo_json(admin.to_json(page))
        return
    from geneva_drive.cli import render

    console().print(render.page(page, total))


@app.command()
def show(
    workflow_id: Annotated[int, typer.Argument(metavar="ID", help="Workflow id.")],
    database_url: DatabaseUrl,
    app_module: AppModules = None,
    json_output: JsonOutput = False,
) -> None:
    """One workflow's timeline: executions with errors and backtraces, signals, actions."""
    with (
        usage_errors(),
        connected(database_url, app_module) as sessions,
        sessions.begin() as session,
    ):
        timeline = admin.show(session, workflow_id)
    if json_output:
        echo_json(admin.to_json(timeline))
        return
    from geneva_drive.cli import render

    console().print(render.timeline(timeline))


@app.command()
def stats(
    database_url: DatabaseUrl,
    app_module: AppModules = None,
    watch_: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C.")] = False,
    interval: Annotated[
        float,
        typer.Option(
            callback=seconds(above_zero=True, example="2"), help="Seconds between refreshes."
        ),
    ] = 2.0,
    iterations: Annotated[
        int | None,
        typer.Option(
            callback=whole(minimum=1, example="10"),
            metavar="N",
            help="With --watch: stop after N refreshes.",
        ),
    ] = None,
    json_output: JsonOutput = False,
) -> None:
    """Counts by class and state, overdue steps by queue, waits, recent outcomes, leases."""
    with usage_errors(), connected(database_url, app_module) as sessions:
        if json_output:
            echo_json(admin.to_json(read_stats(sessions)))
            return
        from geneva_drive.cli import render

        if not watch_:
            console().print(render.stats(read_stats(sessions)))
            return
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how --watch ends
            watch(
                lambda: render.stats(read_stats(sessions)),
                interval=interval,
                iterations=iterations,
                out=console(),
            )


@app.command()
def limits(
    database_url: DatabaseUrl,
    app_module: AppModules = None,
    json_output: JsonOutput = False,
) -> None:
    """Concurrency keys: running steps, waiters, holders; rate keys: recent starts."""
    with usage_errors(), connected(database_url, app_module) as sessions:
        with sessions.begin() as session:
            found = admin.limits(session)
        if json_output:
            echo_json(admin.to_json(found))
            return
        from geneva_drive.cli import render

        console().print(render.limits(found))


def read_stats(sessions: sessionmaker[Session]) -> admin.Stats:
    with sessions.begin() as session:
        return admin.stats(session)


def watch(
    render: Callable[[], RenderableType],
    *,
    interval: float,
    iterations: int | None,
    out: Console,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Show ``render()`` and redraw it every ``interval`` seconds; returns the renders done."""
    from rich.live import Live

    done = 1
    with Live(render(), console=out, auto_refresh=False) as live:
        while iterations is None or done < iterations:
            sleep(interval)
            live.update(render(), refresh=True)
            done += 1
    return done


@app.command()
def check(
    database_url: DatabaseUrl,
    app_module: AppModules = None,
    json_output: JsonOutput = False,
) -> None:
    """Before a deploy: list in-flight rows the code --app loads would strand (exit 1 if any).

    A row is stranded when its workflow class, its hero's class or its step no longer exists;
    rows at removed_step() gravestones are listed too. Run it with the new code against a
    copy of production (in CI), before the deploy.
    """
    from geneva_drive.runtime import deploy_check
    from geneva_drive.runtime.loaded import claim_scope, require_workflows

    with connected(database_url, app_module) as sessions:
        require_workflows(claim_scope(None))  # without --app every row would look stranded
        with sessions.begin() as session:
            report = deploy_check.check(session)
    if json_output:
        echo_json(report.to_json())
    else:
        from geneva_drive.cli import render

        console().print(render.deploy_report(report), soft_wrap=True)  # commands: 1 line
    if report.stranded:
        raise typer.Exit(1)


# -- acting --------------------------------------------------------------------------------

if TYPE_CHECKING:
    Call = Callable[[Session, int], admin.ActionResult]


def act(
    sessions: sessionmaker[Session],
    action: str,
    ids: list[int] | None,
    where: list[str] | None,
    *,
    yes: bool,
    json_output: bool,
    actor: str,
    reason: str | None,
    **action_args: Any,
) -> None:
    """Run ``action`` (the name of an :mod:`admin` verb, with ``action_args``) on the ids, or
    on every workflow matching ``where``; exit 1 on refusals."""
    if ids and where:
        raise typer.BadParameter("pass workflow ids or --where filters, not both")
    verb = getattr(admin, action)

    def call(session: Session, workflow_id: int) -> admin.ActionResult:
        result: admin.ActionResult = verb(
            session, workflow_id, actor=actor, reason=reason, **action_args
        )
        return result

    if ids:
        refused = act_on_ids(sessions, ids, call, json_output=json_output)
    elif where:
        filters = admin.WorkflowFilter.parse(where)
        refused = act_in_bulk(
            sessions,
            action,
            filters,
            yes=yes,
            json_output=json_output,
            actor=actor,
            reason=reason,
            **action_args,
        )
    else:
        raise typer.BadParameter(
            "pass one or more workflow ids, or --where KEY=VALUE to act on every workflow "
            "that matches (e.g. --where state=paused)"
        )
    if refused:
        raise typer.Exit(1)


def run_verb(
    database_url: str,
    app_modules: list[str] | None,
    action: str,
    ids: list[int] | None,
    where: list[str] | None,
    *,
    yes: bool,
    json_output: bool,
    actor: str | None,
    reason: str | None,
    **action_args: Any,
) -> None:
    """A verb command's whole body: connect, then :func:`act` (actor: the OS user unless given)."""
    with usage_errors(), connected(database_url, app_modules) as sessions:
        act(
            sessions,
            action,
            ids,
            where,
            yes=yes,
            json_output=json_output,
            actor=actor or default_actor(),
            reason=reason,
            **action_args,
        )


def act_on_ids(
    sessions: sessionmaker[Session], ids: list[int], call: Call, *, json_output: bool
) -> int:
    """Each id in its own transaction: one refusal leaves the others done. Returns refusals."""
    done: list[admin.ActionResult] = []
    refused: list[tuple[int, str]] = []
    for workflow_id in ids:
        try:
            with sessions.begin() as session:
                done.append(call(session, workflow_id))
        except GenevaDriveError as error:  # refused, unknown id: rolled back, nothing written
            refused.append((workflow_id, str(error)))
    if json_output:
        echo_json({"changed": admin.to_json(done), "refused": [list(r) for r in refused]})
    else:
        from geneva_drive.cli import render

        for result in done:
            typer.echo(render.action_line(result))
        for workflow_id, why in refused:
            typer.echo(f"refused: workflow {workflow_id}: {why}", err=True)
    return len(refused)


def act_in_bulk(
    sessions: sessionmaker[Session],
    action: str,
    where: admin.WorkflowFilter,
    *,
    yes: bool,
    json_output: bool,
    actor: str,
    reason: str | None,
    **action_args: Any,
) -> int:
    """Show the dry run, ask (unless ``yes``), apply. Returns the refusals."""

    def run(dry_run: bool) -> admin.BulkResult:
        return admin.bulk(
            sessions, action, where, actor=actor, reason=reason, dry_run=dry_run, **action_args
        )

    preview = run(dry_run=True)
    if json_output and not yes:  # no question to ask a script: it gets the dry run
        echo_json(admin.to_json(preview))
        return 0
    if not json_output:
        typer.echo(bulk_lines(action, preview))
    if not preview.changed:
        return len(preview.refused)
    if not yes and not typer.confirm(f"{action} {len(preview.changed)} workflow(s)?"):
        typer.echo("nothing changed")
        raise typer.Exit(1)
    result = run(dry_run=False)
    if json_output:
        echo_json(admin.to_json(result))
    else:
        typer.echo(bulk_lines(action, result))
    return len(result.refused)


def bulk_lines(action: str, result: admin.BulkResult) -> str:
    from geneva_drive.cli import render

    return render.bulk_lines(action, result)


def _verb(action: str, summary: str) -> None:
    """Register ``geneva-drive <action> ID… | --where …``."""

    def command(
        database_url: DatabaseUrl,
        ids: Ids = None,
        app_module: AppModules = None,
        where: Where = None,
        yes: Yes = False,
        actor: Actor = None,
        reason: Reason = None,
        json_output: JsonOutput = False,
    ) -> None:
        run_verb(
            database_url,
            app_module,
            action,
            ids,
            where,
            yes=yes,
            json_output=json_output,
            actor=actor,
            reason=reason,
        )

    command.__doc__ = summary
    command.__name__ = action
    app.command(action)(command)


_verb("pause", "Pause workflows: a running step finishes, nothing more runs until resume.")
_verb("resume", "Resume paused workflows where they stopped.")
_verb("skip", "Skip the step workflows stand at and schedule the one after it.")
_verb("cancel", "Cancel workflows (final).")
_verb("retry", "Make the step workflows stand at due now (scheduled or paused ones).")


def id_then(
    arguments: list[str], where: list[str] | None, what: str, example: str
) -> tuple[list[int] | None, str]:
    """``ID WHAT`` for one workflow, or ``WHAT`` alone with ``--where``: (ids or None, what)."""
    if where:
        if len(arguments) != 1:
            raise typer.BadParameter(
                f"with --where, pass the {what} alone (e.g. {example} --where state=paused), "
                "not a workflow id too"
            )
        return None, arguments[0]
    if len(arguments) == 2 and arguments[0].isdigit():
        return [int(arguments[0])], arguments[1]
    raise typer.BadParameter(
        f"expected a workflow ID and the {what} (e.g. 42 {example}), or the {what} alone "
        "with --where KEY=VALUE for every workflow that matches"
    )


@app.command("resume-at")
def resume_at(
    arguments: Annotated[
        list[str],
        typer.Argument(
            metavar="[ID] STEP",
            help="The workflow id and the step to continue at; with --where, the step alone.",
            show_default=False,
        ),
    ],
    database_url: DatabaseUrl,
    app_module: AppModules = None,
    where: Where = None,
    yes: Yes = False,
    actor: Actor = None,
    reason: Reason = None,
    json_output: JsonOutput = False,
    wait_until: Annotated[
        str | None,
        typer.Option(
            "--wait-until",
            metavar="TIME",
            help="Due at this ISO 8601 time with its offset (e.g. 2026-12-07T09:00+01:00) "
            "instead of now.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Continue workflows at a named step (paused ones, or ones at a step that is gone)."""
    ids, step = id_then(arguments, where, "STEP", "pack")
    if wait_until is not None:
        extra: dict[str, Any] = {"wait_until": aware_time(wait_until, "--wait-until")}
    else:
        extra = {}
    run_verb(
        database_url,
        app_module,
        "resume_at",
        ids,
        where,
        yes=yes,
        json_output=json_output,
        actor=actor,
        reason=reason,
        step=step,
        **extra,
    )


def aware_time(raw: str, option: str) -> datetime:
    """``raw`` as an aware datetime; a usage error naming ``option`` if it is not one."""
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        value = None
    if value is None or value.tzinfo is None:
        raise typer.BadParameter(
            f"expected an ISO 8601 time with its UTC offset, e.g. 2026-12-07T09:00+01:00 or "
            f"2026-12-07T08:00Z, got {raw!r}",
            param_hint=option,
        )
    return value


@app.command()
def signal(
    arguments: Annotated[
        list[str],
        typer.Argument(
            metavar="[ID] NAME",
            help="The workflow id and the signal's name; with --where, the name alone.",
            show_default=False,
        ),
    ],
    database_url: DatabaseUrl,
    app_module: AppModules = None,
    where: Where = None,
    yes: Yes = False,
    payload: Annotated[
        str | None, typer.Option(metavar="JSON", help="The payload, e.g. '{\"amount\": 5}'.")
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(metavar="K", help="Idempotency key: a second signal with it is a no-op."),
    ] = None,
    allow_unknown: Annotated[
        bool,
        typer.Option(
            "--allow-unknown",
            help="Store a signal no step of the class waits for (yet): for a step not "
            "deployed yet. Without it such a name is refused.",
        ),
    ] = False,
    actor: Actor = None,
    reason: Reason = None,
    json_output: JsonOutput = False,
) -> None:
    """Send a signal to workflows, as the application's code would."""
    ids, name = id_then(arguments, where, "NAME", "approved")
    value = parse_payload(payload)
    run_verb(
        database_url,
        app_module,
        "signal",
        ids,
        where,
        yes=yes,
        json_output=json_output,
        actor=actor,
        reason=reason,
        name=name,
        payload=value,
        key=key,
        allow_unknown=allow_unknown,
    )


def parse_payload(payload: str | None) -> Any:
    if payload is None:
        return None
    try:
        return json.loads(payload)
    except json.JSONDecodeError as error:
        raise typer.BadParameter(
            f"not JSON ({error.msg} at character {error.pos}): {payload!r:.80}; quote it for "
            """the shell, e.g. --payload '{"amount_cents": 500}'""",
            param_hint="--payload",
        ) from None

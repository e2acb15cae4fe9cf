"""Bulk actions: which verbs a filter is offered, and the dry run shown before confirming.

The workflows page offers a verb only if some state the filter admits accepts it (no "Pause
all" for ``state=paused``). Choosing one opens the dry run, ``GET /bulk/preview``: the same
``admin.bulk(..., dry_run=True)`` the CLI shows before it asks — what would change, what would
be refused and why, nothing written — with the confirmation that POSTs to ``/bulk``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial

from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from geneva_drive import admin
from geneva_drive.admin import AdminInputError, WorkflowFilter
from geneva_drive.admin.act import actions_for
from geneva_drive.dashboard.context import Dashboard, Refused
from geneva_drive.dashboard.forms import STATES, FilterForm, first

BULK_ACTIONS = ("pause", "resume", "retry", "skip", "cancel")
# Verbs whose effect cannot be taken back by another verb: a skipped step does not run, a
# canceled workflow is over. Their buttons wear the danger colour; the others do not.
DESTRUCTIVE = frozenset({"cancel", "skip", "resume_at"})
SHOWN_IDS = 50  # ids the dry run lists per group before "… and N more"


def routes(dash: Dashboard) -> list[BaseRoute]:
    return [Route("/bulk/preview", partial(preview, dash), name="bulk_preview")]


def offered(states: Iterable[str]) -> list[str]:
    """The bulk verbs for a filter on ``states`` (every state when the filter names none)."""
    accepted = actions_for(tuple(states) or STATES)
    return [action for action in BULK_ACTIONS if action in accepted]


@dataclass(frozen=True)
class BulkRequest:
    action: str
    form: FilterForm
    where: WorkflowFilter


async def checked(dash: Dashboard, request: Request, items: list[tuple[str, str]]) -> BulkRequest:
    """The verb and the filter of a bulk request, once allowed; :class:`Refused` otherwise."""
    form = FilterForm.from_items(items)
    action = first(items, "action") or ""
    if action not in BULK_ACTIONS:
        raise Refused(400, f"bulk action={action!r}: expected one of {', '.join(BULK_ACTIONS)}")
    if form.empty:
        raise Refused(
            400,
            f"a bulk {action} needs at least one filter; narrow the list first, so that "
            "acting on every workflow is never a single click",
        )
    try:
        where = form.to_filter()
    except AdminInputError as error:
        raise Refused(400, str(error)) from None
    if not await dash.permissions.allows(request, action, where):
        raise Refused(403, f"you are not allowed to {action} these workflows")
    return BulkRequest(action, form, where)


async def preview(dash: Dashboard, request: Request) -> Response:
    items = request.query_params.multi_items()
    back = f"{dash.url(request, 'workflows')}?{FilterForm.from_items(items).query()}"
    try:
        wanted = await checked(dash, request, items)
    except Refused as refused:
        return dash.error(request, refused.status, str(refused), back=back)
    # Decides only, from the state read now, and writes nothing: plain sessions will do.
    factory = sessionmaker(bind=dash.engine, class_=Session)
    actor = dash.actor(request)
    dry_run = await run_in_threadpool(
        lambda: admin.bulk(factory, wanted.action, wanted.where, actor=actor, dry_run=True)
    )
    return dash.render(
        request,
        "bulk.html",
        {
            "action": wanted.action,
            "form": wanted.form,
            "dry_run": dry_run,
            "danger": wanted.action in DESTRUCTIVE,
            "shown": SHOWN_IDS,
            "back": back,
        },
    )

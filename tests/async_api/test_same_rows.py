"""The async API writes what the sync API writes: one list of scenarios, run through each API
on its own fresh database, and the resulting rows, results, errors and wake-ups compared."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import geneva_drive
from geneva_drive import Workflow, admin, step
from geneva_drive.runtime.configure import configured
from geneva_drive.storage.models import Base
from tests.async_api.conftest import async_url, run
from tests.conftest import _fresh_database
from tests.engine._support import RecordingBackend
from tests.support.app import AppBase, Order


class TwinOrder(Workflow):
    job_options = {"queue": "twins"}

    @step(wait=timedelta(minutes=5))
    def prepare(self) -> None:
        pass

    @step(wait_for="paid")
    def charge(self) -> None:
        pass

    @step
    def ship(self) -> None:
        pass


# A scenario is a list of operations, each (verb, arguments), each in its own transaction
# (committed, unless the verb ends with "!rollback"). Both runners read the same list.
SCENARIOS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "create": [("create", {})],
    "create with step job options": [("create", {"step_job_options": {"priority": 7}})],
    "create, rolled back": [("create!rollback", {})],
    "create with an input": [("create", {"input": {"amount_cents": 1250}})],
    "create with an oversized input (refused)": [("create", {"input": "x" * 70_000})],
    "create_many with inputs": [("create_many", {"heroes": 2, "inputs": [{"n": 1}, {"n": 2}]})],
    "create twice for one hero (uniqueness)": [("create", {}), ("create_again", {})],
    "create twice, allow_multiple": [("create", {}), ("create_again", {"allow_multiple": True})],
    "create_many": [("create_many", {"heroes": 3})],
    "create_many with a conflict": [("create", {}), ("create_many", {"heroes": 2, "last": True})],
    "create_many, raise_on_conflict": [
        ("create", {}),
        ("create_many", {"heroes": 2, "last": True, "raise_on_conflict": True}),
    ],
    "create_many by count (refused: needs a hero)": [("create_many", {"count": 2})],
    "signal twice with one key": [
        ("create", {}),
        ("signal", {"name": "paid", "key": "evt-1", "payload": {"cents": 1250}}),
        ("signal", {"name": "paid", "key": "evt-1", "payload": {"cents": 1250}}),
    ],
    "unknown signal": [("create", {}), ("signal", {"name": "payed", "key": None})],
    "pause, resume": [("create", {}), ("pause", {}), ("resume", {})],
    "pause twice": [("create", {}), ("pause", {}), ("pause", {})],
    "skip": [("create", {}), ("skip", {}), ("skip", {})],
    "cancel, then cancel again": [("create", {}), ("cancel", {}), ("cancel", {})],
    "cancel, rolled back": [("create", {}), ("cancel!rollback", {})],
    "resume a ready workflow": [("create", {}), ("resume", {})],
    "ongoing_for": [("create", {}), ("ongoing_for", {})],
    "admin actions": [
        ("create", {}),
        ("admin.pause", {"actor": "ops", "reason": "look"}),
        ("admin.resume", {"actor": "ops"}),
        ("admin.retry", {"actor": "ops"}),
        ("admin.signal", {"name": "paid", "key": "k", "actor": "ops"}),
        ("admin.resume_at", {"step": "ship", "actor": "ops"}),
        ("admin.skip", {"actor": "ops"}),
        ("admin.cancel", {"actor": "ops"}),
    ],
    "admin refusals": [
        ("create", {}),
        ("admin.resume", {"actor": "ops"}),
        ("admin.pause", {"actor": ""}),
        ("admin.pause", {"actor": "ops", "workflow_id": 999}),
    ],
    "admin reads": [
        ("create_many", {"heroes": 3}),
        ("admin.find", {"limit": 2}),
        ("admin.count", {}),
        ("admin.show", {}),
        ("admin.stats", {}),
        ("admin.for_hero", {}),
    ],
}


@dataclass
class Run:
    """What one API did: per operation its result (or error), then the rows and wake-ups."""

    outcomes: list[Any] = field(default_factory=list)
    wakeups: list[Any] = field(default_factory=list)
    rows: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)


@dataclass
class Place:
    """Where an operation acts: the last hero and workflow made so far."""

    hero: Any = None
    workflow: Any = None


def _new_heroes(session: Session | AsyncSession, count: int) -> list[Order]:
    heroes = [Order() for _ in range(count)]
    session.add_all(heroes)
    return heroes


def _summary(value: Any) -> Any:
    """A result as plain values (a workflow or row: its class, id and state)."""
    if isinstance(value, Workflow):
        return (type(value).__name__, value.id, value.state, value.next_step_name)
    if isinstance(value, list):
        return [_summary(v) for v in value]
    if hasattr(value, "__table__"):  # a Signal or StepExecution row
        return (type(value).__name__, value.id, getattr(value, "state", None))
    if isinstance(value, geneva_drive.admin.Page):
        return [(i.id, i.state) for i in value.items], value.next_cursor
    if hasattr(value, "created") and hasattr(value, "conflicts"):  # StartResult
        return [(h.id, i) for h, i in value.created], [(h.id, i) for h, i in value.conflicts]
    return value


# -- one interpreter per API; each operation's arguments are the scenario's ------------------


def _admin_call(verb: str, place: Place, args: dict[str, Any]) -> tuple[str, tuple, dict]:
    name = verb.removeprefix("admin.")
    args = dict(args)
    if name in ("find", "count", "stats"):
        return name, (), args
    if name == "for_hero":
        return name, (place.hero,), args
    workflow_id = args.pop("workflow_id", place.workflow.id)
    if name == "signal":
        return name, (workflow_id, args.pop("name")), args
    if name == "resume_at":
        return name, (workflow_id, args.pop("step")), args
    return name, (workflow_id,), args


def run_sync(session: Session, place: Place, verb: str, args: dict[str, Any]) -> Any:
    if verb == "create" or verb == "create_again":
        if verb == "create":
            place.hero = _new_heroes(session, 1)[0]
        place.workflow = TwinOrder.create(session, hero=place.hero, **args)
        return place.workflow
    if verb == "create_many":
        args = dict(args)
        heroes = _new_heroes(session, args.pop("heroes", 0)) if "heroes" in args else None
        if heroes is not None and args.pop("last", False):
            heroes.append(place.hero)
        return TwinOrder.create_many(session, heroes=heroes, **args)
    if verb == "signal":
        return place.workflow.signal(args["name"], args.get("payload"), args["key"])
    if verb in ("pause", "resume", "skip", "cancel"):
        return getattr(place.workflow, verb)()
    if verb == "ongoing_for":
        return TwinOrder.ongoing_for(place.hero, session)
    name, positional, keywords = _admin_call(verb, place, args)
    return getattr(admin, name)(session, *positional, **keywords)


async def run_async(session: AsyncSession, place: Place, verb: str, args: dict[str, Any]) -> Any:
    if verb == "create" or verb == "create_again":
        if verb == "create":
            place.hero = _new_heroes(session, 1)[0]
        place.workflow = await TwinOrder.acreate(session, hero=place.hero, **args)
        return place.workflow
    if verb == "create_many":
        args = dict(args)
        heroes = _new_heroes(session, args.pop("heroes", 0)) if "heroes" in args else None
        if heroes is not None and args.pop("last", False):
            heroes.append(place.hero)
        return await TwinOrder.acreate_many(session, heroes=heroes, **args)
    if verb == "signal":
        return await place.workflow.asignal(args["name"], args.get("payload"), args["key"])
    if verb in ("pause", "resume", "skip", "cancel"):
        return await getattr(place.workflow, f"a{verb}")()
    if verb == "ongoing_for":
        return await TwinOrder.aongoing_for(place.hero, session)
    name, positional, keywords = _admin_call(verb, place, args)
    return await getattr(admin, f"a{name}")(session, *positional, **keywords)


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("ok", _summary(call()))
    except Exception as error:
        return ("error", type(error).__name__, str(error))


def sync_api(engine: sa.Engine, scenario: list[tuple[str, dict[str, Any]]]) -> Run:
    result, place = Run(), Place()
    with Session(engine, expire_on_commit=False) as session:
        for operation, args in scenario:
            verb, _, rollback = operation.partition("!")
            try:
                result.outcomes.append(("ok", _summary(run_sync(session, place, verb, args))))
            except Exception as error:
                result.outcomes.append(("error", type(error).__name__, str(error)))
            if rollback:
                session.rollback()
            else:
                session.commit()
    return result


def async_api(engine: Any, scenario: list[tuple[str, dict[str, Any]]]) -> Run:
    result, place = Run(), Place()

    async def go() -> None:
        async with AsyncSession(engine, expire_on_commit=False) as session:
            for operation, args in scenario:
                verb, _, rollback = operation.partition("!")
                try:
                    done = await run_async(session, place, verb, args)
                    result.outcomes.append(("ok", _summary(done)))
                except Exception as error:
                    result.outcomes.append(("error", type(error).__name__, str(error)))
                if rollback:
                    await session.rollback()
                else:
                    await session.commit()

    run(go())
    return result


def dump(engine: sa.Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of geneva-drive's tables and the heroes', in primary-key order."""
    tables = [*Base.metadata.sorted_tables, *AppBase.metadata.sorted_tables]
    with engine.connect() as connection:
        return {
            t.name: [tuple(r) for r in connection.execute(select(t).order_by(*t.primary_key))]
            for t in tables
        }


@pytest.fixture
def twin_urls(request, db_backend, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two fresh installed databases of the backend under test: one per API."""
    urls = []
    for name in ("sync", "async"):
        (tmp_path / name).mkdir()
        urls.append(_fresh_database(request, db_backend, tmp_path / name, installed=True))
    yield urls[0], urls[1]


@pytest.mark.parametrize("scenario", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_the_async_api_writes_the_rows_the_sync_api_writes(twin_urls, clock, scenario):
    sync_url, other_url = twin_urls
    sync_engine = geneva_drive.create_engine(sync_url)
    async_side_engine = geneva_drive.create_engine(other_url)
    async_engine = geneva_drive.create_async_engine(async_url(other_url), poolclass=sa.NullPool)
    try:
        runs = []
        for engine, api in ((sync_engine, "sync"), (async_side_engine, "async")):
            AppBase.metadata.create_all(engine)
            backend = RecordingBackend()
            with configured(engine=engine, clock=clock, backend=backend):
                if api == "sync":
                    done = sync_api(engine, scenario)
                else:
                    done = async_api(async_engine, scenario)
            done.wakeups, done.rows = backend.enqueued, dump(engine)
            runs.append(done)
        sync_run, async_run = runs

        assert async_run.outcomes == sync_run.outcomes
        assert async_run.wakeups == sync_run.wakeups
        assert async_run.rows == sync_run.rows
    finally:
        sync_engine.dispose()
        async_side_engine.dispose()
        run(async_engine.dispose())

"""Mixing the sync and async APIs is a TypeError that names the call to use, before anything
is written."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from geneva_drive import InvalidStateError, Workflow, admin, step
from tests.async_api.conftest import run
from tests.support.app import Order


class AsyncApiMixed(Workflow):
    @step
    def only(self) -> None:
        pass


def _workflows(session) -> int:
    return session.execute(select(func.count()).select_from(Workflow)).scalar_one()


def test_a_sync_session_given_to_acreate_is_a_type_error_naming_create(gd, session):
    with pytest.raises(TypeError) as refused:
        run(AsyncApiMixed.acreate(session, hero=Order()))

    message = str(refused.value)
    assert "AsyncApiMixed.acreate()" in message and "AsyncApiMixed.create()" in message
    assert "got a sync Session" in message
    session.rollback()
    assert _workflows(session) == 0


def test_a_sync_session_given_to_acreate_many_is_a_type_error(gd, session):
    with pytest.raises(TypeError, match=r"AsyncApiMixed\.create_many\(\) \(without await\)"):
        run(AsyncApiMixed.acreate_many(session, heroes=[Order()]))
    session.rollback()
    assert _workflows(session) == 0


def test_an_async_session_given_to_create_is_a_type_error_naming_acreate(gd, session, async_engine):
    async def attempt() -> None:
        async with AsyncSession(async_engine) as s:
            AsyncApiMixed.create(s, hero=Order())  # type: ignore[arg-type]

    with pytest.raises(TypeError) as refused:
        run(attempt())

    assert "AsyncApiMixed.create(): got an AsyncSession" in str(refused.value)
    assert "await AsyncApiMixed.acreate()" in str(refused.value)
    assert _workflows(session) == 0


def test_an_async_session_given_to_create_many_is_a_type_error_naming_acreate_many(
    gd, async_engine
):
    async def attempt() -> None:
        async with AsyncSession(async_engine) as s:
            AsyncApiMixed.create_many(s, count=1)  # type: ignore[arg-type]

    with pytest.raises(TypeError, match=r"await AsyncApiMixed\.acreate_many\(\)"):
        run(attempt())


def test_a_workflow_of_a_sync_session_has_no_async_verbs(gd, session):
    wf = AsyncApiMixed.create(session, hero=Order())
    session.commit()

    for verb in ("apause", "askip", "acancel", "aresume"):
        with pytest.raises(TypeError) as refused:
            run(getattr(wf, verb)())
        assert f"AsyncApiMixed id={wf.id}: {verb[1:]}() (without await)" in str(refused.value)
    with pytest.raises(TypeError, match="belongs to a sync Session"):
        run(wf.asignal("anything"))
    session.expire_all()
    assert session.get(Workflow, wf.id).state == "ready"


def test_a_detached_workflow_says_to_load_it_first(gd, session):
    wf = AsyncApiMixed.create(session, hero=Order())
    session.commit()
    session.expunge(wf)

    with pytest.raises(InvalidStateError, match=r"not attached to a session; load it with"):
        run(wf.apause())


def test_a_sync_session_given_to_an_admin_twin_names_the_sync_function(gd, session):
    with pytest.raises(TypeError, match=r"admin\.apause\(\): got a sync Session.*admin\.pause"):
        run(admin.apause(session, 1, actor="ops"))
    with pytest.raises(TypeError, match=r"admin\.afind\(\): expected an AsyncSession, got 'x'"):
        run(admin.afind("x"))  # type: ignore[arg-type]

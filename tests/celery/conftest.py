"""Fixtures of the Celery backend tests: a private Redis, real Celery workers, PostgreSQL.

    redis_server            the session's private Redis (tests.celery.support.RedisServer)
    celery_app_module       tests.celery.app_module, imported with the broker pointing at it
    broker                  the Redis server, emptied for the test
    celery_gd               geneva-drive in this process on ``engine`` (every database
                            backend), CeleryBackend, frozen clock: for tests without a worker
    pg_celery_url           a fresh PostgreSQL database with the schema and the app tables
    pg_celery_gd            geneva-drive in this process on that database, real clock
    start_worker            starts ``celery worker`` processes on it; stopped after the test

Worker tests run on PostgreSQL only: the issue asks for the distributed setup users run
(several processes on one server database), and each such test costs real seconds. Their
queries are the same ones the in-process tests run on every backend.

Redis or Celery that cannot start: the test is skipped with the reason, and under CI=true it
fails instead (as conftest does for database servers).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.celery.support import CeleryUnavailable, CeleryWorker, RedisServer, RedisUnavailable
from tests.conftest import POSTGRES_TEMPLATE, _in_ci
from tests.support.postgres import unique_database_name


def _unavailable(what: str, error: BaseException) -> None:
    if _in_ci():
        pytest.fail(f"CI=true and {what} is unavailable: {error}", pytrace=False)
    pytest.skip(f"{what} unavailable (CI=true makes this a failure): {error}")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    try:
        server = RedisServer.start()
    except RedisUnavailable as error:
        _unavailable("Redis", error)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def celery_app_module(redis_server: RedisServer) -> Any:
    try:
        import celery  # type: ignore[import-untyped]  # noqa: F401
    except ImportError as error:
        _unavailable("Celery", ImportError(f"{error}; pip install 'geneva-drive[celery]'"))
    from tests.celery import app_module

    # The module's app was created from the environment: point it at this session's Redis.
    app_module.app.conf.broker_url = redis_server.url
    return app_module


@pytest.fixture
def broker(redis_server: RedisServer, celery_app_module: Any) -> RedisServer:
    """The Redis server, emptied: no message of an earlier test can reach this one's worker."""
    redis_server.flush()
    return redis_server


@pytest.fixture
def celery_gd(
    engine: Any, clock: Any, broker: RedisServer, celery_app_module: Any
) -> Iterator[Any]:
    from geneva_drive.runtime.configure import configured
    from tests.support.app import AppBase

    AppBase.metadata.create_all(engine)
    with configured(engine=engine, clock=clock, backend=celery_app_module.backend) as settings:
        yield settings


@pytest.fixture
def pg_celery_url(request: pytest.FixtureRequest, postgres_server: Any) -> Iterator[str]:
    import geneva_drive
    from tests.support.app import AppBase

    request.getfixturevalue("_postgres_template")
    name = unique_database_name("gd_celery")
    url = postgres_server.create_database(name, template=POSTGRES_TEMPLATE)
    engine = geneva_drive.create_engine(url)
    AppBase.metadata.create_all(engine)
    engine.dispose()
    yield url
    postgres_server.drop_database(name)


@pytest.fixture
def pg_celery_gd(pg_celery_url: str, broker: RedisServer, celery_app_module: Any) -> Iterator[Any]:
    import geneva_drive
    from geneva_drive.runtime.configure import configured

    engine = geneva_drive.create_engine(pg_celery_url)
    with configured(engine=engine, backend=celery_app_module.backend) as settings:
        yield settings
    engine.dispose()


@pytest.fixture
def start_worker(pg_celery_url: str, broker: RedisServer) -> Iterator[Callable[..., CeleryWorker]]:
    from tests.celery import app_module

    workers: list[CeleryWorker] = []

    def start(queues: list[str] | None = None, **kwargs: Any) -> CeleryWorker:
        try:
            worker = CeleryWorker.start(
                broker_url=broker.url,
                database_url=pg_celery_url,
                queues=queues or [app_module.DEFAULT_QUEUE, app_module.MAIL_QUEUE],
                **kwargs,
            )
        except CeleryUnavailable as error:
            _unavailable("a Celery worker", error)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()
    if os.environ.get("GD_CELERY_TEST_SHOW_WORKER_OUTPUT"):
        for worker in workers:
            print(worker.output.text())

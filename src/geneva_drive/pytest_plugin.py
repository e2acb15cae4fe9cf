"""pytest plugin, loaded whenever geneva-drive is installed (the ``pytest11`` entry point).

Fixtures (prefixed, so they never replace a ``session`` or ``engine`` fixture of your own):

    geneva_drive_url      session  the test database's URL: ``--geneva-drive-url``, else
                                   ``GENEVA_DRIVE_TEST_URL``, else a SQLite file in a temp dir
    geneva_drive_engine   session  an engine on it with geneva-drive's schema installed
    frozen_clock          test     geneva-drive's clock, frozen (``frozen_clock.advance(...)``)
    geneva_drive_session  test     a ``Session`` on that engine, with geneva-drive configured
                                   on it (engine and frozen clock) and its tables emptied first

Nothing is requested unless a test asks for it: a test suite that uses none of them opens no
database.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from geneva_drive.core.clock import FrozenClock
from geneva_drive.runtime.configure import configured
from geneva_drive.storage.db import create_engine
from geneva_drive.storage.migrate import empty, install

URL_OPTION = "--geneva-drive-url"
URL_ENV = "GENEVA_DRIVE_TEST_URL"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("geneva-drive").addoption(
        URL_OPTION,
        dest="geneva_drive_url",
        default=None,
        metavar="URL",
        help=(
            "database for the geneva_drive_* fixtures, e.g. postgresql+psycopg://app@localhost/"
            f"app_test (default: ${URL_ENV}, else a SQLite file in a temporary directory). "
            "geneva-drive's tables there are created if missing and emptied before each test."
        ),
    )


@pytest.fixture(scope="session")
def geneva_drive_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> str:
    """The test database's URL (``--geneva-drive-url``, ``$GENEVA_DRIVE_TEST_URL`` or SQLite)."""
    chosen = request.config.getoption("geneva_drive_url") or os.environ.get(URL_ENV, "").strip()
    if chosen:
        return str(chosen)
    return f"sqlite:///{tmp_path_factory.mktemp('geneva-drive') / 'test.db'}"


@pytest.fixture(scope="session")
def geneva_drive_engine(geneva_drive_url: str) -> Iterator[Engine]:
    """An engine on the test database with geneva-drive's schema installed (once a run)."""
    engine = create_engine(geneva_drive_url)
    try:
        install(engine)
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def frozen_clock() -> Iterator[FrozenClock]:
    """Freeze geneva-drive's clock for one test; ``frozen_clock.advance(seconds=30)`` moves it."""
    clock = FrozenClock()
    with configured(clock=clock):
        yield clock


@pytest.fixture
def geneva_drive_session(
    geneva_drive_engine: Engine, frozen_clock: FrozenClock
) -> Iterator[Session]:
    """A session for one test, with geneva-drive configured on the test engine and the frozen
    clock; geneva-drive's tables are emptied before the test (your own tables are not)."""
    empty(geneva_drive_engine)
    with (
        configured(engine=geneva_drive_engine, clock=frozen_clock),
        Session(geneva_drive_engine) as session,
    ):
        yield session

"""Database fixtures: every database test runs once per backend, each on its own fresh database.

Fixtures, from the bottom up:

    db_backend              "sqlite" | "postgresql" | "mariadb"; parametrizes every test using
                            those below
    database_url            URL of a fresh, EMPTY database (no geneva-drive schema)
    empty_engine            geneva_drive.create_engine(database_url), schema NOT installed
    installed_database_url  URL of a fresh database with the geneva-drive schema installed
    engine                  geneva_drive.create_engine(installed_database_url)
    postgres_server         the session's embedded PostgreSQL server (tests.support.postgres)
    mariadb_server          the session's private MariaDB server (tests.support.mariadb)

The schema is installed once per session into a template (a SQLite file that is copied, a
PostgreSQL database used as `CREATE DATABASE ... TEMPLATE`, a MariaDB database whose tables are
re-created from `SHOW CREATE TABLE`), so `engine` costs a file copy or a few DDL statements
rather than a migration run.

Environment:

    GD_TEST_BACKENDS=sqlite     run only the listed backends (comma-separated); default: all
    CI=true                     an unavailable or unselected backend fails the run instead of
                                being skipped
"""

from __future__ import annotations

import logging
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.mariadb import MariaDBServer, MariaDBUnavailable
from tests.support.postgres import PostgresServer, PostgresUnavailable, unique_database_name

if TYPE_CHECKING:
    import sqlalchemy as sa

BACKENDS = ("sqlite", "postgresql", "mariadb")
_MARKS = {
    "sqlite": pytest.mark.sqlite,
    "postgresql": pytest.mark.postgres,
    "mariadb": pytest.mark.mariadb,
}
POSTGRES_TEMPLATE = "gd_template"
MARIADB_TEMPLATE = "gd_template"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def _requested_backends() -> list[str]:
    raw = os.environ.get("GD_TEST_BACKENDS", "").strip()
    if not raw:
        return list(BACKENDS)
    return [name.strip() for name in raw.split(",") if name.strip()]


def _not_selected(name: str) -> str:
    return f"{name} backend not selected (GD_TEST_BACKENDS={os.environ.get('GD_TEST_BACKENDS')!r})"


def _backend_param(name: str) -> Any:
    marks = [_MARKS[name]]
    if name not in _requested_backends():
        marks.append(pytest.mark.skip(reason=_not_selected(name)))
    return pytest.param(name, id=name, marks=marks)


# --- the per-session backend report ------------------------------------------------------------


@dataclass
class BackendStatus:
    unavailable: str | None = None  # why the backend could not run at all
    outcomes: Counter[str] = field(default_factory=Counter)


# eq=False keeps it hashable: pluggy puts registered plugins in sets (e.g. when a conftest.py
# in a subdirectory narrows the hook callers).
@dataclass(eq=False)
class BackendReport:
    """Counts outcomes per backend and prints them at the end; registered as a pytest plugin."""

    backends: dict[str, BackendStatus] = field(
        default_factory=lambda: {name: BackendStatus() for name in BACKENDS}
    )
    _backend_of: dict[str, str] = field(default_factory=dict)  # nodeid -> backend
    _outcome_of: dict[str, str] = field(default_factory=dict)  # nodeid -> final outcome

    def problems(self) -> list[str]:
        """Backends that could not run, or ran nothing while others did. CI fails on these."""
        ran_any = any(status.outcomes.keys() - {"skipped"} for status in self.backends.values())
        problems = []
        for name, status in self.backends.items():
            if status.unavailable:
                problems.append(f"{name}: {status.unavailable.splitlines()[0]}")
            elif ran_any and not (status.outcomes.keys() - {"skipped"}):
                problems.append(f"{name}: no test ran on this backend")
        return problems

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            callspec = getattr(item, "callspec", None)
            if callspec is not None and "db_backend" in callspec.params:
                self._backend_of[item.nodeid] = callspec.params["db_backend"]
                continue
            for name, mark in _MARKS.items():  # e.g. a test using postgres_server directly
                if item.get_closest_marker(mark.name):
                    self._backend_of[item.nodeid] = name

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # Called for setup, call and teardown: keep one outcome per test, a failure sticks.
        backend = self._backend_of.get(report.nodeid)
        if backend is None or self._outcome_of.get(report.nodeid) in {"failed", "error"}:
            return
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        elif report.failed:
            outcome = "failed" if report.when == "call" else "error"
        elif report.skipped:
            outcome = "skipped"
        elif report.when == "call":
            outcome = "passed"
        else:
            return
        previous = self._outcome_of.get(report.nodeid)
        if previous is not None:
            self.backends[backend].outcomes[previous] -= 1
        self._outcome_of[report.nodeid] = outcome
        self.backends[backend].outcomes[outcome] += 1

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # Runs before the terminal summary is written, and pytest exits with session.exitstatus.
        if _in_ci() and self.problems() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not any(+s.outcomes or s.unavailable for s in self.backends.values()):
            return  # no database test ran; nothing to say
        problems = self.problems()
        colour = ("red" if _in_ci() else "yellow") if problems else "green"
        loud = {colour: True, "bold": True}
        terminalreporter.write_sep("=", "database backends", **loud)
        for name, status in self.backends.items():
            counts = ", ".join(f"{n} {o}" for o, n in sorted((+status.outcomes).items()))
            terminalreporter.write_line(f"{name:<11} {counts or 'no tests'}")
            if status.unavailable:
                terminalreporter.write_line(f"{'':<11} UNAVAILABLE: {status.unavailable}", **loud)
        if problems:
            if _in_ci():
                consequence = "CI=true: this run FAILS because a database backend did not run"
            else:
                consequence = "a database backend was SKIPPED; CI=true turns this into a failure"
            terminalreporter.write_line(consequence, **loud)


_REPORT = pytest.StashKey[BackendReport]()


def pytest_configure(config: pytest.Config) -> None:
    unknown = set(_requested_backends()) - set(BACKENDS)
    if unknown:
        raise pytest.UsageError(
            f"GD_TEST_BACKENDS names unknown backends {sorted(unknown)}; "
            f"use a comma-separated subset of {list(BACKENDS)}"
        )
    if _in_ci() and set(_requested_backends()) != set(BACKENDS):
        raise pytest.UsageError(
            f"GD_TEST_BACKENDS={os.environ['GD_TEST_BACKENDS']!r} narrows the database backends, "
            "but CI=true requires all of them; unset GD_TEST_BACKENDS"
        )
    report = BackendReport()
    config.stash[_REPORT] = report
    config.pluginmanager.register(report, "geneva-drive-backend-report")


# --- servers and templates (session scope) ------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_server(request: pytest.FixtureRequest) -> Iterator[PostgresServer]:
    """The session's embedded PostgreSQL server, started on first use and stopped at the end."""
    if "postgresql" not in _requested_backends():
        pytest.skip(_not_selected("postgresql"))
    try:
        server = PostgresServer.start()
    except PostgresUnavailable as exc:
        request.config.stash[_REPORT].backends["postgresql"].unavailable = str(exc)
        if _in_ci():
            pytest.fail(f"CI=true and PostgreSQL is unavailable: {exc}", pytrace=False)
        # The first line is the reason; the server log tail goes to the backend summary.
        pytest.skip(f"PostgreSQL unavailable: {str(exc).splitlines()[0]}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mariadb_server(request: pytest.FixtureRequest) -> Iterator[MariaDBServer]:
    """The session's private MariaDB server, started on first use and stopped at the end."""
    if "mariadb" not in _requested_backends():
        pytest.skip(_not_selected("mariadb"))
    try:
        server = MariaDBServer.start()
    except MariaDBUnavailable as exc:
        request.config.stash[_REPORT].backends["mariadb"].unavailable = str(exc)
        if _in_ci():
            pytest.fail(f"CI=true and MariaDB is unavailable: {exc}", pytrace=False)
        pytest.skip(f"MariaDB unavailable: {str(exc).splitlines()[0]}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import geneva_drive

    path = tmp_path_factory.mktemp("gd-sqlite-template") / "template.db"
    engine = geneva_drive.create_engine(_sqlite_url(path))
    try:
        geneva_drive.install(engine)
    finally:
        engine.dispose()
    return path


@pytest.fixture(scope="session")
def _postgres_template(postgres_server: PostgresServer) -> str:
    import geneva_drive

    url = postgres_server.create_database(POSTGRES_TEMPLATE)
    engine = geneva_drive.create_engine(url)
    try:
        geneva_drive.install(engine)
    finally:
        # CREATE DATABASE ... TEMPLATE refuses while anyone is connected to the template.
        engine.dispose()
    return POSTGRES_TEMPLATE


@pytest.fixture(scope="session")
def _mariadb_template(mariadb_server: MariaDBServer) -> str:
    import geneva_drive

    engine = geneva_drive.create_engine(mariadb_server.create_database(MARIADB_TEMPLATE))
    try:
        geneva_drive.install(engine)
    finally:
        engine.dispose()
    return MARIADB_TEMPLATE


# --- per-test databases -------------------------------------------------------------------------


@pytest.fixture(params=[_backend_param(name) for name in BACKENDS])
def db_backend(request: pytest.FixtureRequest) -> str:
    """The database backend under test; requesting it runs the test once per backend."""
    return str(request.param)


def _sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def _fresh_database(
    request: pytest.FixtureRequest, db_backend: str, tmp_path: Path, *, installed: bool
) -> str:
    if db_backend == "sqlite":
        path = tmp_path / "geneva_drive.db"
        if installed:
            template: Path = request.getfixturevalue("_sqlite_template")
            # After engine.dispose() SQLite has checkpointed and removed the WAL; copy it anyway
            # if it exists, so a change in that behaviour cannot silently lose schema.
            for suffix in ("", "-wal"):
                source = template.with_name(template.name + suffix)
                if source.exists():
                    shutil.copyfile(source, path.with_name(path.name + suffix))
        return _sqlite_url(path)

    assert db_backend in ("postgresql", "mariadb"), db_backend
    prefix = {"postgresql": "postgres", "mariadb": "mariadb"}[db_backend]
    server: PostgresServer | MariaDBServer = request.getfixturevalue(f"{prefix}_server")
    template_name = request.getfixturevalue(f"_{prefix}_template") if installed else None
    name = unique_database_name()
    url = server.create_database(name, template=template_name)
    request.addfinalizer(lambda: server.drop_database(name))
    return url


@pytest.fixture
def database_url(request: pytest.FixtureRequest, db_backend: str, tmp_path: Path) -> str:
    """URL of a fresh, empty database of the backend under test, dropped after the test."""
    return _fresh_database(request, db_backend, tmp_path, installed=False)


@pytest.fixture
def installed_database_url(request: pytest.FixtureRequest, db_backend: str, tmp_path: Path) -> str:
    """URL of a fresh database with the geneva-drive schema installed, dropped after the test."""
    return _fresh_database(request, db_backend, tmp_path, installed=True)


@pytest.fixture
def engine(installed_database_url: str) -> Iterator[sa.Engine]:
    """An engine on a fresh database with the geneva-drive schema installed."""
    import geneva_drive

    engine = geneva_drive.create_engine(installed_database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def empty_engine(database_url: str) -> Iterator[sa.Engine]:
    """An engine on a fresh, empty database: for testing install() and migrations themselves."""
    import geneva_drive

    engine = geneva_drive.create_engine(database_url)
    yield engine
    engine.dispose()


# --- a configured geneva-drive runtime for behaviour tests --------------------------------------


@pytest.fixture
def clock() -> Any:
    from geneva_drive import FrozenClock

    return FrozenClock()


@pytest.fixture
def gd(engine: sa.Engine, clock: Any) -> Iterator[Any]:
    """geneva-drive configured on ``engine`` with a frozen clock and the database backend.

    The test application's tables (tests.support.app) are created too. Yields the Settings.
    """
    from geneva_drive import DatabaseBackend
    from geneva_drive.runtime.configure import configured
    from tests.support.app import AppBase

    AppBase.metadata.create_all(engine)
    with configured(engine=engine, clock=clock, backend=DatabaseBackend()) as settings:
        yield settings


@pytest.fixture
def session(gd: Any) -> Iterator[Any]:
    """An application session on the configured engine (expire_on_commit off, like most apps
    that hand objects to templates)."""
    from sqlalchemy.orm import Session

    with Session(gd.engine, expire_on_commit=False) as s:
        yield s


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A command run in-process (Typer's CliRunner) configures the root logger for its run
    (``runtime.logs.setup``: a handler on the runner's stderr, which is closed once the run
    ends). Left in place, that handler fails on every later record — "I/O operation on
    closed file", printed into a later command's output. Each test gets the root logger back
    as it found it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)

"""The pytest plugin as a user's test suite meets it: each test here runs a small user test
module under pytest in a process of its own (the plugin loaded through its entry point)."""

from __future__ import annotations

import pytest

from tests.plugin._support import explain, outcome, run_pytest, url_for

# The user's own `session` and `engine` fixtures sit beside the plugin's; the order of the
# tests matters: the second finds what the first left, the third what the second configured.
USER_MODULE = """
import pytest
from sqlalchemy import func, select

import geneva_drive
from geneva_drive import FrozenClock, Workflow, step
from geneva_drive.core.settings import settings
from geneva_drive.testing import speedrun


class PluginHeroless(Workflow):
    may_proceed_without_hero = True

    @step
    def only(self):
        pass


@pytest.fixture
def session():
    return "the user's own session"


@pytest.fixture
def engine():
    return "the user's own engine"


def test_1_runs_a_workflow_and_leaves_it_behind(geneva_drive_session, session, engine):
    assert session == "the user's own session" and engine == "the user's own engine"
    wf = PluginHeroless.create(geneva_drive_session, hero=None)
    speedrun(wf)
    assert wf.state == "finished"


def test_2_finds_geneva_drives_tables_emptied(geneva_drive_session, geneva_drive_engine):
    count = geneva_drive_session.scalar(select(func.count()).select_from(geneva_drive.Workflow))
    assert count == 0
    assert geneva_drive_session.get_bind() is geneva_drive_engine
    assert settings().engine is geneva_drive_engine
    assert isinstance(settings().clock, FrozenClock)


def test_3_a_test_without_the_fixtures_finds_geneva_drive_unconfigured():
    assert settings().engine is None
    assert not isinstance(settings().clock, FrozenClock)


def test_4_the_session_shares_the_frozen_clock(geneva_drive_session, frozen_clock):
    assert settings().clock is frozen_clock
    before = frozen_clock.now()
    frozen_clock.advance(hours=1)
    assert settings().clock.now() - before == __import__("datetime").timedelta(hours=1)
"""


def test_the_fixtures_empty_the_tables_configure_and_restore_beside_the_users_own(
    db_backend, request, tmp_path
):
    url = url_for(db_backend, request)
    args = ["--geneva-drive-url", url] if url else []

    result = run_pytest(tmp_path, {"test_user.py": USER_MODULE}, *args)

    assert result.returncode == 0, explain(result)
    assert outcome(result).startswith("4 passed"), explain(result)


URL_MODULE = """
def test_url(geneva_drive_url, geneva_drive_engine):
    print("URL=" + geneva_drive_url)
    assert geneva_drive_engine.url.render_as_string(hide_password=False) == geneva_drive_url
"""


def _printed_url(stdout: str) -> str:
    (line,) = [line for line in stdout.splitlines() if line.startswith("URL=")]
    return line.removeprefix("URL=")


@pytest.mark.sqlite
def test_without_a_url_the_database_is_a_sqlite_file_in_a_temporary_directory(tmp_path):
    result = run_pytest(tmp_path, {"test_url.py": URL_MODULE}, "-s")

    assert result.returncode == 0, explain(result)
    url = _printed_url(result.stdout)
    assert url.startswith("sqlite:///") and url.endswith("/test.db")
    assert str(tmp_path) not in url  # not in the user's project


@pytest.mark.sqlite
def test_the_option_chooses_the_database_over_the_environment(tmp_path):
    by_option = f"sqlite:///{tmp_path / 'option.db'}"
    by_env = f"sqlite:///{tmp_path / 'env.db'}"
    env = {"GENEVA_DRIVE_TEST_URL": by_env}

    chosen = run_pytest(tmp_path, {"test_url.py": URL_MODULE}, "-s", env=env)
    assert chosen.returncode == 0, explain(chosen)
    assert _printed_url(chosen.stdout) == by_env

    chosen = run_pytest(
        tmp_path, {"test_url.py": URL_MODULE}, "-s", "--geneva-drive-url", by_option
    )
    assert chosen.returncode == 0, explain(chosen)
    assert _printed_url(chosen.stdout) == by_option
    assert (tmp_path / "option.db").exists()  # the schema was installed there


@pytest.mark.sqlite
def test_the_option_is_listed_in_pytest_help(tmp_path):
    result = run_pytest(tmp_path, {}, "--help")

    assert "--geneva-drive-url=URL" in result.stdout, explain(result)
    assert "GENEVA_DRIVE_TEST_URL" in result.stdout

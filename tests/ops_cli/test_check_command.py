"""``geneva-drive check``: run with the new code before a deploy; exit 1 if rows would strand.

Each check runs in a fresh process that imports only the ``--app`` module written for the
test, as CI would run it with the code about to be deployed.
"""

from __future__ import annotations

import json
import textwrap

from geneva_drive import Workflow, step
from tests.ops_cli._support import command, one_error_line


class CheckRenames(Workflow):
    """The code as deployed now: the row stands at ``prepare``."""

    may_proceed_without_hero = True

    @step
    def prepare(self) -> None:
        pass

    @step
    def ship(self) -> None:
        pass


NEXT_RELEASE = """
from geneva_drive import Workflow, removed_step, step

class CheckRenames(Workflow):
    may_proceed_without_hero = True
    {gravestone}
    @step
    def get_ready(self):
        pass

    @step
    def ship(self):
        pass
"""


def _release(tmp_path, name, *, gravestone=False):
    body = NEXT_RELEASE.format(gravestone='removed_step("prepare")' if gravestone else "")
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    return name


def _in_flight(session):
    workflow = CheckRenames.create(session)
    session.commit()
    return workflow


def test_check_exits_0_when_every_in_flight_row_is_runnable_by_the_new_code(
    session, installed_database_url, tmp_path
):
    _in_flight(session)
    (tmp_path / "same_release.py").write_text(
        "from tests.ops_cli.test_check_command import CheckRenames\n"
    )

    result = command("check", "--app", "same_release", url=installed_database_url, path=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "1 in-flight row(s), none stranded by this code" in result.stdout


def test_check_exits_1_on_a_row_at_a_renamed_step_and_0_once_a_removed_step_is_declared(
    session, installed_database_url, tmp_path
):
    workflow = _in_flight(session)
    renamed = _release(tmp_path, "release_renamed")
    with_gravestone = _release(tmp_path, "release_gravestone", gravestone=True)

    stranded = command("check", "--app", renamed, url=installed_database_url, path=tmp_path)
    fixed = command("check", "--app", with_gravestone, url=installed_database_url, path=tmp_path)

    assert stranded.returncode == 1, stranded.stderr
    assert f"STRANDED: 1 scheduled row(s) of CheckRenames (e.g. id {workflow.id})" in (
        stranded.stdout
    )
    assert "stand at step 'prepare', which CheckRenames no longer defines" in stranded.stdout
    assert "removed_step('prepare')" in stranded.stdout
    assert "would be stranded" in stranded.stdout
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "gravestone: 1 scheduled row(s) of CheckRenames" in fixed.stdout
    assert "none stranded" in fixed.stdout


def test_check_exits_1_on_a_row_whose_class_is_not_loaded_and_names_the_fix(
    session, installed_database_url, tmp_path
):
    _in_flight(session)
    (tmp_path / "other_release.py").write_text(
        textwrap.dedent(
            """
            from geneva_drive import Workflow, step

            class CheckRenamed(Workflow):
                may_proceed_without_hero = True

                @step
                def prepare(self):
                    pass
            """
        )
    )

    result = command("check", "--app", "other_release", url=installed_database_url, path=tmp_path)

    assert result.returncode == 1
    assert "no Workflow class with workflow_type 'CheckRenames' is loaded" in result.stdout
    assert "set workflow_type = 'CheckRenames' on it (renamed to CheckRenamed?)" in result.stdout


def test_check_json_lists_each_finding_with_its_fix(session, installed_database_url, tmp_path):
    workflow = _in_flight(session)
    renamed = _release(tmp_path, "release_json")

    result = command("check", "--app", renamed, "--json", url=installed_database_url, path=tmp_path)

    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["stranded"] is True and report["stranded_rows"] == 1
    (finding,) = report["findings"]
    assert finding["problem"] == "unknown_step"
    assert finding["workflow_type"] == "CheckRenames" and finding["step"] == "prepare"
    assert finding["first_id"] == workflow.id and finding["count"] == 1
    assert "removed_step('prepare')" in finding["fix"]


def test_check_without_app_is_a_usage_error_in_one_line(installed_database_url):
    result = command("check", url=installed_database_url)

    assert result.returncode == 2
    assert "no workflows loaded; pass --app" in one_error_line(result.stderr)

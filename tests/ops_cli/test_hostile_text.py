"""Issue 35: hostile text given to the operator commands is refused with a message that says
why, and changes nothing: in ``--where`` a usage error (exit 2), in an action by id a refusal of
that id (exit 1, as for any input the admin API refuses). A shell cannot pass NUL in an
argument, but bytes that are not UTF-8 reach Python as lone surrogates (``\\udcff``), which no
database can store either."""

from __future__ import annotations

from sqlalchemy import text

from geneva_drive import Workflow, step
from geneva_drive.testing import speedrun
from tests.ops_cli._support import invoke, invoke_json
from tests.ops_cli.test_commands import _paused, _ready, _state

UNDECODABLE = "a\udcffb"  # sys.argv's spelling of the bytes b"a\xffb"


def test_list_where_with_a_lone_surrogate_is_a_usage_error(session, installed_database_url):
    _ready(session)

    result = invoke(installed_database_url, "list", "--where", f"hero_id={UNDECODABLE}")

    assert result.exit_code == 2
    assert "lone surrogate" in result.output and "position 1" in result.output


def test_an_action_whose_reason_holds_a_lone_surrogate_is_refused_and_changes_nothing(
    session, installed_database_url
):
    paused = _paused(session)

    result = invoke(installed_database_url, "resume", str(paused.id), "--reason", UNDECODABLE)

    assert result.exit_code == 1
    assert "reason" in result.output and "lone surrogate" in result.output
    assert _state(session, paused) == "paused"
    assert invoke_json(installed_database_url, "show", str(paused.id))["actions"] == []


def test_a_signal_whose_payload_holds_nul_is_refused_and_stores_nothing(
    session, installed_database_url
):
    workflow = _ready(session)

    result = invoke(
        installed_database_url, "signal", str(workflow.id), "approved", "--payload", '"a\\u0000b"'
    )

    assert result.exit_code == 1
    assert f"OpsCharge id={workflow.id}" in result.output and "NUL" in result.output
    session.commit()
    count = session.execute(text("SELECT count(*) FROM geneva_drive_signals")).scalar_one()
    assert count == 0


class OpsBracketed(Workflow):
    """Fails with a message that reads as Rich markup and emoji codes."""

    may_proceed_without_hero = True

    @step
    def parse(self) -> None:
        raise KeyError(MARKUP_LIKE)


MARKUP_LIKE = "[bold]row[/bold] :thumbs_up: [/x]"


def test_show_prints_an_error_that_reads_as_markup_as_it_was_raised(
    session, installed_database_url
):
    workflow = OpsBracketed.create(session)
    speedrun(workflow, raise_errors=False)
    session.commit()

    result = invoke(installed_database_url, "show", str(workflow.id))

    assert result.exit_code == 0, result.output  # "[/x]", a closing tag of nothing, raised
    assert MARKUP_LIKE in result.output  # not bold, no emoji, nothing dropped

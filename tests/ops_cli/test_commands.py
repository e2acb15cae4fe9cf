"""The operator commands over ``geneva_drive.admin``, run in-process with Typer's CliRunner.

The 3 a.m. scenario: a step keeps failing, the workflow is paused; find it, read its error,
act on it — one workflow by id, or every match of a filter after a dry run and a question.
"""

from __future__ import annotations

import getpass
import json
from typing import Any, ClassVar

from sqlalchemy import text

from geneva_drive import Workflow, step
from geneva_drive.testing import speedrun
from tests.ops_cli._support import command, invoke, invoke_json, one_error_line


class OpsCharge(Workflow):
    """``charge`` fails while ``failing`` is set; the default policy pauses the workflow."""

    may_proceed_without_hero = True
    failing: ClassVar[bool] = True

    @step
    def prepare(self) -> None:
        pass

    @step
    def charge(self) -> None:
        if OpsCharge.failing:
            raise ConnectionError("payment gateway unreachable")

    @step
    def receipt(self) -> None:
        pass


class OpsApproval(Workflow):
    """Waits for ``approved``."""

    may_proceed_without_hero = True

    @step(wait_for="approved")
    def approve(self) -> None:
        pass


def _awaiting_approval(session: Any) -> Workflow:
    workflow = OpsApproval.create(session)
    session.commit()
    return workflow


def _paused(session: Any) -> Workflow:
    """A workflow paused by charge's failure (the step is kept for resume)."""
    OpsCharge.failing = True
    workflow = OpsCharge.create(session)
    speedrun(workflow, raise_errors=False)
    assert workflow.state == "paused"
    return workflow


def _ready(session: Any) -> Workflow:
    workflow = OpsCharge.create(session)
    session.commit()
    return workflow


def _state(session: Any, workflow: Workflow) -> str:
    session.commit()
    query = text("SELECT state FROM geneva_drive_workflows WHERE id = :id")
    return str(session.execute(query, {"id": workflow.id}).scalar_one())


def _step(session: Any, workflow: Workflow) -> str | None:
    session.commit()
    query = text("SELECT next_step_name FROM geneva_drive_workflows WHERE id = :id")
    value = session.execute(query, {"id": workflow.id}).scalar_one()
    return None if value is None else str(value)


# -- list ------------------------------------------------------------------------------------


def test_list_where_state_paused_shows_the_paused_workflow_only(session, installed_database_url):
    paused = _paused(session)
    ready = _ready(session)

    result = invoke(installed_database_url, "list", "--where", "state=paused")

    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines()]
    table = [row[:4] for row in rows if len(row) > 1 and row[1] == "OpsCharge"]
    assert table == [[str(paused.id), "OpsCharge", "paused", "charge"]]
    assert str(ready.id) not in [row[0] for row in table]
    assert "1 shown of 1 matching" in result.stdout


def test_list_json_pages_with_a_cursor(session, installed_database_url):
    first, second = _ready(session), _ready(session)

    page = invoke_json(installed_database_url, "list", "--type", "OpsCharge", "--limit", "1")
    rest = invoke_json(
        installed_database_url,
        "list",
        "--type",
        "OpsCharge",
        "--limit",
        "1",
        "--after",
        page["next_cursor"],
    )

    assert [item["id"] for item in page["items"]] == [second.id]  # newest first
    assert [item["id"] for item in rest["items"]] == [first.id]
    assert page["items"][0]["workflow_type"] == "OpsCharge"


def test_list_with_an_unknown_filter_key_is_a_usage_error_naming_the_close_key(
    installed_database_url,
):
    result = invoke(installed_database_url, "list", "--where", "stat=paused")

    assert result.exit_code == 2
    assert "unknown key 'stat'" in result.output and "did you mean 'state'" in result.output


# -- show ------------------------------------------------------------------------------------


def test_show_prints_the_timeline_with_the_failed_attempts_error_and_backtrace(
    session, installed_database_url
):
    paused = _paused(session)

    result = invoke(installed_database_url, "show", str(paused.id))

    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"workflow {paused.id}  OpsCharge  paused" in out
    assert "steps: prepare → [charge] → receipt" in out
    assert "ConnectionError: payment gateway unreachable" in out
    assert 'raise ConnectionError("payment gateway unreachable")' in out  # the backtrace


def test_show_json_has_every_execution(session, installed_database_url):
    paused = _paused(session)

    timeline = invoke_json(installed_database_url, "show", str(paused.id))

    assert timeline["workflow"]["id"] == paused.id
    steps = [(e["step_name"], e["state"]) for e in timeline["executions"]]
    assert ("prepare", "completed") in steps and ("charge", "failed") in steps


def test_show_of_an_unknown_id_is_one_line_and_exit_1(installed_database_url):
    result = command("show", "987654", url=installed_database_url)

    assert result.returncode == 1
    line = one_error_line(result.stderr)
    assert "987654" in line
    assert "geneva-drive list" in line and "admin.find()" not in line  # a command, not Python


# -- acting by id ----------------------------------------------------------------------------


def test_resume_by_id_resumes_and_records_the_actor_and_reason(session, installed_database_url):
    paused = _paused(session)
    OpsCharge.failing = False

    result = invoke(
        installed_database_url,
        "resume",
        str(paused.id),
        "--actor",
        "alice",
        "--reason",
        "gateway is back",
    )

    assert result.exit_code == 0, result.output
    assert f"resume: workflow {paused.id} (paused → ready)" in result.stdout
    assert _state(session, paused) == "ready"
    actions = invoke_json(installed_database_url, "show", str(paused.id))["actions"]
    assert [(a["action"], a["actor"], a["reason"]) for a in actions] == [
        ("resume", "alice", "gateway is back")
    ]


def test_the_actor_defaults_to_the_os_user(session, installed_database_url):
    workflow = _ready(session)

    result = invoke(installed_database_url, "pause", str(workflow.id))

    assert result.exit_code == 0, result.output
    actions = invoke_json(installed_database_url, "show", str(workflow.id))["actions"]
    assert [a["actor"] for a in actions] == [getpass.getuser()]


def test_a_refused_action_exits_1_says_why_and_changes_nothing(session, installed_database_url):
    ready = _ready(session)
    paused = _paused(session)

    result = invoke(installed_database_url, "resume", str(ready.id), str(paused.id))

    assert result.exit_code == 1
    assert f"refused: workflow {ready.id}: " in result.stderr
    assert "OpsCharge" in result.stderr
    assert _state(session, ready) == "ready"
    assert _state(session, paused) == "ready"  # the other id was done all the same


def test_skip_moves_a_paused_workflow_to_the_next_step(session, installed_database_url):
    paused = _paused(session)

    result = invoke(installed_database_url, "skip", str(paused.id))

    assert result.exit_code == 0, result.output
    assert _step(session, paused) == "receipt"
    assert f"skip: workflow {paused.id} (paused at charge → ready at receipt)" in result.stdout


def test_skip_without_the_class_loaded_is_refused_instead_of_finishing_the_workflow(
    session, installed_database_url
):
    """In a fresh process without --app the row's class is unknown: skipping would compute
    "no next step" and finish the workflow (it did). It is refused, saying to pass --app."""
    paused = _paused(session)

    result = command("skip", str(paused.id), url=installed_database_url)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "OpsCharge" in result.stderr and "not loaded" in result.stderr, result.stderr
    assert "--app" in result.stderr
    assert (_state(session, paused), _step(session, paused)) == ("paused", "charge")


def test_cancel_ends_a_workflow(session, installed_database_url):
    workflow = _ready(session)

    result = invoke(installed_database_url, "cancel", str(workflow.id), "--reason", "dup")

    assert result.exit_code == 0, result.output
    assert _state(session, workflow) == "canceled"


def test_resume_at_continues_at_the_named_step(session, installed_database_url):
    paused = _paused(session)

    result = invoke(installed_database_url, "resume-at", str(paused.id), "receipt")

    assert result.exit_code == 0, result.output
    assert _state(session, paused) == "ready"
    assert _step(session, paused) == "receipt"


def test_resume_at_wait_until_makes_the_step_due_then(session, installed_database_url):
    paused = _paused(session)

    result = invoke(
        installed_database_url,
        "resume-at",
        str(paused.id),
        "receipt",
        "--wait-until",
        "2099-12-07T09:00+01:00",
    )

    assert result.exit_code == 0, result.output
    assert _step(session, paused) == "receipt"
    due = session.execute(
        text(
            "SELECT scheduled_for FROM geneva_drive_step_executions "
            "WHERE workflow_id = :id AND step_name = 'receipt'"
        ),
        {"id": paused.id},
    ).scalar_one()
    assert str(due).startswith("2099-12-07 08:00:00")


def test_resume_at_a_wait_until_without_offset_is_a_usage_error(session, installed_database_url):
    paused = _paused(session)

    result = invoke(
        installed_database_url, "resume-at", str(paused.id), "receipt", "--wait-until", "2099-12-07"
    )

    assert result.exit_code == 2
    assert "--wait-until" in result.stderr and "offset" in result.stderr
    assert _state(session, paused) == "paused"


def test_resume_at_an_unknown_step_is_refused_with_the_known_steps(session, installed_database_url):
    paused = _paused(session)

    result = invoke(installed_database_url, "resume-at", str(paused.id), "recipt")

    assert result.exit_code == 1
    assert "recipt" in result.stderr
    assert _state(session, paused) == "paused"


def test_signal_delivers_a_payload_with_an_idempotency_key(session, installed_database_url):
    workflow = _awaiting_approval(session)

    result = invoke(
        installed_database_url,
        "signal",
        str(workflow.id),
        "approved",
        "--payload",
        '{"by": "bob"}',
        "--key",
        "k1",
    )

    assert result.exit_code == 0, result.output
    signals = invoke_json(installed_database_url, "show", str(workflow.id))["signals"]
    assert [(s["name"], s["idempotency_key"]) for s in signals] == [("approved", "k1")]
    assert "bob" in signals[0]["payload_preview"]


def test_resume_at_with_where_moves_every_match_after_the_dry_run(session, installed_database_url):
    paused = [_paused(session), _paused(session)]
    ready = _ready(session)  # matches no filter below: left alone

    declined = invoke(
        installed_database_url, "resume-at", "receipt", "--where", "state=paused", input="n\n"
    )
    applied = invoke(
        installed_database_url, "resume-at", "receipt", "--where", "state=paused", "--yes"
    )

    assert declined.exit_code == 1 and "would resume_at: 2" in declined.stdout
    assert applied.exit_code == 0, applied.output
    assert "resume_at: 2 (" in applied.stdout
    assert [(_state(session, w), _step(session, w)) for w in paused] == [("ready", "receipt")] * 2
    assert _state(session, ready) == "ready" and _step(session, ready) == "prepare"


def test_resume_at_with_where_dry_run_refuses_a_step_the_class_does_not_have(
    session, installed_database_url
):
    paused = _paused(session)

    result = invoke(
        installed_database_url, "resume-at", "recipt", "--where", "state=paused", "--json"
    )

    assert result.exit_code == 0, result.output  # a dry run: nothing asked, nothing written
    preview = json.loads(result.stdout)
    assert preview["changed"] == []
    [(refused_id, why)] = preview["refused"]
    assert refused_id == paused.id and "no such step" in why and "receipt" in why
    assert _state(session, paused) == "paused"


def test_signal_with_where_delivers_to_every_match(session, installed_database_url):
    ready = [_awaiting_approval(session), _awaiting_approval(session)]

    result = invoke(
        installed_database_url,
        "signal",
        "approved",
        "--where",
        "type=OpsApproval",
        "--payload",
        '{"by": "bob"}',
        "--yes",
    )

    assert result.exit_code == 0, result.output
    for workflow in ready:
        signals = invoke_json(installed_database_url, "show", str(workflow.id))["signals"]
        assert [s["name"] for s in signals] == ["approved"]
        assert "bob" in signals[0]["payload_preview"]


def test_resume_at_and_signal_say_which_arguments_each_form_takes(session, installed_database_url):
    workflow = _paused(session)

    both = invoke(
        installed_database_url, "resume-at", str(workflow.id), "receipt", "--where", "state=paused"
    )
    step_alone = invoke(installed_database_url, "resume-at", "receipt")
    not_an_id = invoke(installed_database_url, "signal", "approved", "now")

    assert both.exit_code == 2 and "with --where, pass the STEP alone" in both.output
    assert step_alone.exit_code == 2 and "a workflow ID and the STEP" in step_alone.output
    assert not_an_id.exit_code == 2 and "a workflow ID and the NAME" in not_an_id.output
    assert _state(session, workflow) == "paused"


def test_a_payload_that_is_not_json_is_a_usage_error(session, installed_database_url):
    workflow = _ready(session)

    result = invoke(
        installed_database_url, "signal", str(workflow.id), "approved", "--payload", "{by: bob}"
    )

    assert result.exit_code == 2
    assert "--payload" in result.output and "not JSON" in result.output


def test_ids_and_where_together_or_neither_are_usage_errors(session, installed_database_url):
    workflow = _ready(session)

    both = invoke(installed_database_url, "pause", str(workflow.id), "--where", "state=ready")
    neither = invoke(installed_database_url, "pause")

    assert both.exit_code == 2 and "not both" in both.output
    assert neither.exit_code == 2 and "--where KEY=VALUE" in neither.output
    assert _state(session, workflow) == "ready"


# -- acting in bulk --------------------------------------------------------------------------


def test_bulk_retry_shows_what_would_change_and_declining_changes_nothing(
    session, installed_database_url
):
    paused = [_paused(session), _paused(session)]

    result = invoke(installed_database_url, "retry", "--where", "state=paused", input="n\n")

    assert result.exit_code == 1
    assert "2 workflow(s) match" in result.stdout
    assert "would retry: 2" in result.stdout
    assert "retry 2 workflow(s)? [y/N]" in result.stdout
    assert "nothing changed" in result.stdout
    actions = invoke_json(installed_database_url, "show", str(paused[0].id))["actions"]
    assert actions == []


def test_bulk_retry_applies_after_yes_at_the_prompt(session, installed_database_url):
    paused = [_paused(session), _paused(session)]
    OpsCharge.failing = False

    result = invoke(installed_database_url, "retry", "--where", "state=paused", input="y\n")

    assert result.exit_code == 0, result.output
    assert "retry: 2 (" in result.stdout
    assert {_state(session, w) for w in paused} == {"ready"}


def test_bulk_with_refusals_applies_the_rest_and_exits_1(session, installed_database_url):
    already = _paused(session)
    ready = [_ready(session), _ready(session)]

    result = invoke(
        installed_database_url, "pause", "--where", "type=OpsCharge", "--yes", "--reason", "x"
    )

    assert result.exit_code == 1, result.output
    assert "pause: 2 (" in result.stdout
    assert "refused: 1" in result.stdout and f"workflow {already.id}: " in result.stdout
    assert {_state(session, w) for w in ready} == {"paused"}


def test_bulk_json_without_yes_prints_the_dry_run_and_changes_nothing(
    session, installed_database_url
):
    ready = _ready(session)

    result = invoke(installed_database_url, "cancel", "--where", "state=ready", "--json")

    assert result.exit_code == 0, result.output
    preview = json.loads(result.stdout)
    assert preview["dry_run"] is True and preview["changed"] == [ready.id]
    assert _state(session, ready) == "ready"


# -- stats -----------------------------------------------------------------------------------


def test_stats_counts_workflows_by_class_and_state(session, installed_database_url):
    _paused(session)
    _ready(session)

    human = invoke(installed_database_url, "stats")
    data = invoke_json(installed_database_url, "stats")

    assert human.exit_code == 0, human.output
    assert "workflows by state" in human.stdout and "OpsCharge" in human.stdout
    counts = {(c, s): n for c, s, n in data["by_class_state"]}
    assert counts[("OpsCharge", "paused")] == 1 and counts[("OpsCharge", "ready")] == 1


def test_stats_watch_stops_after_the_given_number_of_refreshes(session, installed_database_url):
    _ready(session)

    result = invoke(
        installed_database_url, "stats", "--watch", "--iterations", "2", "--interval", "0.01"
    )

    assert result.exit_code == 0, result.output
    assert "workflows by state" in result.stdout


def test_a_verb_with_json_prints_what_changed_and_what_was_refused(session, installed_database_url):
    ready = _ready(session)

    result = invoke(installed_database_url, "pause", str(ready.id), "987654", "--json")

    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert [(c["workflow_id"], c["state_after"]) for c in report["changed"]] == [
        (ready.id, "paused")
    ]
    assert [r[0] for r in report["refused"]] == [987654]


def test_bulk_skips_finished_and_canceled_matches_with_a_count_and_exits_0(
    session, installed_database_url
):
    ready = _ready(session)
    canceled = _ready(session)
    canceled.cancel()
    session.commit()

    result = invoke(installed_database_url, "cancel", "--where", "type=OpsCharge", "--yes")

    assert result.exit_code == 0, result.output
    assert "skipped 1 finished or canceled" in result.stdout
    assert "refused" not in result.output
    assert _state(session, ready) == "canceled"


def test_list_json_and_show_give_the_step_a_workflow_stands_at_as_current_step(
    session, installed_database_url
):
    paused = _paused(session)  # stopped at charge
    ready = _ready(session)  # at prepare

    listed = invoke_json(installed_database_url, "list")["items"]
    shown = invoke_json(installed_database_url, "show", str(paused.id))["workflow"]
    filtered = invoke_json(installed_database_url, "list", "--where", "current_step=charge")

    assert {i["id"]: i["current_step"] for i in listed} == {
        paused.id: "charge",
        ready.id: "prepare",
    }
    assert shown["current_step"] == "charge"
    assert [i["id"] for i in filtered["items"]] == [paused.id]


def test_show_prints_each_executions_error_inline_a_reattempted_ones_too(
    session, installed_database_url
):
    from geneva_drive.testing import perform_next_step
    from tests.admin.apps import AdminRetries
    from tests.support.app import Order

    order = Order(status="busy")
    session.add(order)
    workflow = AdminRetries.create(session, hero=order)
    session.commit()
    perform_next_step(workflow, raise_errors=False)  # raised, reattempted: nothing failed
    session.commit()

    result = invoke(installed_database_url, "show", str(workflow.id))

    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.stdout.splitlines() if "reattempted" in line]
    assert "ConnectionError: gateway busy, try later" in row


def test_a_signal_no_step_waits_for_is_refused_with_exit_1_naming_what_the_class_waits_for(
    session, installed_database_url
):
    workflow = _awaiting_approval(session)

    typo = invoke(installed_database_url, "signal", str(workflow.id), "aproved")
    allowed = invoke(
        installed_database_url, "signal", str(workflow.id), "escalated", "--allow-unknown"
    )

    assert typo.exit_code == 1
    assert f"refused: workflow {workflow.id}: OpsApproval id={workflow.id}: signal 'aproved'" in (
        typo.stderr
    )
    assert "no step of OpsApproval waits for it; its steps wait for 'approved'" in typo.stderr
    assert allowed.exit_code == 0, allowed.output
    signals = invoke_json(installed_database_url, "show", str(workflow.id))["signals"]
    assert [s["name"] for s in signals] == ["escalated"]


def test_show_names_the_trace_id_stored_with_the_workflow_in_text_and_json(
    session, installed_database_url
):
    paused = _paused(session)
    session.execute(
        text("UPDATE geneva_drive_workflows SET trace_context = :tp WHERE id = :id"),
        {"tp": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "id": paused.id},
    )
    session.commit()

    out = invoke(installed_database_url, "show", str(paused.id)).stdout
    timeline = invoke_json(installed_database_url, "show", str(paused.id))

    assert "trace 4bf92f3577b34da6a3ce929d0e0e4736" in out
    assert timeline["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_show_of_a_workflow_without_a_trace_says_nothing_of_traces(session, installed_database_url):
    paused = _paused(session)

    out = invoke(installed_database_url, "show", str(paused.id)).stdout

    assert "trace" not in out
    assert invoke_json(installed_database_url, "show", str(paused.id))["trace_id"] is None

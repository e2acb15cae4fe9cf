"""The deploy check: in-flight rows the loaded code would strand, and what to do for each.

Rows are made to look written by other code (a renamed class, a renamed step, a hero model
not loaded) with plain SQL, as a deploy would leave them.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from sqlalchemy import event, text

from geneva_drive import StepExecution, Workflow, removed_step, step
from geneva_drive.runtime.deploy_check import LoadedCode, Problem, assess, check, log_summary
from geneva_drive.storage.db import session_factory
from geneva_drive.storage.queries.deploy import ACTIVE_STATES, InFlightGroup, in_flight_groups
from tests.support.app import Order


class DeployShipping(Workflow):
    may_proceed_without_hero = True

    @step
    def pack(self) -> None:
        pass

    removed_step("weigh")

    @step
    def ship(self) -> None:
        pass


class DeployOrderFlow(Workflow):
    @step
    def confirm(self) -> None:
        pass


def _sql(session: Any, statement: str, **params: Any) -> None:
    session.execute(text(statement), params)
    session.commit()


def _move_to_step(session: Any, workflow: Workflow, step_name: str) -> None:
    """As if the row was scheduled by code whose step had this name."""
    _sql(
        session,
        "UPDATE geneva_drive_step_executions SET step_name = :s WHERE workflow_id = :id",
        s=step_name,
        id=workflow.id,
    )
    _sql(
        session,
        "UPDATE geneva_drive_workflows SET next_step_name = :s WHERE id = :id",
        s=step_name,
        id=workflow.id,
    )


def _retype(session: Any, workflow: Workflow, column: str, value: str) -> None:
    _sql(
        session,
        f"UPDATE geneva_drive_workflows SET {column} = :v WHERE id = :id",
        v=value,
        id=workflow.id,
    )
    session.expunge(workflow)


def _report(session: Any) -> Any:
    with session.begin():
        found = check(session)
    return found


def test_rows_of_loaded_classes_at_defined_steps_strand_nothing(session):
    DeployShipping.create(session)
    DeployShipping.create(session)
    session.commit()

    report = _report(session)

    assert report.in_flight >= 2
    assert not report.stranded
    assert [f for f in report.findings if f.group.workflow_type == "DeployShipping"] == []


def test_a_row_of_a_class_no_longer_loaded_is_stranded_and_the_fix_names_workflow_type(session):
    gone = DeployShipping.create(session)
    session.commit()
    _retype(session, gone, "type", "DeployShippingOld")

    report = _report(session)

    (finding,) = [f for f in report.findings if f.group.workflow_type == "DeployShippingOld"]
    assert report.stranded and finding.stranded
    assert finding.problem is Problem.UNKNOWN_WORKFLOW_TYPE
    assert finding.group.first_id == gone.id and finding.group.state == "scheduled"
    assert "workflow_type = 'DeployShippingOld'" in finding.fix
    assert "renamed to DeployShipping?" in finding.fix


def test_a_row_at_a_renamed_step_is_stranded_and_the_fix_offers_removed_step_and_resume_at(
    session,
):
    moved = DeployShipping.create(session)
    session.commit()
    _move_to_step(session, moved, "packing")

    report = _report(session)

    (finding,) = [f for f in report.findings if f.group.step == "packing"]
    assert finding.problem is Problem.UNKNOWN_STEP and finding.stranded
    assert f"id {moved.id}" in finding.message and "DeployShipping" in finding.message
    assert "removed_step('packing')" in finding.fix
    # The bulk form, which shows what it would change first: every row of the group at once.
    assert (
        "geneva-drive resume-at pack --where type=DeployShipping --where current_step=packing"
        in finding.fix
    )


def test_a_row_at_a_gravestone_is_listed_but_strands_nothing(session):
    at_grave = DeployShipping.create(session)
    session.commit()
    _move_to_step(session, at_grave, "weigh")

    report = _report(session)

    (finding,) = [f for f in report.findings if f.group.step == "weigh"]
    assert finding.problem is Problem.REMOVED_STEP and not finding.stranded
    assert not report.stranded
    assert report.gravestone_rows == 1
    assert "removed_step gravestones" in report.summary()


def test_a_paused_workflow_at_a_gravestone_is_told_that_resume_refuses_and_skip_moves_it(
    session,
):
    paused = DeployShipping.create(session)
    session.commit()
    _move_to_step(session, paused, "weigh")
    _sql(session, "DELETE FROM geneva_drive_step_executions WHERE workflow_id = :id", id=paused.id)
    _sql(session, "UPDATE geneva_drive_workflows SET state = 'paused' WHERE id = :id", id=paused.id)

    report = _report(session)

    (finding,) = [f for f in report.findings if f.group.first_id == paused.id]
    assert finding.group.state == "paused" and finding.group.step == "weigh"
    assert "geneva-drive skip --where type=DeployShipping --where current_step=weigh" in finding.fix


def test_a_row_whose_hero_class_is_not_loaded_is_stranded(session):
    order = Order(id=41)
    session.add(order)
    session.flush()
    flow = DeployOrderFlow.create(session, hero=order)
    session.commit()
    _retype(session, flow, "hero_type", "LegacyOrder")

    report = _report(session)

    (finding,) = [f for f in report.findings if f.group.hero_type == "LegacyOrder"]
    assert finding.problem is Problem.UNKNOWN_HERO_TYPE and finding.stranded
    assert "--app" in finding.fix


def test_a_paused_workflow_is_counted_once_with_the_execution_it_keeps(session):
    kept = DeployShipping.create(session)
    session.commit()
    kept.pause()
    session.commit()

    with session.begin():
        groups = [g for g in in_flight_groups(session) if g.first_id == kept.id]

    assert [(g.step, g.state, g.count) for g in groups] == [("pack", "scheduled", 1)]


def test_a_group_stranded_twice_over_counts_its_rows_once():
    group = InFlightGroup("Gone", "GoneHero", "x", "scheduled", 3, 1)

    report = assess([group], LoadedCode(workflows={}, hero_types=()))

    assert len(report.findings) == 2
    assert report.stranded_rows == 3
    assert report.summary().startswith("3 of 3 in-flight row(s) would be stranded")


def test_the_worker_summary_is_a_warning_when_rows_are_stranded(gd, session, caplog):
    gone = DeployShipping.create(session)
    session.commit()
    _retype(session, gone, "type", "DeployVanished")
    logger = logging.getLogger("tests.deploy_check")

    with caplog.at_level(logging.INFO, logger="tests.deploy_check"):
        log_summary(session_factory(gd), logger)

    (record,) = [r for r in caplog.records if r.name == "tests.deploy_check"]
    assert record.levelno == logging.WARNING
    assert "would be stranded" in record.getMessage()


def test_a_worker_logs_the_deploy_check_summary_once_at_start(gd, session, caplog):
    from geneva_drive.runtime.worker import Worker

    DeployShipping.create(session)
    session.commit()

    with caplog.at_level(logging.INFO, logger="geneva_drive.worker"):
        Worker(config=gd, concurrency=1, poll_interval=0.05).run(
            until=lambda: True, install_signals=False
        )

    lines = [r.getMessage() for r in caplog.records if "deploy check:" in r.getMessage()]
    assert lines == ["deploy check: 1 in-flight row(s), none stranded by this code"]


def _deploy_statements(gd: Any, session: Any) -> list[tuple[str, Any]]:
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if "GROUP BY" in statement:
            sent.append((statement, parameters))

    event.listen(gd.engine, "before_cursor_execute", record)
    try:
        with session.begin():
            in_flight_groups(session)
    finally:
        event.remove(gd.engine, "before_cursor_execute", record)
    return sent


def test_each_deploy_query_reads_an_index_of_in_flight_rows_not_the_history(
    gd, session, db_backend
):
    if db_backend == "mariadb":
        pytest.skip("the plans are checked on SQLite and PostgreSQL (partial indexes)")
    for _ in range(3):
        DeployShipping.create(session)
    session.commit()
    statements = _deploy_statements(gd, session)
    assert len(statements) == 4  # three execution states, then paused workflows

    plans = []
    with gd.engine.connect() as connection:
        if db_backend == "postgresql":
            connection.exec_driver_sql("SET enable_seqscan = off")  # tiny tables: prove it can
        for statement, parameters in statements:
            explain = "EXPLAIN QUERY PLAN " if db_backend == "sqlite" else "EXPLAIN "
            rows = connection.exec_driver_sql(explain + statement, parameters).fetchall()
            plans.append(" ".join(str(r[-1]) for r in rows))

    # Any partial index of the state read serves (the planner picks among them), and any
    # index led by the workflows' state for the paused ones: never a scan of the history.
    for plan, state in zip(plans[:-1], ACTIVE_STATES, strict=True):
        used = re.findall(r"ix_geneva_drive_step_executions\w+", plan)
        assert used and used[0] in _partial_indexes(StepExecution, state), plan
    used = re.findall(r"ix_geneva_drive_workflows\w+", plans[-1])
    assert used and used[0] in _indexes_led_by_state(Workflow), plans[-1]


def _partial_indexes(model: Any, state: str) -> set[str]:
    return {
        str(index.name)
        for index in model.__table__.indexes
        if f"'{state}'" in str(index.dialect_options["postgresql"]["where"])
    }


def _indexes_led_by_state(model: Any) -> set[str]:
    return {
        str(index.name)
        for index in model.__table__.indexes
        if next(iter(index.columns)).name == "state"
    }


def test_paused_workflows_at_a_step_that_is_gone_are_told_to_resume_at_a_step_that_exists():
    group = InFlightGroup("DeployShipping", None, "packing", "paused", 2, 7)
    code = LoadedCode(workflows={"DeployShipping": DeployShipping}, hero_types=())

    (finding,) = assess([group], code).findings

    assert finding.stranded and finding.problem is Problem.UNKNOWN_STEP
    assert "resume would refuse" in finding.fix
    assert (
        "geneva-drive resume-at pack --where type=DeployShipping --where current_step=packing"
        in finding.fix
    )


def _suggested(fix: str) -> list[str]:
    """The ``geneva-drive …`` command a fix suggests, as arguments."""
    command = fix.split("geneva-drive ", 1)[1].split(";")[0]
    return command.split()


def test_a_fixs_bulk_command_selects_the_in_flight_rows_only_and_succeeds(
    session, installed_database_url
):
    from tests.ops_cli._support import invoke

    stranded = DeployShipping.create(session)
    ended = DeployShipping.create(session)
    session.commit()
    ended.cancel()
    session.commit()
    for workflow in (stranded, ended):
        _move_to_step(session, workflow, "packing")
    report = _report(session)
    (finding,) = [f for f in report.findings if f.group.step == "packing"]
    arguments = _suggested(finding.fix.split("move them there: ")[1])

    result = invoke(installed_database_url, *arguments, "--yes")

    assert arguments[:2] == ["resume-at", "pack"]
    assert "state=ready,paused" in arguments
    assert result.exit_code == 0, result.output
    assert "1 workflow(s) match" in result.stdout and "refused" not in result.output
    session.expire_all()
    assert (session.get(Workflow, stranded.id).state, session.get(Workflow, ended.id).state) == (
        "ready",
        "canceled",
    )


def test_the_fixs_commands_name_the_states_their_verb_acts_on():
    code = LoadedCode(workflows={"DeployShipping": DeployShipping}, hero_types=())
    gone = InFlightGroup("DeployGone", None, "x", "scheduled", 1, 3)
    paused = InFlightGroup("DeployShipping", None, "weigh", "paused", 1, 4)

    (unknown_type,) = assess([gone], code).findings
    (gravestone,) = assess([paused], code).findings

    assert (
        "geneva-drive cancel --where type=DeployGone --where state=ready,performing,paused"
        in unknown_type.fix
    )
    assert (
        "geneva-drive skip --where type=DeployShipping --where current_step=weigh "
        "--where state=paused" in gravestone.fix
    )

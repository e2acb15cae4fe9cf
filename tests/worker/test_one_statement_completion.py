"""Phase 3 of a chained step as one statement on PostgreSQL, with the same guarantees.

(So is phase 1's start of a claimed step: ``queries.start_both``.)

The workflow's new navigation, the completion and the next step's start go as one
``WITH … UPDATE … UPDATE … INSERT`` (``queries.complete_in_one_statement``); each part runs
only if the one before it wrote. Other databases send the three statements. Either way: a
workflow an operator changed during the body is left to the general path, and a run whose
execution was taken away writes nothing at all.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event, text

from geneva_drive import Workflow, step
from geneva_drive.engine.executor import RunOptions, claim_and_run
from tests.engine._support import history, load_elsewhere, other_session, reload
from tests.support.statements import first_words
from tests.worker.apps import WorkerScaleThreeSteps


class OneStatementPausedMidBody(Workflow):
    may_proceed_without_hero = True

    @step
    def first(self) -> None:
        with other_session() as s:  # an operator, from another process
            load_elsewhere(s, self.id).pause()
            s.commit()

    @step
    def second(self) -> None:
        pass


class OneStatementTakenAway(Workflow):
    may_proceed_without_hero = True

    @step
    def first(self) -> None:
        # Lease recovery gave this execution up while the body ran.
        with other_session() as s:
            s.execute(
                text(
                    "UPDATE geneva_drive_step_executions SET state = 'canceled' "
                    "WHERE workflow_id = :id AND step_name = 'first'"
                ),
                {"id": self.id},
            )
            s.commit()

    @step
    def second(self) -> None:
        raise AssertionError("must not start: the run that would start it was discarded")


def _run_chained(gd: Any) -> None:
    options = RunOptions(worker_id="test", chain=lambda queue: True)
    while claim_and_run(None, options, gd):
        pass


def test_each_chained_completion_is_one_statement_on_postgresql(gd, session, db_backend):
    wf = WorkerScaleThreeSteps.create(session)
    session.commit()

    key_turns: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("WITH k AS"):
            key_turns.append(statement)

    event.listen(gd.engine, "before_cursor_execute", record)
    try:
        with first_words(gd.engine) as seen:
            _run_chained(gd)
    finally:
        event.remove(gd.engine, "before_cursor_execute", record)

    assert history(session, wf) == [
        ("one", "completed", "success"),
        ("two", "completed", "success"),
        ("three", "completed", "success"),
    ]
    assert reload(session, wf).state == "finished"
    if db_backend == "postgresql":
        # The claimed first step's start, then three completions (two with the next step's
        # start, one finishing the workflow): one statement each, besides the claim — and
        # the keys' turns of the claims that found no unkeyed row (this process loads keyed
        # classes: queries.fairness), one statement each, which stamps a key if it claims.
        assert seen.count("WITH") - len(key_turns) == 4
        assert (seen.count("UPDATE"), seen.count("INSERT")) == (0, 0)
    else:
        assert seen.count("WITH") == 0
        assert seen.count("INSERT") == 2


def test_a_workflow_paused_during_the_body_is_left_to_the_general_path(gd, session):
    wf = OneStatementPausedMidBody.create(session)
    session.commit()

    _run_chained(gd)

    assert history(session, wf) == [
        ("first", "completed", "success"),
        ("second", "scheduled", None),  # kept for resume()
    ]
    assert reload(session, wf).state == "paused"


def test_a_run_whose_execution_was_taken_away_writes_nothing(gd, session):
    wf = OneStatementTakenAway.create(session)
    session.commit()

    _run_chained(gd)

    assert history(session, wf) == [("first", "canceled", None)]
    reload(session, wf)
    # As phase 1 left it: the workflow's part of the one statement was rolled back too.
    assert (wf.state, wf.current_step_name, wf.next_step_name) == ("performing", "first", "first")


def _rows(session, wf: Workflow) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every column of the workflow row and its executions, but the keys that must differ."""
    keys = {"id", "workflow_id", "continues_from_id", "hero_id"}
    workflow = (
        session.execute(text("SELECT * FROM geneva_drive_workflows WHERE id = :id"), {"id": wf.id})
        .mappings()
        .one()
    )
    executions = session.execute(
        text(
            "SELECT * FROM geneva_drive_step_executions WHERE workflow_id = :id "
            "ORDER BY created_at, id"
        ),
        {"id": wf.id},
    ).mappings()
    strip = lambda row: {k: v for k, v in row.items() if k not in keys}  # noqa: E731
    return strip(workflow), [strip(row) for row in executions]


def test_the_portable_and_the_one_statement_completer_write_the_same_rows(
    gd, session, db_backend, monkeypatch
):
    from geneva_drive.engine import writer

    fast = WorkerScaleThreeSteps.create(session)
    session.commit()
    _run_chained(gd)
    portable = WorkerScaleThreeSteps.create(session)
    session.commit()
    monkeypatch.setattr(writer, "completer_for", lambda dialect: writer.Completer())
    _run_chained(gd)

    assert _rows(session, portable) == _rows(session, fast)
    assert reload(session, portable).state == "finished"

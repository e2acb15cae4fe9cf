"""Logs an operator can follow: every record about a step names it, and the state changes
they care about are logged once, where they happen, with the reason."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest

from geneva_drive import StepNotDefinedError, Workflow, step
from geneva_drive.engine.executor import run_execution
from geneva_drive.runtime.logs import JsonFormatter
from geneva_drive.testing import perform_next_step
from tests.engine._support import current
from tests.support.app import Order

STEP_FIELDS = ("workflow_class", "workflow_id", "hero_type", "hero_id", "execution_id", "step_name")


class LogBoom(Exception):
    pass


class LogPolicyPause(Workflow):
    @step
    def first(self) -> None:
        raise LogBoom("the gateway is down")


class LogFlowPause(Workflow):
    @step
    def first(self) -> None:
        self.pause()


class LogFlowCancel(Workflow):
    @step
    def first(self) -> None:
        self.cancel()


class LogCapThenCancel(Workflow):
    @step(on_exception="reattempt", max_reattempts=1, terminal_action="cancel")
    def first(self) -> None:
        raise LogBoom("always")


class LogTimeout(Workflow):
    @step(wait_for="approved", timeout=60, on_timeout="pause")
    def approve(self) -> None:
        pass


def _start(session, cls):
    order = Order()
    session.add(order)
    wf = cls.create(session, hero=order)
    session.commit()
    return wf


def _changes(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "transition" in getattr(r, "geneva_drive", {})]


def _fields(record: logging.LogRecord) -> dict:
    return record.geneva_drive  # type: ignore[attr-defined]


def _assert_names_the_step(record: logging.LogRecord, wf, execution_id: int, name: str) -> None:
    fields = _fields(record)
    assert fields["workflow_class"] == type(wf).__name__
    assert fields["workflow_id"] == wf.id
    assert fields["hero_type"] == "Order"
    assert fields["hero_id"] == str(wf.hero_id)
    assert fields["execution_id"] == execution_id
    assert fields["step_name"] == name


def test_the_error_reporters_record_names_the_workflow_hero_execution_and_step(session, caplog):
    wf = _start(session, LogPolicyPause)
    execution_id = current(session, wf).id

    with caplog.at_level(logging.INFO, logger="geneva_drive"), pytest.raises(LogBoom):
        perform_next_step(wf)

    [record] = [r for r in caplog.records if r.name == "geneva_drive.errors"]
    _assert_names_the_step(record, wf, execution_id, "first")
    assert f"workflow_id={wf.id}" in record.getMessage()
    assert "step_name=first" in record.getMessage()


def test_a_pause_by_the_exception_policy_is_logged_once_with_its_reason(session, caplog):
    wf = _start(session, LogPolicyPause)
    execution_id = current(session, wf).id

    with caplog.at_level(logging.INFO, logger="geneva_drive"), pytest.raises(LogBoom):
        perform_next_step(wf)

    [record] = _changes(caplog)
    assert record.levelno == logging.WARNING
    assert _fields(record)["transition"] == "paused"
    assert _fields(record)["reason"] == "policy"
    assert "LogBoom" in record.getMessage()
    _assert_names_the_step(record, wf, execution_id, "first")


@pytest.mark.parametrize(
    ("cls", "transition"), [(LogFlowPause, "paused"), (LogFlowCancel, "canceled")]
)
def test_a_step_pausing_or_canceling_its_workflow_is_logged_once(session, caplog, cls, transition):
    wf = _start(session, cls)

    with caplog.at_level(logging.INFO, logger="geneva_drive"):
        perform_next_step(wf)

    [record] = _changes(caplog)
    assert (_fields(record)["transition"], _fields(record)["reason"]) == (
        transition,
        "flow_control",
    )


def test_an_operators_pause_and_cancel_are_logged_once_each(session, caplog):
    wf = _start(session, LogPolicyPause)

    with caplog.at_level(logging.INFO, logger="geneva_drive"):
        wf.pause()
        session.commit()
        wf.cancel()
        session.commit()

    assert [(_fields(r)["transition"], _fields(r)["reason"]) for r in _changes(caplog)] == [
        ("paused", "operator"),
        ("canceled", "operator"),
    ]
    assert all(_fields(r)["workflow_id"] == wf.id for r in _changes(caplog))


def test_a_rolled_back_pause_logs_nothing(session, caplog):
    wf = _start(session, LogPolicyPause)

    with caplog.at_level(logging.INFO, logger="geneva_drive"):
        wf.pause()
        session.rollback()

    assert _changes(caplog) == []


def test_an_operators_pause_is_logged_when_its_transaction_commits_not_before(session, caplog):
    wf = _start(session, LogPolicyPause)

    with caplog.at_level(logging.INFO, logger="geneva_drive"):
        wf.pause()
        before_commit = list(_changes(caplog))
        session.commit()

    assert before_commit == []
    assert [_fields(r)["transition"] for r in _changes(caplog)] == ["paused"]


def test_a_cancel_rolled_back_to_a_savepoint_logs_nothing_but_the_outer_pause_is_logged(
    session, caplog
):
    wf = _start(session, LogPolicyPause)

    with caplog.at_level(logging.INFO, logger="geneva_drive"):
        wf.pause()
        savepoint = session.begin_nested()
        wf.cancel()
        savepoint.rollback()
        session.commit()

    assert [_fields(r)["transition"] for r in _changes(caplog)] == ["paused"]


def test_a_step_missing_from_the_code_is_logged_as_the_pause_reason(session, caplog, clock):
    wf = _start(session, LogPolicyPause)
    execution = current(session, wf)
    execution.step_name = "vanished"
    session.commit()

    with caplog.at_level(logging.INFO, logger="geneva_drive"), pytest.raises(StepNotDefinedError):
        run_execution(execution.id, reraise=True)

    [record] = _changes(caplog)
    assert (_fields(record)["transition"], _fields(record)["reason"]) == ("paused", "missing_code")
    assert _fields(record)["step_name"] == "vanished"


def test_reaching_the_reattempt_cap_is_logged_with_the_terminal_action(session, caplog, clock):
    wf = _start(session, LogCapThenCancel)

    with caplog.at_level(logging.INFO, logger="geneva_drive"):
        for _ in range(2):
            with pytest.raises(LogBoom):
                perform_next_step(wf)
            clock.advance(seconds=3600)

    [record] = _changes(caplog)
    assert (_fields(record)["transition"], _fields(record)["reason"]) == (
        "canceled",
        "reattempt_cap",
    )
    assert "reattempt cap" in record.getMessage()


def test_a_timed_out_wait_is_logged_with_its_signal(session, caplog, clock):
    from tests.signals._support import run_due

    wf = _start(session, LogTimeout)
    perform_next_step(wf)  # parks, waiting for "approved"
    clock.advance(timedelta(minutes=2))

    with caplog.at_level(logging.INFO, logger="geneva_drive"):
        run_due(session)

    [record] = _changes(caplog)
    assert (_fields(record)["transition"], _fields(record)["reason"]) == ("paused", "timed_out")
    assert "'approved'" in record.getMessage()
    assert _fields(record)["step_name"] == "approve"


def test_json_lines_carry_the_context_as_fields():
    logger = logging.getLogger("geneva_drive.test_json")
    record = logger.makeRecord(
        logger.name,
        logging.WARNING,
        __file__,
        1,
        "[x] workflow paused",
        (),
        None,
        extra={"geneva_drive": {"workflow_id": 7, "step_name": "ship", "hero_id": None}},
    )

    line = json.loads(JsonFormatter().format(record))

    assert line["level"] == "WARNING"
    assert line["logger"] == "geneva_drive.test_json"
    assert line["message"] == "[x] workflow paused"
    assert line["workflow_id"] == 7
    assert line["step_name"] == "ship"
    assert "hero_id" not in line  # None fields are left out


def test_json_lines_carry_the_traceback():
    logger = logging.getLogger("geneva_drive.test_json")
    try:
        raise LogBoom("bad")
    except LogBoom as error:
        record = logger.makeRecord(
            logger.name, logging.ERROR, __file__, 1, "failed", (), (LogBoom, error, None)
        )

    line = json.loads(JsonFormatter().format(record))

    assert "LogBoom: bad" in line["exception"]

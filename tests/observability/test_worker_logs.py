"""`geneva-drive worker --log-format json`: one JSON object per line, the step's context as
fields — the error report's and the pause's alike."""

from __future__ import annotations

import json

from sqlalchemy.orm import Session

from tests.observability.traced_app import LoggedFailure
from tests.worker.test_worker_processes import Workers, db, wait_until, workers, workflow_states  # noqa: F401


def _lines(workers: Workers) -> list[dict]:  # noqa: F811
    parsed = []
    for process in workers.processes:
        for line in workers.output(process).splitlines():
            if line.startswith("{"):
                parsed.append(json.loads(line))
    return parsed


def test_json_lines_name_the_workflow_and_step_of_the_report_and_the_pause(workers, db):  # noqa: F811
    with Session(db) as session:
        wf_id = LoggedFailure.create(session).id
        session.commit()

    worker = workers.start(
        "--app", "tests.observability.traced_app", "--log-format", "json", "--log-level", "info"
    )
    wait_until(lambda: workflow_states(db, [wf_id])["paused"] == 1, "the pause", workers)
    wait_until(
        lambda: any(line.get("reason") == "policy" for line in _lines(workers)),
        "the pause's log line",
        workers,
    )
    workers.stop_all()

    text = workers.output(worker)
    assert all(line.startswith("{") for line in text.splitlines() if line.strip()), text[-2000:]
    lines = _lines(workers)
    [report] = [line for line in lines if line["logger"] == "geneva_drive.errors"]
    [paused] = [line for line in lines if line.get("transition") == "paused"]
    for line in (report, paused):
        assert line["workflow_class"] == "LoggedFailure"
        assert line["workflow_id"] == wf_id
        assert line["step_name"] == "charge"
        assert isinstance(line["execution_id"], int)
    assert "RuntimeError: card declined" in report["exception"]
    assert paused["level"] == "WARNING"
    assert paused["reason"] == "policy"

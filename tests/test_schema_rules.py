"""The schema's own rules hold on every backend, whatever the ORM does.

The uniqueness rules are partial unique indexes on PostgreSQL/SQLite and unique indexes over
generated columns on MariaDB; these tests write plain rows with SQL, so they check the database
itself, not the code that normally keeps the rules.
"""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from geneva_drive.storage import serialization
from geneva_drive.storage.models import Signal, StepExecution

NOW = datetime(2026, 3, 1, 12, 0, 0, 123456)


def _add_workflow(conn: sa.Connection, **values: Any) -> int:
    row = {
        "type": "SchemaRulesFlow",
        "hero_type": "Order",
        "hero_id": "7",
        "state": "ready",
        "allow_multiple": False,
        "created_at": NOW,
        "updated_at": NOW,
        **values,
    }
    columns = ", ".join(row)
    params = ", ".join(f":{name}" for name in row)
    conn.execute(sa.text(f"INSERT INTO geneva_drive_workflows ({columns}) VALUES ({params})"), row)
    return int(conn.execute(sa.text("SELECT MAX(id) FROM geneva_drive_workflows")).scalar_one())


def _add_execution(conn: sa.Connection, workflow_id: int, state: str, **values: Any) -> None:
    row = {
        "workflow_id": workflow_id,
        "step_name": "one",
        "state": state,
        "scheduled_for": NOW,
        "created_at": NOW,
        "updated_at": NOW,
        **values,
    }
    columns = ", ".join(row)
    params = ", ".join(f":{name}" for name in row)
    conn.execute(
        sa.text(f"INSERT INTO geneva_drive_step_executions ({columns}) VALUES ({params})"), row
    )


# --- one ongoing workflow per (class, hero) ---------------------------------------------------


def test_a_second_ongoing_workflow_for_the_same_hero_is_refused_by_the_database(engine):
    with engine.begin() as conn:
        _add_workflow(conn)
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        _add_workflow(conn, state="paused")


def test_terminal_multiple_and_hero_less_workflows_never_collide(engine):
    with engine.begin() as conn:
        _add_workflow(conn, state="finished")
        _add_workflow(conn, state="canceled")
        _add_workflow(conn)  # the one ongoing workflow for this hero
        _add_workflow(conn, allow_multiple=True)
        _add_workflow(conn, allow_multiple=True)
        _add_workflow(conn, hero_type=None, hero_id=None)
        _add_workflow(conn, hero_type=None, hero_id=None)
        _add_workflow(conn, type="SchemaRulesOtherFlow")
        _add_workflow(conn, hero_id="8")
        count = conn.execute(sa.text("SELECT COUNT(*) FROM geneva_drive_workflows")).scalar()
    assert count == 9


def test_finishing_a_workflow_frees_its_hero_for_the_next_one(engine):
    with engine.begin() as conn:
        first = _add_workflow(conn)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE geneva_drive_workflows SET state = 'finished' WHERE id = :id"),
            {"id": first},
        )
        _add_workflow(conn)
    # ... and reopening the finished one collides with its successor again.
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE geneva_drive_workflows SET state = 'ready' WHERE id = :id"),
            {"id": first},
        )


# --- one scheduled / in-progress execution per workflow ---------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [("scheduled", "scheduled"), ("scheduled", "in_progress"), ("in_progress", "in_progress")],
)
def test_a_second_active_execution_of_a_workflow_is_refused(engine, first, second):
    with engine.begin() as conn:
        workflow_id = _add_workflow(conn)
        _add_execution(conn, workflow_id, first)
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        _add_execution(conn, workflow_id, second)


def test_finished_and_waiting_executions_sit_beside_the_active_one(engine):
    with engine.begin() as conn:
        workflow_id = _add_workflow(conn)
        other_id = _add_workflow(conn, hero_id="8")
        for state in ("completed", "completed", "failed", "canceled", "skipped", "waiting"):
            _add_execution(conn, workflow_id, state)
        _add_execution(conn, workflow_id, "scheduled")
        _add_execution(conn, other_id, "scheduled")
    with engine.begin() as conn:
        # Completing the active one makes room for the next, as the executor does.
        conn.execute(
            sa.text(
                "UPDATE geneva_drive_step_executions SET state = 'completed' "
                "WHERE workflow_id = :id AND state = 'scheduled'"
            ),
            {"id": workflow_id},
        )
        _add_execution(conn, workflow_id, "in_progress")
        count = conn.execute(sa.text("SELECT COUNT(*) FROM geneva_drive_step_executions")).scalar()
    assert count == 9


# --- column types ------------------------------------------------------------------------------


def test_timestamps_keep_their_microseconds(engine):
    # Executions created within one second are ordered by (created_at, id); due times too.
    with engine.begin() as conn:
        workflow_id = _add_workflow(conn)
        _add_execution(conn, workflow_id, "completed", created_at=NOW)
        _add_execution(conn, workflow_id, "scheduled", created_at=NOW + timedelta(microseconds=1))
    with Session(engine) as session:
        created = session.execute(
            sa.select(StepExecution.created_at).order_by(StepExecution.created_at.desc())
        ).scalars()
        assert list(created) == [
            NOW.replace(tzinfo=UTC) + timedelta(microseconds=1),
            NOW.replace(tzinfo=UTC),
        ]


class SchemaRulesColour(enum.Enum):
    RED = "red"


def test_json_columns_round_trip_the_typed_codec(engine):
    value = {
        "at": datetime(2026, 3, 1, 12, 30, 15, 250000, tzinfo=UTC),
        "day": date(2026, 3, 1),
        "amount": Decimal("12.3400"),
        "key": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "wait": timedelta(minutes=90),
        "colour": SchemaRulesColour.RED,
        "text": "naïve café 🚀 — 東京",  # 4-byte UTF-8 needs utf8mb4 on MariaDB
        "nested": [1, 2.5, None, True, {"deep": ["x"]}],
        "big": 2**62,
    }
    with engine.begin() as conn:
        workflow_id = _add_workflow(conn)
    with Session(engine) as session:
        execution = StepExecution(
            workflow_id=workflow_id,
            step_name="one",
            state="completed",
            scheduled_for=NOW.replace(tzinfo=UTC),
            cursor=serialization.encode(value),
            metadata_json={"exception": {"message": value["text"]}},
        )
        signal = Signal(
            workflow_id=workflow_id, name="go", payload_json=serialization.encode(value)
        )
        session.add_all([execution, signal])
        session.commit()
        ids = execution.id, signal.id

    with Session(engine) as session:
        execution = session.get_one(StepExecution, ids[0])
        signal = session.get_one(Signal, ids[1])
        assert execution.cursor_value == value
        assert signal.payload == value
        assert execution.exception_info == {"message": value["text"]}


def test_an_error_backtrace_longer_than_64_kib_is_stored_whole(engine):
    backtrace = "Traceback (most recent call last):\n" + "  frame ✓\n" * 20_000  # ~220 KB
    with engine.begin() as conn:
        workflow_id = _add_workflow(conn)
        _add_execution(
            conn,
            workflow_id,
            "failed",
            error_message="m" * 70_000,
            error_backtrace=backtrace,
        )
    with engine.connect() as conn:
        stored = conn.execute(
            sa.text("SELECT error_message, error_backtrace FROM geneva_drive_step_executions")
        ).one()
    assert stored == ("m" * 70_000, backtrace)


def test_strings_compare_exactly_so_keys_differing_in_case_are_distinct(engine):
    with engine.begin() as conn:
        workflow_id = _add_workflow(conn)
        for key in ("evt-A", "evt-a", "évt-a"):
            conn.execute(
                sa.text(
                    "INSERT INTO geneva_drive_signals "
                    "(workflow_id, name, idempotency_key, state, claimed, consumed, "
                    "created_at, updated_at) "
                    "VALUES (:wf, 'paid', :key, 'pending', 0, 0, :now, :now)"
                ),
                {"wf": workflow_id, "key": key, "now": NOW},
            )
        found = conn.execute(
            sa.text(
                "SELECT idempotency_key FROM geneva_drive_signals WHERE idempotency_key = 'evt-a'"
            )
        ).scalars()
        assert list(found) == ["evt-a"]
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO geneva_drive_signals "
                "(workflow_id, name, idempotency_key, state, claimed, consumed, "
                "created_at, updated_at) "
                "VALUES (:wf, 'paid', 'evt-a', 'pending', 0, 0, :now, :now)"
            ),
            {"wf": workflow_id, "now": NOW},
        )


# --- foreign keys ------------------------------------------------------------------------------


def test_deleting_a_workflow_deletes_its_executions_and_signals(engine):
    with engine.begin() as conn:
        doomed = _add_workflow(conn)
        kept = _add_workflow(conn, hero_id="8")
        for workflow_id in (doomed, kept):
            _add_execution(conn, workflow_id, "completed")
            conn.execute(
                sa.text(
                    "INSERT INTO geneva_drive_signals "
                    "(workflow_id, name, state, claimed, consumed, created_at, updated_at) "
                    "VALUES (:wf, 'paid', 'pending', 0, 0, :now, :now)"
                ),
                {"wf": workflow_id, "now": NOW},
            )
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM geneva_drive_workflows WHERE id = :id"), {"id": doomed})
        left = {
            table: set(conn.execute(sa.text(f"SELECT workflow_id FROM {table}")).scalars())
            for table in ("geneva_drive_step_executions", "geneva_drive_signals")
        }
    assert left == {"geneva_drive_step_executions": {kept}, "geneva_drive_signals": {kept}}


def test_an_execution_of_a_missing_workflow_is_refused(engine):
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        _add_execution(conn, 999_999, "completed")

"""Delivering a signal: validation, deduplication, terminal workflows, buffering, dispatch."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import select, text

from geneva_drive import (
    Signal,
    SignalPayloadTooLargeError,
    Workflow,
    WorkflowNotOngoing,
    configure,
    step,
)
from geneva_drive.core.settings import settings
from geneva_drive.definition.steps import SignalMatcher
from geneva_drive.storage.db import session_factory
from geneva_drive.testing import assert_waiting_for_signal, perform_next_step
from tests.engine._support import RecordingBackend, current, history, other_session
from tests.signals._support import drive, notes, reload, signal_row, signals_of, start
from tests.support.app import AuditEntry


class SigDeliveryApproval(Workflow):
    job_options = {"queue": "signals", "priority": 7}

    @step(wait_for="approved", job_options={"priority": 3})
    def approve(self) -> None:
        payload = self.received_signal.payload
        self.session.add(AuditEntry(order_id=self.hero.id, note=f"approved {payload!r}"))

    @step
    def done(self) -> None:
        pass


def _explode(workflow, payload):
    raise RuntimeError("matcher blew up")


class SigDeliveryExplodingMatcher(Workflow):
    @step(wait_for=SignalMatcher("approved", _explode))
    def approve(self) -> None:
        pass


def _parked(session, cls=SigDeliveryApproval):
    wf = start(session, cls)
    perform_next_step(wf)
    assert_waiting_for_signal(wf, "approved")
    return wf


# -- validation, before anything is written -------------------------------------------------


@pytest.mark.parametrize("name", ["", "   ", None, 7, "x" * 256])
def test_a_blank_or_invalid_signal_name_is_refused_and_nothing_is_written(session, name):
    wf = start(session, SigDeliveryApproval)

    with pytest.raises(ValueError, match="signal\\(\\) needs a signal name"):
        wf.signal(name)

    assert signals_of(session, wf) == []


def test_an_oversized_payload_is_refused_before_anything_is_written(session):
    wf = _parked(session)
    configure(max_signal_payload_size=100)

    with pytest.raises(SignalPayloadTooLargeError, match="max_signal_payload_size=100") as info:
        wf.signal("approved", payload={"blob": "x" * 200})

    assert "SigDeliveryApproval" in str(info.value)
    session.rollback()
    assert signals_of(session, wf) == []
    assert current(session, wf).state == "waiting"


def test_a_payload_exactly_at_the_limit_is_accepted(session):
    wf = _parked(session)
    payload = {"blob": "x" * 10}
    configure(max_signal_payload_size=len('{"blob":"xxxxxxxxxx"}'))

    signal = wf.signal("approved", payload=payload)
    session.commit()

    assert signal.payload == payload


# -- deduplication --------------------------------------------------------------------------


def test_a_duplicate_delivery_returns_the_first_row_with_its_payload_and_wakes_nothing(session):
    wf = start(session, SigDeliveryApproval)
    first = wf.signal("approved", payload={"n": 1}, idempotency_key="evt_1")
    session.commit()
    assert first.duplicate_delivery is False

    second = wf.signal("approved", payload={"n": 2}, idempotency_key="evt_1")
    session.commit()

    assert second.duplicate_delivery is True
    assert second.id == first.id
    assert second.payload == {"n": 1}  # the first payload wins
    assert [(s.name, s.payload) for s in signals_of(session, wf)] == [("approved", {"n": 1})]


def test_a_duplicate_delivery_to_a_parked_step_does_not_claim_twice(session):
    wf = _parked(session)
    wf.signal("approved", payload={"n": 1}, idempotency_key="evt_1")
    session.commit()
    woken = current(session, wf)

    duplicate = wf.signal("approved", payload={"n": 2}, idempotency_key="evt_1")
    session.commit()

    assert duplicate.duplicate_delivery is True
    assert signal_row(session, wf, "approved") == ("claimed", 1, 0)
    assert current(session, wf).id == woken.id
    drive(wf)
    assert notes(session, wf) == ["approved {'n': 1}"]


def test_signals_without_a_key_never_deduplicate_and_the_older_is_delivered_first(session):
    wf = start(session, SigDeliveryApproval)
    wf.signal("approved", payload="older")
    wf.signal("approved", payload="newer")
    session.commit()

    drive(wf)

    assert notes(session, wf) == ["approved 'older'"]
    assert [(s.payload, s.state) for s in signals_of(session, wf)] == [
        ("older", "consumed"),
        ("newer", "pending"),
    ]


def test_the_same_key_under_another_name_or_on_another_workflow_is_another_signal(session):
    wf = start(session, SigDeliveryApproval)
    other = start(session, SigDeliveryApproval)

    delivered = [
        wf.signal("approved", idempotency_key="k"),
        wf.signal("rejected", idempotency_key="k", allow_unknown=True),
        other.signal("approved", idempotency_key="k"),
    ]
    flags = [s.duplicate_delivery for s in delivered]
    session.commit()

    assert flags == [False, False, False]
    assert len({s.id for s in delivered}) == 3


def test_the_idempotency_key_is_stored_as_a_string(session):
    wf = start(session, SigDeliveryApproval)
    first = wf.signal("approved", idempotency_key=12345)
    again = wf.signal("approved", idempotency_key="12345")
    session.commit()

    assert first.idempotency_key == "12345"
    assert again.duplicate_delivery is True


def test_a_duplicate_delivery_leaves_the_callers_transaction_usable(session):
    wf = start(session, SigDeliveryApproval)
    wf.signal("approved", idempotency_key="evt_1")
    session.commit()

    wf.signal("approved", idempotency_key="evt_1")
    session.add(AuditEntry(order_id=int(wf.hero_id), note="written after the duplicate"))
    session.commit()

    assert notes(session, wf) == ["written after the duplicate"]


def _wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        threading.Event().wait(0.01)


def test_a_sender_racing_an_uncommitted_row_with_its_key_returns_that_row_and_keeps_going(
    session, db_backend
):
    """Another session holds an uncommitted signal with the same key; our sender waits for it
    (the row lock, or the unique index if it got past the lock) and, once it commits, gets
    that row back as a duplicate — with its own transaction still usable."""
    wf = start(session, SigDeliveryApproval)
    hero_id = int(wf.hero_id)
    results: dict[str, object] = {}

    def loser() -> None:
        with other_session() as s:
            try:
                mine = s.get(Workflow, wf.id)
                got = mine.signal("approved", payload={"from": "loser"}, idempotency_key="evt")
                results["duplicate"] = got.duplicate_delivery
                results["payload"] = got.payload
                s.add(AuditEntry(order_id=hero_id, note="loser kept going"))
                s.commit()
            except BaseException as error:  # surfaced by the assertions below
                results["error"] = error

    with other_session() as winner:
        if db_backend == "postgresql":
            # The winner writes its row without the workflow lock (think: an older sender)
            # and holds it uncommitted until the loser is blocked behind it.
            winner.add(
                Signal(
                    workflow_id=wf.id,
                    name="approved",
                    idempotency_key="evt",
                    payload_json={"from": "winner"},
                )
            )
            winner.flush()
            pid = winner.execute(text("select pg_backend_pid()")).scalar_one()
            thread = threading.Thread(target=loser)
            thread.start()

            def loser_blocked() -> bool:
                with other_session() as probe:
                    return bool(
                        probe.execute(
                            text(
                                "select count(*) from pg_locks l join pg_locks h "
                                "on h.transactionid = l.transactionid "
                                "where not l.granted and h.granted and h.pid = :pid"
                            ),
                            {"pid": pid},
                        ).scalar_one()
                    )

            _wait_for(loser_blocked, "the loser to block on the winner's row")
            winner.commit()
            thread.join(timeout=30)
        else:
            # SQLite has one writer at a time: the race is serialised, the winner first.
            winner.add(
                Signal(
                    workflow_id=wf.id,
                    name="approved",
                    idempotency_key="evt",
                    payload_json={"from": "winner"},
                )
            )
            winner.commit()
            thread = threading.Thread(target=loser)
            thread.start()
            thread.join(timeout=30)

    assert "error" not in results, results.get("error")
    assert results == {"duplicate": True, "payload": {"from": "winner"}}
    assert [s.payload for s in signals_of(session, wf)] == [{"from": "winner"}]
    assert notes(session, wf) == ["loser kept going"]


def test_two_senders_racing_with_the_same_key_store_one_signal_and_wake_the_step_once(session, gd):
    wf = _parked(session)
    barrier = threading.Barrier(2)
    outcomes: list[object] = []

    def sender(n: int) -> None:
        with session_factory(gd)() as s:
            barrier.wait(timeout=30)
            try:
                got = s.get(Workflow, wf.id).signal(
                    "approved", payload={"n": n}, idempotency_key="evt"
                )
                s.commit()
                outcomes.append(got.duplicate_delivery)
            except BaseException as error:
                outcomes.append(error)

    threads = [threading.Thread(target=sender, args=(n,)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert sorted(outcomes, key=str) == [False, True]
    assert signal_row(session, wf, "approved") == ("claimed", 1, 0)
    assert current(session, wf).state == "scheduled"


# -- finished and canceled workflows --------------------------------------------------------


def test_a_new_signal_to_a_finished_workflow_raises_workflow_not_ongoing(session):
    wf = start(session, SigDeliveryApproval)
    wf.signal("approved")
    session.commit()
    drive(wf)
    assert reload(session, wf).state == "finished"

    with pytest.raises(WorkflowNotOngoing, match="cannot deliver signal 'late' to a finished"):
        wf.signal("late", allow_unknown=True)

    session.rollback()
    assert [s.name for s in signals_of(session, wf)] == ["approved"]


def test_a_new_signal_to_a_canceled_workflow_raises_and_writes_nothing(session):
    wf = _parked(session)
    wf.cancel()
    session.commit()

    with pytest.raises(WorkflowNotOngoing, match="canceled workflow"):
        wf.signal("approved", idempotency_key="new")

    session.rollback()
    assert signals_of(session, wf) == []


def test_redelivering_a_known_key_to_a_finished_workflow_returns_the_original(session):
    wf = start(session, SigDeliveryApproval)
    original = wf.signal("approved", payload={"n": 1}, idempotency_key="evt_1")
    session.commit()
    drive(wf)

    again = wf.signal("approved", payload={"n": 2}, idempotency_key="evt_1")

    assert again.duplicate_delivery is True
    assert again.id == original.id
    assert again.payload == {"n": 1}


# -- paused workflows buffer ----------------------------------------------------------------


def test_a_signal_to_a_paused_workflow_is_buffered_and_resume_delivers_it(session):
    wf = _parked(session)
    parked_id = current(session, wf).id
    wf.pause()
    session.commit()

    wf.signal("approved", payload="while paused")
    session.commit()
    assert signal_row(session, wf, "approved") == ("pending", 0, 0)
    assert current(session, wf).state == "waiting"

    resumed = wf.resume()
    session.commit()

    assert resumed.id == parked_id
    assert current(session, wf).state == "scheduled"
    assert signal_row(session, wf, "approved") == ("claimed", 1, 0)
    drive(wf)
    assert notes(session, wf) == ["approved 'while paused'"]
    assert signal_row(session, wf, "approved") == ("consumed", 1, 1)


def test_resume_without_a_matching_signal_leaves_the_step_parked(session):
    wf = _parked(session)
    wf.pause()
    session.commit()
    wf.signal("something_else", allow_unknown=True)  # no step waits for it
    session.commit()

    wf.resume()
    session.commit()

    assert reload(session, wf).state == "ready"
    assert_waiting_for_signal(wf, "approved")
    assert signal_row(session, wf, "something_else") == ("pending", 0, 0)


def test_a_workflow_paused_between_dispatch_and_the_woken_run_keeps_the_signal_for_resume(
    session,
):
    wf = _parked(session)
    wf.signal("approved", payload="p")
    session.commit()
    wf.pause()
    session.commit()

    perform_next_step(wf)  # the woken job meets a paused workflow: nothing runs
    assert current(session, wf).state == "scheduled"
    wf.resume()
    session.commit()
    drive(wf)

    assert notes(session, wf) == ["approved 'p'"]
    assert signal_row(session, wf, "approved") == ("consumed", 1, 1)


# -- dispatch -------------------------------------------------------------------------------


def test_a_dispatch_that_raises_rolls_back_the_delivery_and_keeps_the_transaction_usable(
    session,
):
    wf = _parked(session, SigDeliveryExplodingMatcher)

    with pytest.raises(RuntimeError, match="matcher blew up"):
        wf.signal("approved", idempotency_key="evt")
    session.add(AuditEntry(order_id=int(wf.hero_id), note="after the failed delivery"))
    session.commit()

    assert signals_of(session, wf) == []
    assert current(session, wf).state == "waiting"
    assert notes(session, wf) == ["after the failed delivery"]


def test_rolling_back_the_senders_transaction_undoes_the_signal_and_the_wake_up(session):
    wf = _parked(session)
    parked_id = current(session, wf).id

    wf.signal("approved")
    session.rollback()

    assert signals_of(session, wf) == []
    assert current(session, wf).id == parked_id
    assert current(session, wf).state == "waiting"


def test_a_wake_up_is_enqueued_after_commit_with_the_merged_job_options(session, gd):
    backend = RecordingBackend()
    wf = _parked(session)
    wf.step_job_options = {"queue": "vip"}
    session.commit()
    configure(backend=backend)

    wf.signal("approved")
    assert backend.enqueued == []  # nothing before the commit
    session.commit()

    (woken,) = backend.enqueued
    assert woken.execution_id == current(session, wf).id
    assert woken.step_name == "approve"
    assert woken.scheduled_for == settings().clock.now()
    assert woken.job_options == {"queue": "vip", "priority": 3}


def test_a_buffered_signal_enqueues_nothing(session):
    backend = RecordingBackend()
    wf = start(session, SigDeliveryApproval)
    wf.step_job_options = {"queue": "vip"}
    perform_next_step(wf)
    wf.pause()
    session.commit()
    configure(backend=backend)

    wf.signal("approved")
    session.commit()

    assert backend.enqueued == []


def test_a_signal_arriving_before_the_step_exists_waits_in_the_table(session, clock):
    class_ = SigDeliveryApproval
    wf = start(session, class_)
    wf.signal("approved", payload="early")
    session.commit()
    assert signal_row(session, wf, "approved") == ("pending", 0, 0)

    drive(wf)

    assert notes(session, wf) == ["approved 'early'"]
    assert history(session, wf) == [
        ("approve", "completed", "success"),
        ("done", "completed", "success"),
    ]


def test_signals_are_deleted_with_their_workflow(session):
    wf = start(session, SigDeliveryApproval)
    wf.signal("approved")
    session.commit()
    workflow_id = wf.id

    session.delete(wf)
    session.commit()

    left = session.execute(select(Signal).where(Signal.workflow_id == workflow_id)).all()
    assert left == []


def test_the_configured_clock_stamps_claims(session, clock):
    wf = _parked(session)
    clock.advance(timedelta(minutes=5))

    wf.signal("approved")
    session.commit()

    (row,) = signals_of(session, wf)
    assert row.claimed_at == clock.now()

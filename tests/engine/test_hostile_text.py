"""Issue 35: hostile text gets one rule on every database.

PostgreSQL cannot store NUL (``\\x00``) in text or JSON, and no driver encodes a lone surrogate
(``\\ud800``) as UTF-8. Before: a payload with NUL raised a raw DataError on PostgreSQL (leaving
the caller's transaction unusable) while SQLite and MariaDB stored it; a step raising
``ValueError("a\\x00b")`` stranded its execution ``in_progress`` on PostgreSQL.

The rule (``geneva_drive.core.text``): values the caller chose are refused with
:class:`UnstorableTextError` before any SQL runs; text the engine records on its own (a step's
error class, message and backtrace) is escaped; read-only filters refuse it as admin input.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import make_transient_to_detached

from geneva_drive import (
    ExceptionPolicy,
    SerializationError,
    Signal,
    StepExecution,
    UnstorableTextError,
    Workflow,
    admin,
    resumable_step,
    step,
)
from geneva_drive.admin import AdminInputError, WorkflowFilter
from geneva_drive.core.text import sanitised
from geneva_drive.storage.models import OperatorAction
from geneva_drive.testing import perform_next_step
from tests.engine._support import executions, reload
from tests.support.app import Account, Order
from tests.support.statements import first_words

NUL = "a\x00b"
SURROGATE = "a\ud800b"
HOSTILE = pytest.mark.parametrize("text", [NUL, SURROGATE], ids=["nul", "lone-surrogate"])


class HostileWaits(Workflow):
    may_proceed_without_hero = True

    @step(wait_for="paid")
    def capture(self) -> None:
        pass


class HostileAccountFlow(Workflow):
    @step
    def first(self) -> None:
        pass


def _raise_in_named_frame(name: str) -> Any:
    def body(wf: Workflow) -> None:
        raise RuntimeError("plain message")

    body.__code__ = body.__code__.replace(co_name=name)
    return body


class HostileRaises(Workflow):
    may_proceed_without_hero = True
    message = NUL

    @step
    def boom(self) -> None:
        raise ValueError(type(self).message)


class HostileReattempts(Workflow):
    may_proceed_without_hero = True

    @step(on_exception=ExceptionPolicy("reattempt", max_reattempts=3))
    def boom(self) -> None:
        raise ValueError(NUL)


class HostileTraceback(Workflow):
    may_proceed_without_hero = True
    boom = step(_raise_in_named_frame("frame\x00name"), name="boom")


class HostileErrorClass(Workflow):
    may_proceed_without_hero = True

    @step
    def boom(self) -> None:
        error_class = type("BadError", (Exception,), {})
        error_class.__qualname__ = "Bad\x00Error"  # type() refuses NUL; this does not
        raise error_class("x")


class HostileNote(Workflow):
    may_proceed_without_hero = True

    @step
    def boom(self) -> None:
        error = RuntimeError("fine")
        error.add_note("note with \ud800 and \x00")
        raise error


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


class HostileUnprintable(Workflow):
    may_proceed_without_hero = True

    @step
    def boom(self) -> None:
        raise _Unprintable()


class HostileLongClass(Workflow):
    may_proceed_without_hero = True

    @step
    def boom(self) -> None:
        error_class = type("LongError", (Exception,), {})
        error_class.__qualname__ = "Long" * 100  # deeply nested classes get there
        raise error_class("x")


class HostileCursor(Workflow):
    may_proceed_without_hero = True

    @resumable_step
    def walk(self, it: Any) -> None:
        it.set({"after": NUL})
        it.checkpoint()


def _started(session: Any, cls: type[Workflow] = HostileWaits) -> Workflow:
    wf = cls.create(session, hero=None)
    session.commit()
    return wf


def _count(session: Any, model: Any) -> int:
    return int(session.execute(select(func.count()).select_from(model)).scalar_one())


def _usable(session: Any, wf: Workflow) -> None:
    """The caller's transaction goes on: a good signal after the refusal commits."""
    wf.signal("paid", payload={"ok": True})
    session.commit()
    assert [s.payload for s in session.scalars(select(Signal))] == [{"ok": True}]


# -- values the caller chose are refused, before any SQL, the same on every database ----------


@HOSTILE
@pytest.mark.parametrize(
    "call, where",
    [
        (lambda wf, t: wf.signal("paid", payload={"items": [{"note": t}]}), r"\['items'\]\[0\]"),
        (lambda wf, t: wf.signal("paid", payload={t: 1}), r"dict key"),
        (lambda wf, t: wf.signal("paid", payload=t), r"payload"),
        (lambda wf, t: wf.signal(t), r"signal name"),
        (lambda wf, t: wf.signal("paid", idempotency_key=t), r"idempotency_key"),
    ],
    ids=["payload-value", "payload-key", "payload-string", "name", "idempotency-key"],
)
def test_a_signal_with_unstorable_text_is_refused_before_any_sql_and_the_session_goes_on(
    session, engine, text, call, where
):
    wf = _started(session)
    with first_words(engine) as sent, pytest.raises(UnstorableTextError) as refused:
        call(wf, text)
    message = str(refused.value)
    assert f"HostileWaits id={wf.id}" in message
    assert "position 1" in message
    assert "every database" in message
    assert __import__("re").search(where, message)
    assert isinstance(refused.value, ValueError) and isinstance(refused.value, SerializationError)
    assert sent == []  # nothing reached the database
    assert _count(session, Signal) == 0
    _usable(session, wf)


@HOSTILE
def test_metadata_with_unstorable_text_is_refused_naming_the_workflow_and_key(session, text):
    wf = _started(session)
    with pytest.raises(UnstorableTextError, match=rf"HostileWaits id={wf.id}: write_metadata"):
        wf.write_metadata("note", {"text": text})
    with pytest.raises(UnstorableTextError, match=r"dict key"):
        wf.write_metadata("note", {text: 1})
    session.commit()
    assert reload(session, wf).metadata_json is None
    _usable(session, wf)


@HOSTILE
@pytest.mark.parametrize(
    "options", [lambda t: {"queue": t}, lambda t: {"priority": 1, "queue": "q", t: 1}]
)
def test_create_with_unstorable_step_job_options_writes_nothing(session, engine, text, options):
    with first_words(engine) as sent, pytest.raises(UnstorableTextError, match="HostileWaits"):
        HostileWaits.create(session, hero=None, step_job_options=options(text))
    assert sent == []
    assert _count(session, Workflow) == 0
    _usable(session, _started(session))


@HOSTILE
@pytest.mark.parametrize("many", [False, True], ids=["create", "create_many"])
def test_a_hero_whose_key_holds_unstorable_text_is_refused_at_create(session, engine, text, many):
    # A hero loaded from another database (SQLite stores NUL in a key): its key cannot be
    # stored in ours.
    hero = Account(id=text)
    make_transient_to_detached(hero)
    with (
        first_words(engine) as sent,
        pytest.raises(
            UnstorableTextError,
            match=r"HostileAccountFlow\.create(_many)?\(hero=\.\.\.\): .*position 1",
        ),
    ):
        if many:
            HostileAccountFlow.create_many(session, heroes=[hero])
        else:
            HostileAccountFlow.create(session, hero=hero)
    assert sent == []
    assert _count(session, Workflow) == 0
    _usable(session, _started(session))


def test_a_cursor_with_nul_fails_the_step_cleanly_and_records_why(session):
    wf = _started(session, HostileCursor)
    execution = perform_next_step(wf, raise_errors=False)
    assert (execution.state, execution.outcome) == ("failed", "failed")
    assert execution.error_class_name == "geneva_drive.core.errors.UnstorableTextError"
    assert "position 1" in execution.error_message
    assert execution.cursor is None
    assert reload(session, wf).state == "paused"


# -- text the engine records on its own is escaped: a step's error never strands it ----------


@pytest.mark.parametrize(
    "message, stored", [(NUL, "a\\x00b"), (SURROGATE, "a\\ud800b")], ids=["nul", "lone-surrogate"]
)
def test_a_step_raising_a_message_with_unstorable_text_is_recorded_and_paused(
    session, message, stored, monkeypatch
):
    monkeypatch.setattr(HostileRaises, "message", message)
    wf = _started(session, HostileRaises)
    perform_next_step(wf, raise_errors=False)
    [execution] = executions(session, wf)
    assert (execution.state, execution.outcome) == ("failed", "failed")
    assert execution.error_class_name == "ValueError"
    assert execution.error_message == stored
    assert f"ValueError: {stored}" in execution.error_backtrace
    assert execution.exception_info["message"] == stored
    assert reload(session, wf).state == "paused"  # the default policy, as for any error


def test_a_step_error_with_nul_is_handled_by_its_exception_policy(session):
    wf = _started(session, HostileReattempts)
    perform_next_step(wf, raise_errors=False)
    history = executions(session, wf)
    assert [(e.state, e.outcome) for e in history] == [
        ("completed", "reattempted"),
        ("scheduled", None),
    ]
    assert history[0].exception_info["message"] == "a\\x00b"
    assert reload(session, wf).state == "ready"


@pytest.mark.parametrize(
    "cls, column, stored",
    [
        (HostileTraceback, "error_backtrace", "in frame\\x00name"),
        (HostileErrorClass, "error_class_name", "Bad\\x00Error"),
        (HostileNote, "error_backtrace", "note with \\ud800 and \\x00"),
    ],
    ids=["frame-name", "error-class", "exception-note"],
)
def test_unstorable_text_elsewhere_in_a_step_error_is_escaped_too(session, cls, column, stored):
    wf = _started(session, cls)
    perform_next_step(wf, raise_errors=False)
    [execution] = executions(session, wf)
    assert (execution.state, execution.outcome) == ("failed", "failed")
    assert stored in getattr(execution, column)
    assert reload(session, wf).state == "paused"


def test_a_step_error_whose_str_raises_is_recorded_with_a_stand_in_message(session):
    wf = _started(session, HostileUnprintable)
    perform_next_step(wf, raise_errors=False)
    [execution] = executions(session, wf)
    assert (execution.state, execution.outcome) == ("failed", "failed")
    assert execution.error_message == "<_Unprintable.__str__ raised RuntimeError>"
    assert reload(session, wf).state == "paused"


def test_a_step_error_class_name_longer_than_its_column_is_cut_not_stranded(session):
    wf = _started(session, HostileLongClass)
    perform_next_step(wf, raise_errors=False)
    [execution] = executions(session, wf)
    assert (execution.state, execution.outcome) == ("failed", "failed")
    assert len(execution.error_class_name) == 255
    assert execution.error_class_name.startswith("tests.engine.test_hostile_text.LongLong")
    assert execution.error_class_name.endswith("…")
    assert reload(session, wf).state == "paused"


def test_sanitising_escapes_as_repr_would_and_leaves_other_text_alone():
    assert sanitised("plain é ✓") == "plain é ✓"
    assert sanitised("\x00\ud800\udfff") == "\\x00\\ud800\\udfff"
    assert sanitised("a😀b") == "a😀b"  # a proper pair is one character, not two surrogates


# -- the admin API: operator text is refused, filters with it are admin input errors ---------


@HOSTILE
@pytest.mark.parametrize("field", ["actor", "reason"])
def test_an_operator_action_with_unstorable_actor_or_reason_is_refused(session, text, field):
    wf = _started(session)
    args = {"actor": "alice", "reason": "why", field: text}
    with pytest.raises(AdminInputError, match=rf"{field} .*position 1"):
        admin.pause(session, wf.id, **args)
    session.commit()
    assert _count(session, OperatorAction) == 0
    assert reload(session, wf).state == "ready"


@HOSTILE
def test_an_admin_signal_with_unstorable_text_is_an_admin_input_error(session, text):
    wf = _started(session)
    with pytest.raises(AdminInputError, match=rf"HostileWaits id={wf.id}.*position 1"):
        admin.signal(session, wf.id, "paid", payload={"x": text}, actor="alice")
    with pytest.raises(AdminInputError, match="idempotency_key"):
        admin.signal(session, wf.id, "paid", key=text, actor="alice")
    session.commit()
    assert _count(session, Signal) == 0
    assert _count(session, OperatorAction) == 0


@pytest.mark.parametrize(
    "field",
    ["workflow_type", "hero_type", "hero_id", "current_step", "error_class", "awaiting_signal"],
)
def test_a_filter_with_unstorable_text_is_an_admin_input_error_naming_the_field(session, field):
    _started(session)
    with pytest.raises(AdminInputError, match=rf"{field}=.*NUL"):
        admin.find(session, WorkflowFilter(**{field: NUL}))  # type: ignore[arg-type]
    with pytest.raises(AdminInputError, match=r"workflow_type=.*NUL"):
        WorkflowFilter(workflow_type=("HostileWaits", NUL))
    assert _count(session, Workflow) == 1  # the session is usable still


def test_a_parsed_filter_with_nul_is_an_admin_input_error():
    with pytest.raises(AdminInputError, match=r"hero_id=.*NUL"):
        WorkflowFilter.parse(["hero=Order:4\x002"])
    with pytest.raises(AdminInputError, match=r"current_step=.*NUL"):
        WorkflowFilter.parse(["step=a\x00"])


def test_an_order_hero_is_untouched_by_the_rule(session):
    # Integer keys and ordinary text pass as before.
    order = Order()
    session.add(order)
    wf = HostileAccountFlow.create(session, hero=order)
    wf.write_metadata("note", {"text": "tab\tnewline\nemoji 😀"})
    session.commit()
    assert reload(session, wf).read_metadata("note") == {"text": "tab\tnewline\nemoji 😀"}
    assert _count(session, StepExecution) == 1

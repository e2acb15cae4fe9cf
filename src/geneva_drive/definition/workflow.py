"""``Workflow``: the mapped, polymorphic base class users subclass, and its class-level DSL.

A subclass is a single-table-inheritance identity (its class name unless ``workflow_type`` is
set). Its steps, policies, cancel conditions and job options are gathered when the class is
created; every mistake in them raises ``StepConfigurationError`` right there.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar, cast

from sqlalchemy.orm import Mapper, Session, column_property, object_session

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

from geneva_drive.core import text
from geneva_drive.core.errors import (
    InvalidStateError,
    MetadataTooLargeError,
    SerializationError,
    StepConfigurationError,
    StepNotDefinedError,
)
from geneva_drive.core.events import workflow_logger
from geneva_drive.core.settings import settings, settings_of
from geneva_drive.core.states import ExecutionState, Outcome, WorkflowState
from geneva_drive.definition import limits as step_limits
from geneva_drive.definition.async_bridge import async_session_of, refuse_async_session, run_on
from geneva_drive.definition.callables import (
    is_async_generator,
    is_coroutine_function,
    signature_problem,
)
from geneva_drive.definition.fairness import check_fairness_key
from geneva_drive.definition.flow import Action, FlowControl
from geneva_drive.definition.job_options import checked_step_job_options, job_option_problem
from geneva_drive.definition.limits import ConcurrencyLimit, StepLimits, check_limit
from geneva_drive.definition.policy import ExceptionPolicy
from geneva_drive.definition.ports import StartResult, verbs
from geneva_drive.definition.schedule import Schedule
from geneva_drive.definition.steps import StepCollection, StepDefinition, validate_job_options
from geneva_drive.definition.until import checked_until
from geneva_drive.storage import queries, serialization
from geneva_drive.storage.heroes import resolve_hero_class
from geneva_drive.storage.limits import MAX_WORKFLOW_TYPE, duration_problem
from geneva_drive.storage.models import (
    Base,
    Signal,
    StepExecution,
    WorkflowColumns,
    workflows_table,
)
from geneva_drive.storage.values import size_of

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

Hook = Callable[..., Any]
_T = TypeVar("_T")
W = TypeVar("W", bound="Workflow")
CHILD_KEYS = "_gd_child_keys"  # the keys start_child() used in the current run of a step


class _FallbackIdentities(dict[Any, Mapper[Any]]):
    """Polymorphic map that loads rows of vanished classes as the base ``Workflow``.

    A deploy that deletes a workflow class must not make its rows unloadable: they stay
    inspectable, and their steps fail as "not defined" (which pauses them) instead of crashing.
    """

    base: Mapper[Any]

    def __missing__(self, key: Any) -> Mapper[Any]:
        return self.base


def _accept_vanished_identities(base: Mapper[Any]) -> None:
    """Let the base mapper flush the rows ``_FallbackIdentities`` loaded as ``Workflow``.

    Before each flush SQLAlchemy checks that an instance's ``type`` is an identity of its own
    mapper or a descendant, and warns ("incompatible polymorphic identity") when pausing or
    canceling such a row: it cannot know that this map loads and refreshes any unknown identity
    as the base. So on the base mapper only, an identity no class claims passes; every other
    instance keeps SQLAlchemy's check. Subclass mappers copy this validator when they are
    created, hence the ``mapper is base`` test.
    """
    validate = base._validate_polymorphic_identity
    key = base._polymorphic_attr_key
    if validate is None or key is None:
        raise RuntimeError("Workflow's mapper has no polymorphic validator to wrap")

    def validate_known_identities(mapper: Mapper[Any], state: Any, dict_: dict[str, Any]) -> None:
        if mapper is base and dict_.get(key) not in mapper.polymorphic_map:
            return  # a vanished class's row, loaded as the base on purpose
        validate(mapper, state, dict_)

    base._validate_polymorphic_identity = validate_known_identities


class Workflow(WorkflowColumns, Base):
    """Base class of all workflows. Subclass it and declare steps with ``@step``."""

    __table__ = workflows_table  # declared in storage, which reads it without this class
    metadata_json = column_property(workflows_table.c.metadata)
    input_json = column_property(workflows_table.c.input)  # ``input`` is the decoded property
    __mapper_args__ = {  # read by SQLAlchemy; each subclass sets its own identity
        "polymorphic_on": "type",
        "polymorphic_identity": "Workflow",
    }

    # Class-level configuration users set in their subclasses.
    workflow_type: ClassVar[str | None] = None
    job_options: ClassVar[dict[str, Any]] = {}
    exception_policies: ClassVar[Sequence[ExceptionPolicy]] = ()
    may_proceed_without_hero: ClassVar[bool] = False
    # A cron schedule: a worker creates a (hero-less) workflow of the class at every tick.
    schedule: ClassVar[Schedule | None] = None
    # Child workflows (start_child): canceling this workflow cancels its ongoing children;
    # a child paused for longer than children_timeout fails a waiting fan-in step.
    cancel_children: ClassVar[bool] = True
    children_timeout: ClassVar[timedelta | float | None] = None
    _children_timeout: ClassVar[timedelta | None] = None
    # At most n steps of the class with the same key in progress at once (definition.limits).
    concurrency: ClassVar[ConcurrencyLimit | None] = None
    # Claims rotate among the keys' workflows (definition.fairness): a callable of the
    # workflow returning a str or int (None: no key), run once by create().
    fairness_key: ClassVar[Callable[[Any], Any] | None] = None

    # Gathered per class by __init_subclass__.
    steps: ClassVar[StepCollection] = StepCollection([])
    _step_definitions: ClassVar[list[StepDefinition]] = []
    _exception_policies: ClassVar[list[ExceptionPolicy]] = []
    _cancel_conditions: ClassVar[list[Hook]] = []
    _job_options: ClassVar[dict[str, Any]] = {}
    _job_option_keys: ClassVar[frozenset[str]] = frozenset()
    _schedule: ClassVar[Schedule | None] = None  # the class's own (never inherited)
    _step_limits: ClassVar[dict[str, StepLimits]] = {}  # only the steps that have limits

    def __init_subclass__(cls, **kwargs: Any) -> None:
        _register_dsl(cls)
        identity = cls.__dict__.get("workflow_type") or cls.__name__
        _claim_identity(cls, identity)
        cls.__mapper_args__ = {"polymorphic_identity": identity}
        super().__init_subclass__(**kwargs)

    # -- creating ------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        session: Session,
        *,
        hero: Any = None,
        allow_multiple: bool = False,
        step_job_options: dict[str, Any] | None = None,
        input: Any = None,
    ) -> Self:
        """Start a workflow inside ``session``'s transaction; its first step runs after commit.

        ``input``: a JSON value (the typed codec of signal payloads) kept with the workflow and
        read by its steps as ``self.input``; at most ``max_value_size`` bytes once encoded.
        """
        refuse_async_session(session, f"{cls.__name__}.create()", f"{cls.__name__}.acreate()")
        return verbs().create(
            cls,
            session,
            hero=hero,
            allow_multiple=allow_multiple,
            step_job_options=step_job_options,
            input=input,
        )

    @classmethod
    def create_many(
        cls,
        session: Session,
        *,
        heroes: Iterable[Any] | None = None,
        count: int | None = None,
        allow_multiple: bool = False,
        step_job_options: dict[str, Any] | None = None,
        raise_on_conflict: bool = False,
        inputs: Sequence[Any] | None = None,
    ) -> StartResult:
        """Start one workflow per hero (or ``count`` hero-less ones) in ``session``'s
        transaction, in a few multi-row INSERTs; heroes that already have an ongoing workflow
        of this class are listed in the result's ``conflicts``.

        ``inputs``: one input per hero (or per hero-less workflow), in the same order; without
        ``heroes`` and ``count``, one hero-less workflow per input."""
        refuse_async_session(
            session, f"{cls.__name__}.create_many()", f"{cls.__name__}.acreate_many()"
        )
        return verbs().create_many(
            cls,
            session,
            heroes=heroes,
            count=count,
            allow_multiple=allow_multiple,
            step_job_options=step_job_options,
            raise_on_conflict=raise_on_conflict,
            inputs=inputs,
        )

    # -- the async twins: the sync verbs, run on an AsyncSession (see async_bridge) ------

    @classmethod
    async def acreate(
        cls,
        session: AsyncSession,
        *,
        hero: Any = None,
        allow_multiple: bool = False,
        step_job_options: dict[str, Any] | None = None,
        input: Any = None,
    ) -> Self:
        """:meth:`create` on an ``AsyncSession``, in its transaction (nothing is committed).

        It runs ``create()`` itself on the session's ``sync_session`` (``run_sync``), so the
        statements, uniqueness and errors are create()'s, and the first step's wake-up is sent
        by ``await session.commit()`` — never after a rollback. ``hero``: an instance of the
        same ``AsyncSession`` (or a new one, which is flushed).
        """
        return await run_on(
            session,
            f"{cls.__name__}.acreate()",
            f"{cls.__name__}.create()",
            lambda sync: cls.create(
                sync,
                hero=hero,
                allow_multiple=allow_multiple,
                step_job_options=step_job_options,
                input=input,
            ),
        )

    @classmethod
    async def acreate_many(
        cls,
        session: AsyncSession,
        *,
        heroes: Iterable[Any] | None = None,
        count: int | None = None,
        allow_multiple: bool = False,
        step_job_options: dict[str, Any] | None = None,
        raise_on_conflict: bool = False,
        inputs: Sequence[Any] | None = None,
    ) -> StartResult:
        """:meth:`create_many` on an ``AsyncSession``, as :meth:`acreate` is ``create()``."""
        return await run_on(
            session,
            f"{cls.__name__}.acreate_many()",
            f"{cls.__name__}.create_many()",
            lambda sync: cls.create_many(
                sync,
                heroes=heroes,
                count=count,
                allow_multiple=allow_multiple,
                step_job_options=step_job_options,
                raise_on_conflict=raise_on_conflict,
                inputs=inputs,
            ),
        )

    # -- child workflows -----------------------------------------------------------------

    def start_child(
        self,
        cls: type[W],
        *,
        key: str,
        hero: Any = None,
        allow_multiple: bool = False,
        input: Any = None,
    ) -> W:
        """Inside a step: start a child workflow of ``cls`` with the step's writes.

        The child exists only if the step commits, and once per ``key`` among this
        workflow's children: a step run again (a reattempt, a resumed cursor) gets the child
        it started before instead of a second one. ``input``: the child's ``self.input``,
        stored as ``create(input=...)`` stores it (the same ``max_value_size``). A
        ``@step(wait_for_children=…)`` step waits for the children to end, and
        :meth:`child_results` reads what they returned (docs/children.md).
        """
        return verbs().start_child(
            self, cls, key=key, hero=hero, allow_multiple=allow_multiple, input=input
        )

    def child_results(self) -> dict[str, Any]:
        """``{key: result}`` of every child this workflow started, in the order they were
        started: what each child's latest successful step returned (as ``result_of``), read
        for all of them in one query.

        A child maps to None when none of its steps has succeeded yet or its latest
        successful one returned nothing — and when it ended ``canceled``, whatever its steps
        returned before: a canceled child gave no answer (a ``wait_for_children`` step is
        told so by :class:`ChildFailed`). A child still running maps to its result so far.
        """
        session = self.session
        return {
            key: None if value is None else serialization.decode(value, session=session)
            for key, value in queries.child_results(session, self.id)
        }

    @property
    def parent(self) -> Workflow | None:
        """The workflow that started this one with ``start_child``, or None."""
        if self.parent_id is None:
            return None
        return self.session.get(Workflow, self.parent_id)

    # -- the hero ------------------------------------------------------------------------

    @property
    def hero(self) -> Any:
        """The domain record this workflow is about, or None (deleted, or never set)."""
        if self.hero_type is None or self.hero_id is None:
            return None
        cached = self.__dict__.get("_gd_hero")
        if cached is not None:
            return cached
        session = object_session(self)
        if session is None:
            return None
        cls = resolve_hero_class(self.hero_type)
        key_type = cls.__mapper__.primary_key[0].type.python_type
        key: Any = self.hero_id
        if key_type is int:
            key = int(key)
        elif key_type is uuid.UUID:
            key = uuid.UUID(key)
        hero = session.get(cls, key)
        if hero is not None:
            self.__dict__["_gd_hero"] = hero
        return hero

    # -- reading state -------------------------------------------------------------------

    @property
    def session(self) -> Session:
        session = object_session(self)
        if session is None:
            raise InvalidStateError(
                f"{self._label}: this workflow is not attached to a session; load it with "
                "session.get(...) first"
            )
        return session

    @property
    def async_session(self) -> AsyncSession:
        """``self.session`` as an ``AsyncSession``, for ``async def`` steps and hooks.

        The very same session and transaction, not a second one: what a step writes through
        it commits with the step's outcome and rolls back with its failure, and
        ``commit()`` is refused inside a step as on ``self.session``. It is lazy like the
        session: no connection is taken until the first statement (docs/async-steps.md).
        """
        session = self.session
        proxy = session.info.get(_ASYNC_SESSION)
        if proxy is None:
            from sqlalchemy.ext.asyncio import AsyncSession  # only for async code

            # sync_session_class is how AsyncSession builds its Session; handing back the
            # existing one makes the proxy wrap it (every call runs it in greenlet_spawn).
            proxy = session.info[_ASYNC_SESSION] = AsyncSession(
                sync_session_class=lambda **_: session  # type: ignore[arg-type]
            )
        return cast("AsyncSession", proxy)

    @property
    def current_execution(self) -> StepExecution | None:
        return queries.current_execution(self.session, self.id)

    @property
    def execution_history(self) -> Sequence[StepExecution]:
        """Every run of a step, oldest first; signal-timeout timers are left out.

        A timed-out wait is its parked row, ended with outcome ``timed_out`` (its metadata
        ``timed_out`` says after how long and what ``on_timeout`` did); the timer that ended
        it is bookkeeping, listed by :attr:`execution_history_with_timers`.
        """
        return [e for e in self.execution_history_with_timers if not e.is_timer]

    @property
    def execution_history_with_timers(self) -> Sequence[StepExecution]:
        """Every execution row, timers included (``is_timer``), oldest first."""
        return queries.execution_history(self.session, self.id)

    step_executions = execution_history

    @property
    def input(self) -> Any:
        """The value passed as ``create(input=...)`` (None if none was): typed JSON, decoded
        afresh at each read; references to mapped instances load in this workflow's session."""
        if self.input_json is None:
            return None
        return serialization.decode(self.input_json, session=object_session(self))

    def result_of(self, step: str) -> Any:
        """What step ``step`` returned on its latest successful execution.

        ``KeyError`` (naming the step and the steps that have results) when it has none yet —
        it has not run, failed, was skipped, or is not a step of this workflow.
        """
        found, value = queries.step_result(self.session, self.id, step)
        if not found:
            done = queries.succeeded_steps(self.session, self.id)
            raise KeyError(
                f"{self._label}: result_of({step!r}): step {step!r} has no successful "
                f"execution, so no result; steps with results: {', '.join(done) or 'none'}"
            )
        return serialization.decode(value, session=self.session)

    @property
    def received_signal(self) -> Signal | None:
        """Inside a ``wait_for=`` step: the signal that woke it."""
        return self.__dict__.get("_gd_received_signal")

    @property
    def ongoing(self) -> bool:
        return self.state not in (WorkflowState.FINISHED, WorkflowState.CANCELED)

    @property
    def previous_step_name(self) -> str | None:
        reference = self.current_step_name or self.next_step_name
        if reference is None:
            last = self.steps[-1] if self.state == WorkflowState.FINISHED and self.steps else None
            return last.name if last else None
        previous = self.steps.previous_before(reference)
        return previous.name if previous else None

    @property
    def _label(self) -> str:
        return f"{type(self).__name__} id={self.id}"

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        return workflow_logger(self)

    # -- metadata and job options --------------------------------------------------------

    def read_metadata(self, key: str) -> Any:
        """The value stored under ``key`` by :meth:`write_metadata` (None if none)."""
        value = (self.metadata_json or {}).get(key)
        return None if value is None else serialization.decode(value)

    def write_metadata(self, key: str, value: Any) -> None:
        """Keep ``value`` (typed JSON) under ``key`` on the workflow row; None removes it.

        Written with the step (or the caller's transaction). The whole metadata document is
        held to ``max_value_size`` like an input or a result: it is part of the hot workflow
        row. For values a step computes, prefer returning them (``result_of``).
        """
        data = dict(self.metadata_json or {})
        if value is None:
            data.pop(key, None)
        else:
            text.check(key, f"{self._label}: write_metadata() key")
            try:
                data[key] = serialization.encode(value)
            except SerializationError as error:
                raise type(error)(f"{self._label}: write_metadata({key!r}): {error}") from None
            session = object_session(self)
            limit = (settings_of(session) if session is not None else settings()).max_value_size
            size = size_of(data)
            if limit is not None and size > limit:
                raise MetadataTooLargeError(
                    f"{self._label}: write_metadata({key!r}) would make the workflow's metadata "
                    f"{size} bytes of JSON, over max_value_size={limit}; keep large data "
                    "elsewhere (a row of your own) and store its key, or raise the limit with "
                    "configure(max_value_size=...)"
                )
        self.metadata_json = data or None

    @property
    def step_job_options(self) -> dict[str, Any]:
        return dict(self.read_metadata("step_job_options") or {})

    @step_job_options.setter
    def step_job_options(self, options: dict[str, Any] | None) -> None:
        backend = settings_of(self.session).backend
        self.write_metadata(
            "step_job_options", checked_step_job_options(type(self), options, backend)
        )

    def merged_job_options(self, step_def: StepDefinition) -> dict[str, Any]:
        """Class options, then this instance's, then the step's: later wins."""
        return {**self._job_options, **self.step_job_options, **(step_def.job_options or {})}

    # -- hooks (override in subclasses) --------------------------------------------------

    def before_step_execution(self, execution: StepExecution) -> Awaitable[None] | None:
        """Runs after the step was claimed, before its body."""

    def after_step_execution(self, execution: StepExecution) -> Awaitable[None] | None:
        """Runs after the body returned, raised or used flow control; before the outcome."""

    def around_step_execution(self, execution: StepExecution, proceed: Callable[[], Any]) -> Any:
        """Wraps the body; must call ``proceed()`` and return its result."""
        return proceed()

    # -- flow control: inside a step these raise, outside they act on the row -----------

    @contextlib.contextmanager
    def _in_step_context(self) -> Iterator[None]:
        previous = self.__dict__.get("_gd_in_step", False)
        self.__dict__["_gd_in_step"] = True
        if not previous:  # a new run: the child keys used in one run are its own
            self.__dict__[CHILD_KEYS] = set()
        try:
            yield
        finally:
            self.__dict__["_gd_in_step"] = previous

    @property
    def _in_step(self) -> bool:
        return bool(self.__dict__.get("_gd_in_step"))

    def reattempt(
        self,
        wait: timedelta | float | None = None,
        rewind: bool = False,
        *,
        wait_until: datetime | None = None,
    ) -> None:
        """Inside a step: stop now and run this step again (after ``wait``, or at
        ``wait_until``, an aware datetime)."""
        self._require_in_step("reattempt")
        raise FlowControl(
            Action.REATTEMPT,
            wait=self._wait("reattempt", wait),
            rewind=rewind,
            until=self._until("reattempt", wait, wait_until),
        )

    def finish(self) -> None:
        """Inside a step: stop now, keep the step's work, and finish the whole workflow."""
        self._require_in_step("finish")
        raise FlowControl(Action.FINISH)

    def suspend(
        self, wait: timedelta | float | None = None, *, wait_until: datetime | None = None
    ) -> None:
        """Inside a resumable step: stop now and continue from the cursor after ``wait`` (or
        at ``wait_until``, an aware datetime)."""
        self._require_in_step("suspend")
        step_def = self.steps.named(self.current_step_name)
        if step_def is None or not step_def.resumable:
            raise InvalidStateError(
                f"{self._label}: suspend() can only be called from inside a resumable step; "
                f"step {self.current_step_name!r} is not one (use reattempt(wait=...) instead)"
            )
        raise FlowControl(
            Action.SUSPEND,
            wait=self._wait("suspend", wait),
            until=self._until("suspend", wait, wait_until),
        )

    def _until(
        self, verb: str, wait: timedelta | float | None, wait_until: datetime | None
    ) -> datetime | None:
        if wait_until is None:
            return None
        where = f"{self._label}, step {self.current_step_name!r}: {verb}()"
        if wait is not None:
            raise ValueError(f"{where}: takes wait= or wait_until=, not both")
        return checked_until(wait_until, where)

    def _wait(self, verb: str, wait: timedelta | float | None) -> timedelta | None:
        problem = duration_problem(wait)
        if problem is not None:
            raise ValueError(f"{self._label}: {verb}(wait={wait!r}): the wait {problem}")
        return timedelta(seconds=wait) if isinstance(wait, int | float) else wait

    def _require_in_step(self, verb: str) -> None:
        if not self._in_step:
            raise InvalidStateError(
                f"{self._label}: {verb}() can only be called inside a running step"
            )

    def cancel(self) -> None:
        """Inside a step: stop and cancel. Outside: cancel this workflow in your transaction."""
        if self._in_step:
            raise FlowControl(Action.CANCEL)

        verbs().cancel(self)

    def pause(self) -> None:
        """Inside a step: stop and pause. Outside: pause; a running step finishes first."""
        if self._in_step:
            raise FlowControl(Action.PAUSE)

        verbs().pause(self)

    def skip(self) -> None:
        """Inside a step: stop and move on. Outside: skip the current step of a ready/paused one."""
        if self._in_step:
            raise FlowControl(Action.SKIP)

        verbs().skip(self)

    def resume(self) -> StepExecution | None:
        """Continue a paused workflow; returns the execution that will run next."""
        return verbs().resume(self)

    @classmethod
    def ongoing_for(cls, hero: Any, session: Session | None = None) -> list[Workflow]:
        """This class's ongoing workflows for ``hero`` (every class's, on ``Workflow``).

        ``session``: the hero's own session unless given. See ``geneva_drive.admin.for_hero``.
        """
        refuse_async_session(
            session, f"{cls.__name__}.ongoing_for()", f"{cls.__name__}.aongoing_for()"
        )
        return verbs().of_hero(cls, hero, session, ongoing_only=True)

    @classmethod
    async def aongoing_for(cls, hero: Any, session: AsyncSession) -> list[Workflow]:
        """:meth:`ongoing_for` on an ``AsyncSession`` (given: a hero cannot name its own)."""
        return await run_on(
            session,
            f"{cls.__name__}.aongoing_for()",
            f"{cls.__name__}.ongoing_for()",
            lambda sync: cls.ongoing_for(hero, sync),
        )

    def signal(
        self,
        name: str,
        payload: Any = None,
        idempotency_key: str | None = None,
        *,
        allow_unknown: bool = False,
    ) -> Signal:
        """Deliver an event to this workflow, inside the caller's transaction.

        A name no step of the class waits for raises :class:`UnknownSignal` before anything
        is written; ``allow_unknown=True`` stores it anyway (for a step not deployed yet).
        """
        return verbs().signal(self, name, payload, idempotency_key, allow_unknown=allow_unknown)

    async def asignal(
        self,
        name: str,
        payload: Any = None,
        idempotency_key: str | None = None,
        *,
        allow_unknown: bool = False,
    ) -> Signal:
        """:meth:`signal` on the ``AsyncSession`` this workflow was loaded with, in its
        transaction: the same row lock, idempotency and errors; the step it wakes is handed
        to a worker by ``await session.commit()``."""
        return await self._on_async_session(
            "asignal",
            lambda: self.signal(name, payload, idempotency_key, allow_unknown=allow_unknown),
        )

    async def apause(self) -> None:
        """:meth:`pause`, on this workflow's ``AsyncSession`` (inside a step: stop and pause)."""
        await self._on_async_session("apause", self.pause)

    async def aresume(self) -> StepExecution | None:
        """:meth:`resume`, on this workflow's ``AsyncSession``."""
        return await self._on_async_session("aresume", self.resume)

    async def askip(self) -> None:
        """:meth:`skip`, on this workflow's ``AsyncSession`` (inside a step: move on)."""
        await self._on_async_session("askip", self.skip)

    async def acancel(self) -> None:
        """:meth:`cancel`, on this workflow's ``AsyncSession`` (inside a step: stop, cancel)."""
        await self._on_async_session("acancel", self.cancel)

    async def _on_async_session(self, call: str, verb: Callable[[], _T]) -> _T:
        sync_call = f"{self._label}: {call[1:]}()"
        if self._in_step:
            return verb()  # flow control inside a step: it raises before any statement
        session = async_session_of(self, f"{call}()", sync_call)
        return await run_on(session, f"{self._label}: {call}()", sync_call, lambda _: verb())

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} id={self.id} state={self.state} "
            f"next_step={self.next_step_name!r}>"
        )


_identities = Workflow.__mapper__.polymorphic_map
_fallback = _FallbackIdentities(_identities)
_fallback.base = Workflow.__mapper__
Workflow.__mapper__.polymorphic_map = _fallback
_accept_vanished_identities(Workflow.__mapper__)


def check_job_options(cls: type[Workflow], backend: Any, *, misspelt_only: bool = False) -> None:
    """Refuse job-option keys of ``cls`` (class level or a step's) that ``backend`` ignores.

    One subset test on the keys gathered at class definition; the search for the culprit
    runs only when something is wrong.
    """
    accepted = getattr(backend, "accepted_job_options", None)
    if accepted is None or cls._job_option_keys <= accepted:
        return
    sources: list[tuple[str, dict[str, Any]]] = [(f"{cls.__name__}.job_options", cls._job_options)]
    sources += [(d.label, d.job_options) for d in cls.steps if d.job_options]
    for label, options in sources:
        problem = job_option_problem(backend, options, misspelt_only=misspelt_only)
        if problem is not None:
            raise StepConfigurationError(f"{label}: {problem}")


def check_registered_job_options(backend: Any) -> None:
    """At ``configure()``: refuse misspelt job-option keys in every class defined so far.

    Only misspellings (``priorty``): a key no closer to the backend's than ``expires`` may
    belong to a class this process never runs on this backend, and is refused at ``create()``
    if it does.
    """
    for mapper in Workflow.__mapper__.self_and_descendants:
        check_job_options(mapper.class_, backend, misspelt_only=True)


def _claim_identity(cls: type[Workflow], identity: str) -> None:
    problem = text.describe(identity) if isinstance(identity, str) else None
    if problem is not None:
        raise StepConfigurationError(
            f"{cls.__module__}.{cls.__qualname__}: the workflow type {identity!r:.60} holds "
            f"{problem}; {text.RULE}"
        )
    if not isinstance(identity, str) or len(identity) > MAX_WORKFLOW_TYPE:
        given = "workflow_type" if "workflow_type" in cls.__dict__ else "the class name"
        raise StepConfigurationError(
            f"{cls.__module__}.{cls.__qualname__}: {given} is stored as the workflow type, "
            f"a str of at most {MAX_WORKFLOW_TYPE} characters (the length of its column); got "
            f"{identity!r:.60}; set workflow_type = '<a shorter name>'"
        )
    existing = Workflow.__mapper__.polymorphic_map.get(identity)
    if existing is None:
        return
    other = existing.class_
    if (other.__module__, other.__qualname__) == (cls.__module__, cls.__qualname__):
        return  # the same class defined again (a module reload, a test run twice)
    raise StepConfigurationError(
        f"{cls.__module__}.{cls.__qualname__}: workflow type {identity!r} is already used by "
        f"{other.__module__}.{other.__qualname__}; set workflow_type = '<unique name>' on one "
        "of them"
    )


def _parent(cls: type[Workflow]) -> type[Workflow]:
    return next(b for b in cls.__mro__[1:] if isinstance(b, type) and issubclass(b, Workflow))


def _register_dsl(cls: type[Workflow]) -> None:
    """Gather what the class body declares on top of its parent's, checking each piece."""
    parent = _parent(cls)
    definitions = _register_steps(cls, parent)
    cls._exception_policies = [*parent._exception_policies, *_own_exception_policies(cls)]
    cls._cancel_conditions = [*parent._cancel_conditions, *_own_cancel_conditions(cls)]
    _register_job_options(cls, parent, definitions)
    cls._children_timeout = _children_timeout(cls)
    _register_limits(cls, definitions)
    check_fairness_key(cls)
    _check_hooks(cls)
    cls._schedule = _own_schedule(cls)


def _own_schedule(cls: type[Workflow]) -> Schedule | None:
    """The class body's ``schedule``, checked. Not inherited: a subclass of a nightly job is
    another class, and would otherwise create a second workflow at every tick."""
    schedule = cls.__dict__.get("schedule")
    if schedule is None:
        return None
    if not isinstance(schedule, Schedule):
        raise StepConfigurationError(
            f"{cls.__name__}.schedule: expected Schedule('0 3 * * *', timezone='Europe/Berlin')"
            f", got {schedule!r:.80}"
        )
    schedule.check(cls.__name__)
    if not cls.may_proceed_without_hero:
        raise StepConfigurationError(
            f"{cls.__name__}.schedule: a scheduled workflow is created by a worker, with no "
            "hero; set may_proceed_without_hero = True on the class (and read what it works "
            "on in its steps)"
        )
    return schedule


def scheduled_classes() -> list[type[Workflow]]:
    """Every workflow class defined in this process that has a ``schedule`` of its own."""
    return [
        m.class_
        for m in list(Workflow.__mapper__.self_and_descendants)
        if m.class_.__dict__.get("_schedule") is not None
    ]


def _register_limits(cls: type[Workflow], definitions: list[StepDefinition]) -> None:
    check_limit(cls.__dict__.get("concurrency"), f"{cls.__name__}.concurrency", ConcurrencyLimit)
    resolved = {str(d.name): step_limits.resolve(cls, d) for d in definitions}
    cls._step_limits = {name: found for name, found in resolved.items() if found is not None}


def _register_steps(cls: type[Workflow], parent: type[Workflow]) -> list[StepDefinition]:
    """The parent's steps then the class body's, validated, named and ordered on ``cls``."""
    definitions = list(parent._step_definitions)
    names = [d.name for d in definitions if d.name is not None]
    for definition in _declared_steps(cls):
        if definition.name is None:
            definition.name = f"step_{len(definitions) + 1}"
        definition.validate(cls.__name__, names)
        definitions.append(definition)
        names.append(definition.name)
    _refuse_lost_duplicates(definitions)
    cls._step_definitions = definitions
    cls.steps = StepCollection(definitions, _compensations(cls, definitions))
    for definition in definitions:
        _check_skip_if_name(cls, definition)
    for definition in definitions:  # on_timeout may name a step defined further down
        _check_on_timeout_target(cls, definition)
    return definitions


def _compensations(cls: type[Workflow], definitions: list[StepDefinition]) -> list[StepDefinition]:
    """A step definition for each method named by ``compensate=``: run as a step of its own
    when the workflow is canceled after that step succeeded (docs/compensation.md)."""
    names = [d.name for d in definitions if d.name is not None]
    found: dict[str, StepDefinition] = {}
    for definition in definitions:
        name = definition.compensate
        if name is None or name in found:
            continue
        target = getattr(cls, name, None)
        if isinstance(target, StepDefinition):
            definition._fail(
                f"compensate={name!r} names a step of {cls.__name__}; a compensation is a plain "
                f"method (def {name}(self)) that runs only when the workflow is canceled — "
                "remove @step from it, or name another method"
            )
        if not callable(target) or isinstance(target, type):
            public = [a for a in dir(cls) if not a.startswith("_")]
            close = difflib.get_close_matches(name, public, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            definition._fail(
                f"compensate={name!r} names no method of {cls.__name__}; {hint}define "
                f"def {name}(self) on the class: it runs if the workflow is canceled after "
                f"step {definition.name!r} succeeded"
            )
        compensation = StepDefinition(callable=target, name=name, compensation=True)
        compensation.validate(cls.__name__, names)
        found[name] = compensation
    return list(found.values())


def _declared_steps(cls: type[Workflow]) -> Iterator[StepDefinition]:
    """The steps of the class body in order, each once: a step, or a list/tuple of them."""
    seen: set[int] = set()  # a gravestone is filed by removed_step() and maybe assigned too
    for value in list(cls.__dict__.values()):
        for definition in _as_step_group(value):
            if id(definition) not in seen:
                seen.add(id(definition))
                yield definition


def _as_step_group(value: Any) -> list[StepDefinition]:
    if isinstance(value, StepDefinition):
        return [value]
    if (
        isinstance(value, list | tuple)
        and value
        and all(isinstance(v, StepDefinition) for v in value)
    ):
        return list(value)
    return []


def _refuse_lost_duplicates(definitions: list[StepDefinition]) -> None:
    """A step that replaced a same-named one in the class body, which was not registered."""
    registered = {id(d) for d in definitions}
    for definition in definitions:
        replaced, definition.shadows = definition.shadows, None
        if replaced is not None and id(replaced) not in registered:
            definition._fail(
                "is declared twice in the class body and Python kept only the last one; "
                "rename one of them"
            )


def _check_on_timeout_target(cls: type[Workflow], definition: StepDefinition) -> None:
    target = definition.on_timeout
    if target in (None, "skip", "cancel", "pause"):
        return
    if target in [d.name for d in cls.steps.runnable()]:
        return
    definition._fail(
        f"on_timeout={target!r} is neither 'skip', 'cancel', 'pause' nor a step of "
        f"{cls.__name__} (steps: {', '.join(cls.steps.names) or 'none'})"
    )


def _children_timeout(cls: type[Workflow]) -> timedelta | None:
    value = cls.children_timeout
    if value is None:
        return None
    seconds: float | None = None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    if seconds is None or seconds <= 0 or duration_problem(seconds) is not None:
        raise StepConfigurationError(
            f"{cls.__name__}.children_timeout must be a positive timedelta or number of "
            f"seconds (how long a child may stay paused while a step waits for it), or None; "
            f"got {value!r}"
        )
    return timedelta(seconds=seconds)


def _own_exception_policies(cls: type[Workflow]) -> Iterable[ExceptionPolicy]:
    own_policies = cls.__dict__.get("exception_policies", ())
    if isinstance(own_policies, ExceptionPolicy):
        own_policies = [own_policies]
    for policy in own_policies:
        if not isinstance(policy, ExceptionPolicy):
            raise StepConfigurationError(
                f"{cls.__name__}.exception_policies: expected ExceptionPolicy objects, got "
                f"{policy!r}"
            )
    return cast("Iterable[ExceptionPolicy]", own_policies)


def _own_cancel_conditions(cls: type[Workflow]) -> list[Hook]:
    if "cancel_if" not in cls.__dict__:
        return []
    condition = cls.__dict__["cancel_if"]
    if not callable(condition):
        raise StepConfigurationError(
            f"{cls.__name__}.cancel_if must be a method returning bool, got {condition!r}"
        )
    _check_method(cls, "cancel_if", condition, "(self) -> bool")
    return [condition]


def _register_job_options(
    cls: type[Workflow], parent: type[Workflow], definitions: list[StepDefinition]
) -> None:
    own_options = validate_job_options(
        cls.__dict__.get("job_options"), f"{cls.__name__}.job_options"
    )
    cls._job_options = {**parent._job_options, **(own_options or {})}
    # Every job-option key the class and its steps use: checked against the configured
    # backend's accepted options once (configure(), create()), never per step.
    cls._job_option_keys = frozenset(cls._job_options).union(
        *(d.job_options or () for d in definitions)
    )


_ASYNC_SESSION = "geneva_drive_async_session"


def _check_hooks(cls: type[Workflow]) -> None:
    for hook, shape in _HOOKS.items():
        if hook in cls.__dict__:
            if not callable(cls.__dict__[hook]):
                raise StepConfigurationError(f"{cls.__name__}.{hook} must be a method")
            _check_method(cls, hook, cls.__dict__[hook], shape)


_HOOKS = {
    "before_step_execution": "(self, execution)",
    "after_step_execution": "(self, execution)",
    "around_step_execution": "(self, execution, proceed)",
}


def _check_method(cls: type[Workflow], name: str, method: Any, shape: str) -> None:
    """A hook or condition must be a plain method callable as ``shape``."""
    if is_async_generator(method):
        raise StepConfigurationError(
            f"{cls.__name__}.{name} is an async generator; nothing would iterate it, so it "
            f"would never run; make it a def (or async def) {name}{shape} without yield"
        )
    if name == "around_step_execution" and is_coroutine_function(method):
        # proceed() runs the step's phases, which are sync code in a greenlet: called from a
        # coroutine on the loop, they would have no greenlet to suspend (core.awaiting).
        raise StepConfigurationError(
            f"{cls.__name__}.around_step_execution is an async function; it wraps the step "
            "body by calling proceed() synchronously, so it must be a plain def "
            "around_step_execution(self, execution, proceed) — an async body inside is "
            "awaited all the same; put awaited work in async def before_step_execution or "
            "after_step_execution"
        )
    problem = signature_problem(method, shape.count(",") + 1)
    if problem is not None:
        raise StepConfigurationError(
            f"{cls.__name__}.{name} must be callable as {name}{shape}, but {problem}"
        )


def _check_skip_if_name(cls: type[Workflow], definition: StepDefinition) -> None:
    name = definition.skip_if
    if not isinstance(name, str) or hasattr(cls, name):
        return
    public = [a for a in dir(cls) if not a.startswith("_")]
    close = difflib.get_close_matches(name, public, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    definition._fail(
        f"skip_if={name!r} names no method or attribute of {cls.__name__}; {hint}define "
        f"def {name}(self) -> bool on the class, or pass a callable (workflow) -> bool"
    )


__all__ = ["ExecutionState", "Outcome", "StepNotDefinedError", "Workflow"]


def as_workflow(row: WorkflowColumns | None) -> Workflow | None:
    """A workflows row as the query layer returns it — typed by its columns, since that layer
    cannot import this class — is a ``Workflow`` (the mapped root): say so to the type checker."""
    return cast("Workflow | None", row)

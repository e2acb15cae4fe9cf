"""The three tables: workflows, step executions, signals.

Our tables live in their own ``MetaData`` (``Base.metadata``) so they never mix with the
application's models, and the schema is created by the shipped Alembic migrations
(``geneva_drive.install``). ``Workflow`` itself — the polymorphic root that user classes
subclass — is mapped in ``definition/workflow.py`` onto :data:`workflows_table`, declared here.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    event,
    text,
)
from sqlalchemy.engine import Connection
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator, TypeEngine

from geneva_drive.core.settings import settings
from geneva_drive.core.states import ExecutionState, WorkflowState
from geneva_drive.storage import serialization

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

WORKFLOWS = "geneva_drive_workflows"
EXECUTIONS = "geneva_drive_step_executions"
SIGNALS = "geneva_drive_signals"
OPERATOR_ACTIONS = "geneva_drive_operator_actions"
SCHEDULES = "geneva_drive_schedules"

# Dialect names: SQLAlchemy calls MariaDB "mariadb" for mariadb:// URLs, "mysql" otherwise.
MYSQL_DIALECTS = ("mysql", "mariadb")
PARTIAL_INDEX_DIALECTS = ("postgresql", "sqlite")
# Our tables' own character set and collation on MySQL/MariaDB, whatever the server default:
# a binary collation compares strings exactly, as PostgreSQL and SQLite do (idempotency keys,
# step names and hero ids differing only in case are different).
MYSQL_TABLE_OPTIONS = (("charset", "utf8mb4"), ("collate", "utf8mb4_bin"))
DIALECTS_INFO_KEY = "geneva_drive_dialects"
WHERE_INFO_KEY = "geneva_drive_where"  # a partial index's predicate (PostgreSQL, SQLite)


def partial(index: Index, where: str) -> Index:
    """``index`` over the rows ``where`` holds, on PostgreSQL and SQLite (see
    :func:`declare_dialect_options`)."""
    index.info[WHERE_INFO_KEY] = text(where)
    return index


def declare_dialect_options(table: Table, dialect_name: str) -> None:
    """Give SQLAlchemy ``table``'s options for one database: the partial indexes' predicates
    on PostgreSQL and SQLite, the character set and collation on MySQL/MariaDB. Idempotent.

    Not declared as keyword arguments (``postgresql_where=``, ``mysql_charset=``): SQLAlchemy
    checks each by importing that database's dialect package — PostgreSQL's imports every
    driver's module, asyncpg's adapter and asyncio — so every process paid for all three
    databases at start (issue 42). Only DDL and schema comparisons read these options: the
    ``before_create`` hook below and the migrations' environment declare them for the database
    they talk to.
    """
    if dialect_name in PARTIAL_INDEX_DIALECTS:
        for index in table.indexes:
            where = index.info.get(WHERE_INFO_KEY)
            if where is not None:
                index.dialect_options[dialect_name]["where"] = where
    if dialect_name in MYSQL_DIALECTS:
        for prefix in MYSQL_DIALECTS:  # SQLAlchemy's MariaDB dialect reads mariadb_ options
            for option, value in MYSQL_TABLE_OPTIONS:
                table.dialect_options[prefix][option] = value


def only_on(index: Index, dialects: tuple[str, ...]) -> Index:
    """Create ``index`` on these dialects only (and say so in ``index.info`` for comparisons)."""
    index.info[DIALECTS_INFO_KEY] = dialects

    def on_these_dialects(*_args: Any, dialect: Dialect, **_kw: Any) -> bool:
        return dialect.name in dialects

    return index.ddl_if(callable_=on_these_dialects)


CHILD_INDEX = "ix_geneva_drive_workflows_child"
TIMEOUT_FOR = "timeout_for"  # on a timer row: the id of the parked execution it times out
# A W3C traceparent is 55 characters ("00-<trace id>-<span id>-<flags>"); room for a version 01.
TRACE_CONTEXT_SIZE = 128


class UTCDateTime(TypeDecorator[datetime]):
    """Stores naive UTC on every engine and always hands back aware UTC datetimes."""

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        # MySQL/MariaDB DATETIME drops fractions of a second unless asked for them; ordering
        # executions by (created_at, id) and due times within one second need microseconds.
        if dialect.name in MYSQL_DIALECTS:
            from sqlalchemy.dialects import mysql  # loaded already: the dialect in use

            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime())

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"geneva-drive stores timezone-aware datetimes only, got {value!r}")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# The types for one database are chosen when its dialect compiles or binds the column
# (``load_dialect_impl``), not with ``with_variant(postgresql.JSONB(), …)``: naming them at
# import would import SQLAlchemy's PostgreSQL and MySQL dialect packages, with all their drivers'
# modules, into every process, whatever its database (issue 42). DDL and binding are the same.


class JsonDocument(TypeDecorator[Any]):
    """JSON; JSONB on PostgreSQL. On MariaDB, JSON is an alias of LONGTEXT with a json_valid()
    check; SQLAlchemy's JSON type encodes and decodes it all the same (MySQL 8 has a native JSON
    type). Python ``None`` is stored as JSON ``null``, as ``JSON()`` stores it."""

    impl = JSON
    cache_ok = True
    should_evaluate_none = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects import postgresql  # loaded already: the dialect in use

            return dialect.type_descriptor(postgresql.JSONB())
        return super().load_dialect_impl(dialect)


class UnboundedText(TypeDecorator[str]):
    """TEXT; LONGTEXT on MySQL/MariaDB, whose TEXT stops at 64 KiB (error messages and
    backtraces are unbounded)."""

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name in MYSQL_DIALECTS:
            from sqlalchemy.dialects import mysql  # loaded already: the dialect in use

            return dialect.type_descriptor(mysql.LONGTEXT())
        return super().load_dialect_impl(dialect)


# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
Id = BigInteger().with_variant(Integer(), "sqlite")
Json = JsonDocument()
LongText = UnboundedText()


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: Json}


def _workflow_indexes() -> tuple[Index, ...]:
    ongoing = "state NOT IN ('finished', 'canceled') AND allow_multiple = false"
    return (
        # The admin list: by class, newest first (keyset on created_at, id); also the claim's
        # class filter and the gauges' lookups, which only need its leading column.
        Index("ix_geneva_drive_workflows_type", "type", "created_at", "id"),
        # The admin list, unfiltered and by state (paused ones, the usual 3 a.m. question),
        # newest first, and the stats' counts of ongoing workflows (a prefix of the state
        # index: its cost follows the work in flight, not the history). Migration 0005.
        Index("ix_geneva_drive_workflows_created", "created_at", "id"),
        Index("ix_geneva_drive_workflows_state_created", "state", "created_at", "id"),
        # State lookups, and housekeeping's "terminal and older than the cut-off" sweep,
        # which must not scan every finished workflow ever kept.
        Index("ix_geneva_drive_workflows_state_transitioned", "state", "transitioned_at"),
        # A hero's workflows: the hero-id search (dashboard, `list --where hero_id=`, admin)
        # sends the id alone, so the id leads; (hero_type, hero_id) lookups use both columns.
        # One index either way, so no write pays for the search. Migration 0009.
        Index("ix_geneva_drive_workflows_hero", "hero_id", "hero_type"),
        # A child's identity: one per (parent, key), so a retried step that starts it again
        # finds it instead of starting a second. Over children only where indexes can be
        # partial; on MySQL/MariaDB over every row (NULLs never collide). Migration 0012.
        *_where_index(
            CHILD_INDEX,
            ("parent_id", "child_key"),
            "parent_id IS NOT NULL",
            ("parent_id", "child_key"),
            unique=True,
        ),
        # One ongoing workflow per (class, hero): the database is the arbiter under races.
        # MySQL/MariaDB: a unique generated column instead (see MYSQL_UNIQUE_KEYS).
        only_on(
            partial(
                Index(
                    "ix_geneva_drive_workflows_unique_ongoing",
                    "type",
                    "hero_type",
                    "hero_id",
                    unique=True,
                ),
                ongoing,
            ),
            PARTIAL_INDEX_DIALECTS,
        ),
        # One workflow per schedule tick (migration 0011): the database, not a leader, keeps
        # two workers from both creating a tick's workflow. Only scheduled workflows have a
        # tick, so elsewhere the index is partial and no other insert writes to it; MySQL/
        # MariaDB have no partial indexes, and NULLs never collide in a unique one.
        *_where_index(
            "ix_geneva_drive_workflows_scheduled_tick",
            ("type", "scheduled_tick"),
            "scheduled_tick IS NOT NULL",
            ("type", "scheduled_tick"),
            unique=True,
        ),
    )


# The rows the ordinary claim takes (``queries.claims``): scheduled, without a fairness key.
UNKEYED_SCHEDULED = "state = 'scheduled' AND fair_key IS NULL"


def _partial_index(name: str, *columns: str, state: str) -> tuple[Index, Index]:
    """A non-unique index over rows in one ``state``.

    PostgreSQL and SQLite get a partial index; MySQL/MariaDB, which have none, get the same
    name over ``(state, *columns)``, which serves the same queries.
    """
    return _where_index(name, columns, f"state = '{state}'", ("state", *columns))


def _non_null_index(name: str, column: str) -> tuple[Index, Index]:
    """An index over the rows where ``column`` is set (PostgreSQL, SQLite; MySQL/MariaDB: all).

    Every query on such a column compares it with a value, which implies ``IS NOT NULL``, so
    both planners still use the partial index; the rows without a value cost it no write.
    """
    return _where_index(name, (column,), f"{column} IS NOT NULL", (column,))


def _where_index(
    name: str,
    columns: tuple[str, ...],
    where: str,
    mysql_columns: tuple[str, ...],
    *,
    unique: bool = False,
) -> tuple[Index, Index]:
    """``name`` over ``columns WHERE where`` where partial indexes exist, else over
    ``mysql_columns`` (MySQL/MariaDB)."""
    return (
        only_on(partial(Index(name, *columns, unique=unique), where), PARTIAL_INDEX_DIALECTS),
        only_on(Index(name, *mysql_columns, unique=unique), MYSQL_DIALECTS),
    )


# MySQL/MariaDB have no partial indexes, so each partial UNIQUE index becomes a STORED generated
# column that is NULL except on the rows the rule covers, with a unique index on it (NULLs never
# collide). The ORM never reads or writes these columns; they are added to the tables by the
# migration and, for create_all(), by the after_create hook below — on MySQL/MariaDB only.
# (table, column, SQL type, expression, unique index, its order)
#
# The executions' key is indexed in descending order (migration 0007). InnoDB's duplicate check
# on an insert S-locks the index record after the new key's own, and a completed row's key
# becomes NULL, which sorts first. Ascending, that record is the next workflow's key, and the
# NULLs go in just before the smallest key: three neighbouring workflows completing a step and
# inserting the next one at once each waited for the next one's row and the last for the first
# one's gap — a deadlock InnoDB broke by rolling one back, whose step then ran twice.
# Descending, each waits only for a smaller key and the NULLs are at the far end, so the waits
# cannot close a ring (tests/test_mariadb.py). MariaDB before 10.8 parses DESC and ignores it.
MYSQL_UNIQUE_KEYS = (
    (
        WORKFLOWS,
        "ongoing_unique_key",
        # 3 × 255 + 2 separators; 767 utf8mb4 characters = 3068 bytes, within InnoDB's 3072.
        "VARCHAR(767)",
        "CASE WHEN state NOT IN ('finished', 'canceled') AND allow_multiple = 0 "
        "THEN CONCAT(type, '-', hero_type, '-', hero_id) END",
        "ix_geneva_drive_workflows_unique_ongoing",
        "",
    ),
    (
        EXECUTIONS,
        "active_unique_key",
        "BIGINT",
        "CASE WHEN state IN ('scheduled', 'in_progress') THEN workflow_id END",
        "ix_geneva_drive_step_executions_one_active",
        " DESC",
    ),
)
MYSQL_UNIQUE_KEY_COLUMNS = frozenset(column for _, column, *_ in MYSQL_UNIQUE_KEYS)


@event.listens_for(Table, "before_create")
def _declare_dialect_options(table: Table, connection: Connection, **_kw: Any) -> None:
    if table.metadata is Base.metadata:
        declare_dialect_options(table, connection.dialect.name)


@event.listens_for(Table, "after_create")
def _add_mysql_unique_keys(table: Table, connection: Connection, **_kw: Any) -> None:
    if connection.dialect.name not in MYSQL_DIALECTS or table.metadata is not Base.metadata:
        return
    for table_name, column, sql_type, expression, index, order in MYSQL_UNIQUE_KEYS:
        if table_name == table.name:
            connection.exec_driver_sql(
                f"ALTER TABLE {table_name} "
                f"ADD COLUMN {column} {sql_type} GENERATED ALWAYS AS ({expression}) STORED, "
                f"ADD UNIQUE INDEX {index} ({column}{order})"
            )


def _now() -> datetime:
    return settings().clock.now()


class Timestamps:
    # From the configured clock, so frozen test time is also the time rows record.
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=_now)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=_now, onupdate=_now)


# The workflows table, declared here with the other tables rather than by ``Workflow`` (the
# DSL, ``definition.workflow``), which maps onto it: a query that only reads it — ``list``,
# ``show``, ``stats``, the dashboard — needs neither the DSL nor what it imports (issue 42).
workflows_table = Table(
    WORKFLOWS,
    Base.metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("type", String(255), nullable=False),
    Column("hero_type", String(255)),
    Column("hero_id", String(255)),
    Column(
        "state",
        String(32),
        nullable=False,
        default=WorkflowState.READY,
        server_default=WorkflowState.READY,
    ),
    Column("current_step_name", String(255)),
    Column("next_step_name", String(255)),
    Column("allow_multiple", Boolean, nullable=False, default=False, server_default=text("false")),
    Column("started_at", UTCDateTime()),
    Column("transitioned_at", UTCDateTime()),
    Column("metadata", Json),
    # From the configured clock, as ``Timestamps``' (the column order create_all() had when
    # ``Workflow`` declared the table on its mixins: theirs last).
    Column("created_at", UTCDateTime(), nullable=False, default=_now),
    Column("updated_at", UTCDateTime(), nullable=False, default=_now, onupdate=_now),
    # The W3C traceparent active at create() (OpenTelemetry): the steps' spans continue it.
    # After the timestamps, where migration 0010 added it (the later columns follow it).
    Column("trace_context", String(TRACE_CONTEXT_SIZE)),
    # The tick of its class's schedule this workflow was created for (None: created by
    # create()); unique per class. Migration 0011 added it at the end of the table.
    Column("scheduled_tick", UTCDateTime()),
    # Child workflows (migration 0012): a child's parent and its key among the parent's
    # children — its identity, unique per parent — and, on a parent, how many children it
    # started, how many ended (finished or canceled) and how many of those were canceled. The
    # counters make the fan-in one row update per child, whatever the number of children
    # (engine.children). A server default only: a Python-side one would put them into the
    # bulk start's INSERT … SELECT.
    Column("parent_id", Id),
    Column("child_key", String(255)),
    Column("children_started", Integer, nullable=False, server_default=text("0")),
    Column("children_ended", Integer, nullable=False, server_default=text("0")),
    Column("children_failed", Integer, nullable=False, server_default=text("0")),
    # The value passed as create(input=...), typed JSON, read as ``self.input`` (migration
    # 0014 added it at the end of the table).
    Column("input", Json),
    # Fair claims (migration 0015): the class's ``fairness_key`` of this workflow, computed
    # once by create(); each of its executions carries a copy (``StepExecution.fair_key``).
    Column("fair_key", String(255)),
    *_workflow_indexes(),
)


class WorkflowColumns:
    """Columns of :data:`workflows_table` as ``Workflow`` maps them (annotations only: the
    table is declared above; ``metadata`` is mapped as ``metadata_json``, ``metadata`` being
    the declarative base's own attribute)."""

    id: Mapped[int]
    type: Mapped[str]
    hero_type: Mapped[str | None]
    hero_id: Mapped[str | None]
    state: Mapped[str]
    current_step_name: Mapped[str | None]
    next_step_name: Mapped[str | None]
    allow_multiple: Mapped[bool]
    started_at: Mapped[datetime | None]
    transitioned_at: Mapped[datetime | None]
    metadata_json: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    trace_context: Mapped[str | None]
    scheduled_tick: Mapped[datetime | None]
    parent_id: Mapped[int | None]
    child_key: Mapped[str | None]
    children_started: Mapped[int]
    children_ended: Mapped[int]
    children_failed: Mapped[int]
    # Mapped as ``input_json`` by ``Workflow`` (read it as ``self.input``).
    input_json: Mapped[Any | None]
    fair_key: Mapped[str | None]


if TYPE_CHECKING:

    class MappedWorkflow(WorkflowColumns, Base):
        """How the query layer sees ``Workflow`` (a layer above it): the mapped root of the
        workflows table. The query layer finds the class at run time (``workflow_model()``)
        and types the rows it returns by their columns (``WorkflowColumns``)."""


class StepExecution(Timestamps, Base):
    """One attempt to run one step: the idempotency key and the audit trail at once."""

    __tablename__ = EXECUTIONS

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    workflow_id: Mapped[int] = mapped_column(Id, ForeignKey(f"{WORKFLOWS}.id", ondelete="CASCADE"))
    step_name: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(
        String(32), default=ExecutionState.SCHEDULED, server_default=ExecutionState.SCHEDULED
    )
    outcome: Mapped[str | None] = mapped_column(String(32))
    scheduled_for: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    canceled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    skipped_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    error_class_name: Mapped[str | None] = mapped_column(String(255))
    error_message: Mapped[str | None] = mapped_column(LongText)
    error_backtrace: Mapped[str | None] = mapped_column(LongText)
    job_id: Mapped[str | None] = mapped_column(String(255))
    metadata_json: Mapped[dict[str, Any] | None] = mapped_column("metadata", Json)
    cursor: Mapped[Any | None] = mapped_column(Json)
    continues_from_id: Mapped[int | None] = mapped_column(Id)
    signal_id: Mapped[int | None] = mapped_column(Id)
    waiting_since: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Database-worker columns: where the row is routed and who holds it right now.
    queue: Mapped[str] = mapped_column(String(255), default="default", server_default="default")
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    lease_owner: Mapped[str | None] = mapped_column(String(255))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Set when the row parks (writer.park) and kept afterwards as history: the name of the
    # signal it waits for, and when its timeout fires (None: it waits for ever). Migration 0005
    # added them at the end of the table, hence the sort order (after the timestamps).
    awaiting_signal: Mapped[str | None] = mapped_column(String(255), sort_order=10)
    wait_deadline: Mapped[datetime | None] = mapped_column(UTCDateTime(), sort_order=10)
    # What the step's body returned, typed JSON, on its successful execution only
    # (``Workflow.result_of``). Migration 0014.
    result_json: Mapped[Any | None] = mapped_column("result", Json, sort_order=11)
    # Its workflow's fairness key (migration 0015, at the end of the table): a fair claim
    # takes the oldest due row of the key served least recently (``queries.fairness``).
    fair_key: Mapped[str | None] = mapped_column(String(255), sort_order=12)
    # Which run of its step in its workflow this is (migration 0017): 1, 2, … counted as
    # ``admin.show``'s timeline counts them; 0 on a timer (not a run); NULL where unknown
    # (rows from before 0017, and later runs of their steps). Computed by the database as the
    # row is inserted (``queries.executions.attempt_value``), read by a step's span.
    attempt: Mapped[int | None] = mapped_column(Integer, sort_order=13)

    __table_args__ = (
        # Not (workflow_id), (state) nor (scheduled_for), which the gem has: wider or partial
        # indexes below serve every query on them, and every index costs a write per state
        # change (see 0003 and 0004). Nor in-progress rows by started_at: the lease index
        # holds every in-progress row, few enough to sort (0008).
        # The three below index only the rows that have a value (migration 0006): most rows
        # never get a continuation or a signal, and an active row has no finished_at, so a
        # NULL entry would be written at every step for queries that never look for NULL.
        *_non_null_index("ix_geneva_drive_step_executions_finished_at", "finished_at"),
        # Scheduled rows by due time (the idle worker's next due time, the stuck-scheduled
        # sweep). Partial, not (state, scheduled_for) over the whole history: on a sudden
        # backlog SQLite took that one for the claim and sorted every due row (migration 0004).
        *_partial_index(
            "ix_geneva_drive_step_executions_scheduled", "scheduled_for", state="scheduled"
        ),
        Index("ix_geneva_drive_step_executions_workflow_created", "workflow_id", "created_at"),
        Index("ix_geneva_drive_step_executions_workflow_state", "workflow_id", "state"),
        *_non_null_index("ix_geneva_drive_step_executions_continues_from_id", "continues_from_id"),
        *_non_null_index("ix_geneva_drive_step_executions_signal_id", "signal_id"),
        # At most one scheduled/in-progress execution per workflow ("waiting" is kept single by
        # the stray sweep instead, so a parked row never blocks the creation of its successor).
        # MySQL/MariaDB: a unique generated column instead (see MYSQL_UNIQUE_KEYS).
        only_on(
            partial(
                Index("ix_geneva_drive_step_executions_one_active", "workflow_id", unique=True),
                "state IN ('scheduled', 'in_progress')",
            ),
            PARTIAL_INDEX_DIALECTS,
        ),
        # The worker's claim: due scheduled rows by queue, priority, due time. Only rows
        # without a fairness key on PostgreSQL and SQLite (migration 0016): keyed rows are
        # claimed by their keys' turns, through the fair index below, so a keyed burst is
        # never walked to find an unkeyed row, and no scheduled row is in both indexes.
        *_where_index(
            "ix_geneva_drive_step_executions_due",
            ("queue", "priority", "scheduled_for"),
            UNKEYED_SCHEDULED,
            ("state", "queue", "priority", "scheduled_for"),
        ),
        # The claim of a worker that serves every queue: without it the planner has no
        # ordered path and may scan every ready workflow per claim under a sudden backlog.
        *_where_index(
            "ix_geneva_drive_step_executions_due_any",
            ("priority", "scheduled_for"),
            UNKEYED_SCHEDULED,
            ("state", "priority", "scheduled_for"),
        ),
        # The fair claim: a key's due rows in claim order (``queries.fairness``). Only rows
        # that have a key, on PostgreSQL and SQLite: no other execution writes to it.
        *_where_index(
            "ix_geneva_drive_step_executions_fair",
            ("fair_key", "priority", "scheduled_for"),
            "state = 'scheduled' AND fair_key IS NOT NULL",
            ("fair_key", "state", "priority", "scheduled_for"),
        ),
        # Expired leases; and housekeeping's stuck in-progress sweep, which sorts what it reads
        # here by started_at: every in-progress row is here, and there are only as many as
        # steps running.
        *_partial_index(
            "ix_geneva_drive_step_executions_lease", "lease_expires_at", state="in_progress"
        ),
        # Housekeeping's waiting gauges (how many rows wait, how many since before a time). A
        # partial index, not the `state` index: SQLite's ANALYZE keeps only an average per key,
        # so once the history is analysed `state = 'waiting'` looks like a third of the table
        # and it scans instead (migration 0002).
        *_partial_index(
            "ix_geneva_drive_step_executions_waiting", "waiting_since", state="waiting"
        ),
        # The admin filter "waits for signal X" and the overdue-waits count (migration 0005):
        # over the waiting rows only, so the cost follows what waits, not the history.
        *_partial_index(
            "ix_geneva_drive_step_executions_awaiting",
            "awaiting_signal",
            "wait_deadline",
            state="waiting",
        ),
        # The admin filters "failed with error class X" and "has a failed execution": failed
        # rows are written once, so on PostgreSQL/SQLite no other write pays for this one.
        *_partial_index(
            "ix_geneva_drive_step_executions_failed",
            "error_class_name",
            "workflow_id",
            state="failed",
        ),
    )

    # -- reading -------------------------------------------------------------------------

    @property
    def cursor_value(self) -> Any:
        return None if self.cursor is None else serialization.decode(self.cursor)

    @property
    def result(self) -> Any:
        """What the step returned on this execution (None: nothing, or not a success)."""
        return None if self.result_json is None else serialization.decode(self.result_json)

    @property
    def resuming(self) -> bool:
        return self.continues_from_id is not None

    @property
    def is_timer(self) -> bool:
        """Whether this row is a signal timeout's timer, not a run of the step's body.

        A timer is a scheduled execution of the waiting step whose metadata names the parked
        execution it times out (``timeout_for``); see :mod:`geneva_drive.signals`.
        """
        return self.read_metadata(TIMEOUT_FOR) is not None

    def read_metadata(self, key: str) -> Any:
        return (self.metadata_json or {}).get(key)

    def write_metadata(self, key: str, value: Any) -> None:
        # Reassign (not mutate) so the ORM sees the change without MutableDict.
        self.metadata_json = {**(self.metadata_json or {}), key: serialization.encode(value)}

    @property
    def reattempt_reason(self) -> str | None:
        reason = self.read_metadata("reattempt_reason")
        return reason if isinstance(reason, str) else None

    @property
    def exception_info(self) -> dict[str, Any] | None:
        info = self.read_metadata("exception")
        return info if isinstance(info, dict) else None

    @property
    def active(self) -> bool:
        return self.state in (
            ExecutionState.SCHEDULED,
            ExecutionState.WAITING,
            ExecutionState.IN_PROGRESS,
        )

    def __repr__(self) -> str:
        return (
            f"<StepExecution id={self.id} workflow_id={self.workflow_id} "
            f"step={self.step_name!r} state={self.state} outcome={self.outcome}>"
        )


class Signal(Timestamps, Base):
    """An event addressed to one workflow instance."""

    __tablename__ = SIGNALS

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    workflow_id: Mapped[int] = mapped_column(Id, ForeignKey(f"{WORKFLOWS}.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(255))
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(32), default="pending", server_default="pending")
    payload_json: Mapped[Any | None] = mapped_column("payload", Json)
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    consumed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    claimed: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    consumed: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    # The W3C traceparent active at signal(): the woken step's span links to it.
    trace_context: Mapped[str | None] = mapped_column(String(TRACE_CONTEXT_SIZE), sort_order=100)

    __table_args__ = (
        Index(
            "ix_geneva_drive_signals_dedup", "workflow_id", "name", "idempotency_key", unique=True
        ),
        Index("ix_geneva_drive_signals_workflow_state", "workflow_id", "state"),
    )

    duplicate_delivery: bool = False  # per instance, set by Workflow.signal(); not a column

    @property
    def payload(self) -> Any:
        return None if self.payload_json is None else serialization.decode(self.payload_json)

    def __repr__(self) -> str:
        return f"<Signal id={self.id} name={self.name!r} state={self.state}>"


class OperatorAction(Base):
    """Who did what to a workflow from the admin API, and why (shown in its timeline).

    A table of its own rather than workflow metadata: it is appended to, never rewritten, and
    it keeps an action's execution and detail without growing the hot workflow row. Deleted
    with its workflow (ON DELETE CASCADE).
    """

    __tablename__ = OPERATOR_ACTIONS

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    workflow_id: Mapped[int] = mapped_column(Id, ForeignKey(f"{WORKFLOWS}.id", ondelete="CASCADE"))
    execution_id: Mapped[int | None] = mapped_column(Id)
    action: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str | None] = mapped_column(LongText)
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    detail: Mapped[dict[str, Any] | None] = mapped_column(Json)

    __table_args__ = (Index("ix_geneva_drive_operator_actions_workflow_at", "workflow_id", "at"),)

    def __repr__(self) -> str:
        return (
            f"<OperatorAction workflow_id={self.workflow_id} action={self.action} "
            f"actor={self.actor!r}>"
        )


class ScheduleRow(Base):
    """One workflow class's schedule: its next tick, its last one, and whether it is paused.

    A row per class with ``schedule = Schedule(...)``, inserted by the first worker that loads
    the class. Every worker reads the due ones; the one whose guarded update moves
    ``next_tick`` on creates the tick's workflow in the same transaction (``engine.schedules``).
    ``cron`` and ``timezone`` are what the row's ticks were computed from: a deploy that
    changes the class's schedule recomputes ``next_tick``.
    """

    __tablename__ = SCHEDULES

    workflow_type: Mapped[str] = mapped_column(String(255), primary_key=True)
    cron: Mapped[str] = mapped_column(String(255))
    timezone: Mapped[str] = mapped_column(String(255))
    next_tick: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_tick: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_workflow_id: Mapped[int | None] = mapped_column(Id)
    paused: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=_now, onupdate=_now)

    def __repr__(self) -> str:
        return (
            f"<ScheduleRow {self.workflow_type} next={self.next_tick} last={self.last_tick} "
            f"paused={self.paused}>"
        )


# -- concurrency and rate limits (``engine.limits``, ``storage.queries.limits``) -------------

LIMIT_KEYS = "geneva_drive_limit_keys"
LIMIT_SLOTS = "geneva_drive_limit_slots"
LIMIT_WAITERS = "geneva_drive_limit_waiters"
RATE_STARTS = "geneva_drive_rate_starts"


class LimitKey(Base):
    """One row per rate-limit key in use: the lock under which a start is counted against
    the key's window and logged, one worker after another. ``kind``: ``rate``."""

    __tablename__ = LIMIT_KEYS

    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class LimitSlot(Base):
    """One of a concurrency key's slots, numbered from 0 below the limit; held by the
    in-progress execution it names, free when it names none. One row per (key, slot): the
    primary key caps the holders whatever happens."""

    __tablename__ = LIMIT_SLOTS

    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    slot: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    execution_id: Mapped[int | None] = mapped_column(Id)
    workflow_id: Mapped[int | None] = mapped_column(Id)
    taken_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_geneva_drive_limit_slots_execution", "execution_id", unique=True),)


class LimitWaiter(Base):
    """A scheduled execution parked until a slot of ``key`` frees, woken in (priority,
    since) order by the release."""

    __tablename__ = LIMIT_WAITERS

    execution_id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=False)
    key: Mapped[str] = mapped_column(String(255))
    priority: Mapped[int] = mapped_column(Integer)
    since: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        Index("ix_geneva_drive_limit_waiters_key", "key", "priority", "since", "execution_id"),
    )


class RateStart(Base):
    """One start of a rate-limited step: the log a sliding window counts."""

    __tablename__ = RATE_STARTS

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    execution_id: Mapped[int] = mapped_column(Id)

    __table_args__ = (Index("ix_geneva_drive_rate_starts_key", "key", "started_at"),)


# -- fair claims (``storage.queries.fairness``) ---------------------------------------------

FAIR_KEYS = "geneva_drive_fair_keys"


class FairKey(Base):
    """One row per fairness key ever used (and ``''``, the turn of the ordinary order): when
    a fair claim last served it. The fair claim takes the key served least recently."""

    __tablename__ = FAIR_KEYS

    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    served_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_geneva_drive_fair_keys_served", "served_at", "key"),)

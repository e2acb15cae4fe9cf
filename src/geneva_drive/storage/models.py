"""The three tables: workflows, step executions, signals.

Our tables live in their own ``MetaData`` (``Base.metadata``) so they never mix with the
application's models, and the schema is created by the shipped Alembic migrations
(``geneva_drive.install``). ``Workflow`` itself — the polymorphic root that user classes
subclass — is mapped in ``workflow.py`` on top of :class:`WorkflowColumns`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
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
from sqlalchemy.dialects import mysql, postgresql
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

# Dialect names: SQLAlchemy calls MariaDB "mariadb" for mariadb:// URLs, "mysql" otherwise.
MYSQL_DIALECTS = ("mysql", "mariadb")
PARTIAL_INDEX_DIALECTS = ("postgresql", "sqlite")
# Our tables' own character set and collation on MySQL/MariaDB, whatever the server default:
# a binary collation compares strings exactly, as PostgreSQL and SQLite do (idempotency keys,
# step names and hero ids differing only in case are different).
# (SQLAlchemy's MariaDB dialect reads the mariadb_ spelling, its MySQL dialect the mysql_ one.)
MYSQL_TABLE_OPTIONS = {
    f"{prefix}_{option}": value
    for prefix in MYSQL_DIALECTS
    for option, value in (("charset", "utf8mb4"), ("collate", "utf8mb4_bin"))
}
DIALECTS_INFO_KEY = "geneva_drive_dialects"


def only_on(index: Index, dialects: tuple[str, ...]) -> Index:
    """Create ``index`` on these dialects only (and say so in ``index.info`` for comparisons)."""
    index.info[DIALECTS_INFO_KEY] = dialects

    def on_these_dialects(*_args: Any, dialect: Dialect, **_kw: Any) -> bool:
        return dialect.name in dialects

    return index.ddl_if(callable_=on_these_dialects)


TIMEOUT_FOR = "timeout_for"  # on a timer row: the id of the parked execution it times out


class UTCDateTime(TypeDecorator[datetime]):
    """Stores naive UTC on every engine and always hands back aware UTC datetimes."""

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        # MySQL/MariaDB DATETIME drops fractions of a second unless asked for them; ordering
        # executions by (created_at, id) and due times within one second need microseconds.
        if dialect.name in MYSQL_DIALECTS:
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


# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
Id = BigInteger().with_variant(Integer(), "sqlite")
# On MariaDB, JSON is an alias of LONGTEXT with a json_valid() check; SQLAlchemy's JSON type
# encodes and decodes it all the same (MySQL 8 has a native JSON type).
Json = JSON().with_variant(postgresql.JSONB(), "postgresql")
# Error messages and backtraces are unbounded; MySQL's TEXT stops at 64 KiB.
LongText = Text().with_variant(mysql.LONGTEXT(), *MYSQL_DIALECTS)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: Json}


def workflow_table_args() -> tuple[Any, ...]:
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
        # One ongoing workflow per (class, hero): the database is the arbiter under races.
        # MySQL/MariaDB: a unique generated column instead (see MYSQL_UNIQUE_KEYS).
        only_on(
            Index(
                "ix_geneva_drive_workflows_unique_ongoing",
                "type",
                "hero_type",
                "hero_id",
                unique=True,
                postgresql_where=text(ongoing),
                sqlite_where=text(ongoing),
            ),
            PARTIAL_INDEX_DIALECTS,
        ),
        MYSQL_TABLE_OPTIONS,
    )


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
    name: str, columns: tuple[str, ...], where: str, mysql_columns: tuple[str, ...]
) -> tuple[Index, Index]:
    """``name`` over ``columns WHERE where`` where partial indexes exist, else over
    ``mysql_columns`` (MySQL/MariaDB)."""
    predicate = text(where)
    return (
        only_on(
            Index(name, *columns, postgresql_where=predicate, sqlite_where=predicate),
            PARTIAL_INDEX_DIALECTS,
        ),
        only_on(Index(name, *mysql_columns), MYSQL_DIALECTS),
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


class WorkflowColumns(Timestamps):
    """Columns of ``geneva_drive_workflows``; ``workflow.Workflow`` maps them.

    The table name and indexes are declared on ``Workflow`` itself: declared on a mixin, every
    subclass would try to map a table of its own instead of sharing the single table.
    """

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    type: Mapped[str] = mapped_column(String(255))
    hero_type: Mapped[str | None] = mapped_column(String(255))
    hero_id: Mapped[str | None] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(
        String(32), default=WorkflowState.READY, server_default=WorkflowState.READY
    )
    current_step_name: Mapped[str | None] = mapped_column(String(255))
    next_step_name: Mapped[str | None] = mapped_column(String(255))
    allow_multiple: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=text("false")
    )
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    transitioned_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    metadata_json: Mapped[dict[str, Any] | None] = mapped_column("metadata", Json)
    # The value passed as create(input=...), typed JSON (read it as ``self.input``). Migration
    # 0010 added it at the end of the table, hence the sort order.
    input_json: Mapped[Any | None] = mapped_column("input", Json, sort_order=10)


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
    # (``Workflow.result_of``). Migration 0010.
    result_json: Mapped[Any | None] = mapped_column("result", Json, sort_order=11)

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
            Index(
                "ix_geneva_drive_step_executions_one_active",
                "workflow_id",
                unique=True,
                postgresql_where=text("state IN ('scheduled', 'in_progress')"),
                sqlite_where=text("state IN ('scheduled', 'in_progress')"),
            ),
            PARTIAL_INDEX_DIALECTS,
        ),
        # The worker's claim: due scheduled rows by queue, priority, due time.
        *_partial_index(
            "ix_geneva_drive_step_executions_due",
            "queue",
            "priority",
            "scheduled_for",
            state="scheduled",
        ),
        # The claim of a worker that serves every queue: without it the planner has no
        # ordered path and may scan every ready workflow per claim under a sudden backlog.
        *_partial_index(
            "ix_geneva_drive_step_executions_due_any",
            "priority",
            "scheduled_for",
            state="scheduled",
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
        MYSQL_TABLE_OPTIONS,
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

    __table_args__ = (
        Index(
            "ix_geneva_drive_signals_dedup", "workflow_id", "name", "idempotency_key", unique=True
        ),
        Index("ix_geneva_drive_signals_workflow_state", "workflow_id", "state"),
        MYSQL_TABLE_OPTIONS,
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

    __table_args__ = (
        Index("ix_geneva_drive_operator_actions_workflow_at", "workflow_id", "at"),
        MYSQL_TABLE_OPTIONS,
    )

    def __repr__(self) -> str:
        return (
            f"<OperatorAction workflow_id={self.workflow_id} action={self.action} "
            f"actor={self.actor!r}>"
        )

"""The shipped Alembic migrations: they build exactly the models' schema, on every backend.

Each test gets a fresh, empty database (``empty_engine``, from conftest) of each backend.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError

import geneva_drive.definition.workflow  # registers geneva_drive_workflows on Base.metadata
from geneva_drive.storage import migrate
from geneva_drive.storage.models import Base
from geneva_drive.storage.revision import HEAD_REVISION

OUR_TABLES = {
    "geneva_drive_workflows",
    "geneva_drive_step_executions",
    "geneva_drive_signals",
    "geneva_drive_operator_actions",
    "geneva_drive_schedules",
}
LIMIT_TABLES = {
    "geneva_drive_limit_keys",
    "geneva_drive_limit_slots",
    "geneva_drive_limit_waiters",
    "geneva_drive_rate_starts",
}
OUR_TABLES |= LIMIT_TABLES
OUR_TABLES |= {"geneva_drive_fair_keys"}  # fair claims (migration 0015)


def _head() -> str:
    head = ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()
    assert head is not None
    return head


def _tables(engine: sa.Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names())


def _schema_diff(engine: sa.Engine) -> list[Any]:
    """Alembic autogenerate's differences between the live database and ``Base.metadata``."""

    def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
        return not (type_ == "table" and name == migrate.VERSION_TABLE)

    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "compare_type": True,
                # True, except that MySQL/MariaDB reflect DEFAULT false as '0'.
                "compare_server_default": migrate.compare_server_default,
                "include_name": include_name,
                # What the models declare for other dialects only, and MySQL/MariaDB's
                # generated unique-key columns (added by DDL, not declared), are no difference.
                "include_object": migrate.comparison_filter(engine.dialect.name),
            },
        )
        return list(compare_metadata(context, Base.metadata))


def _snapshot(engine: sa.Engine) -> dict[str, Any]:
    """Everything reflection tells about our tables, in a comparable form.

    Unlike ``compare_metadata`` this includes partial-index predicates and constraint names.
    """
    inspector = sa.inspect(engine)
    dialect = engine.dialect
    snapshot: dict[str, Any] = {}
    for table in sorted(OUR_TABLES & set(inspector.get_table_names())):
        columns = [
            (
                column["name"],
                column["type"].compile(dialect=dialect),
                column["nullable"],
                column.get("default"),
            )
            for column in inspector.get_columns(table)
        ]
        indexes = sorted(
            (
                index["name"],
                tuple(index["column_names"]),
                index["unique"],
                sorted((k, str(v)) for k, v in index.get("dialect_options", {}).items()),
            )
            for index in inspector.get_indexes(table)
        )
        foreign_keys = sorted(
            (fk["name"], tuple(fk["constrained_columns"]), fk["referred_table"], fk["options"])
            for fk in inspector.get_foreign_keys(table)
        )
        snapshot[table] = {
            "columns": columns,
            "primary_key": inspector.get_pk_constraint(table),
            "foreign_keys": foreign_keys,
            "indexes": indexes,
            "unique_constraints": inspector.get_unique_constraints(table),
        }
    return snapshot


def _downgrade(engine: sa.Engine, revision: str = "base") -> None:
    with engine.begin() as conn:
        command.downgrade(migrate.alembic_config(conn), revision)


# --- (a) the migrations build the models' schema ------------------------------------------------


def test_install_builds_exactly_the_models_schema(empty_engine: sa.Engine):
    migrate.install(empty_engine)

    assert _tables(empty_engine) == OUR_TABLES | {migrate.VERSION_TABLE}
    # Nothing is ignored (compare_type and compare_server_default are on) except our version
    # table, which is Alembic's and not in Base.metadata.
    assert _schema_diff(empty_engine) == []


def _one_active_order(engine: sa.Engine) -> str | None:
    """MySQL/MariaDB: the sort order of the one-active key's index ("A", "D"); else None."""
    if engine.dialect.name not in ("mysql", "mariadb"):
        return None
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SHOW INDEX FROM geneva_drive_step_executions "
                "WHERE Key_name = 'ix_geneva_drive_step_executions_one_active'"
            )
        ).one()
    return str(row.Collation)


def test_migrated_schema_reflects_identically_to_create_all(empty_engine: sa.Engine):
    # compare_metadata does not look at partial-index predicates or constraint names; reflection
    # does. So reflect the migrated schema, rebuild it from the models, and compare the two.
    migrate.install(empty_engine)
    migrated = _snapshot(empty_engine)
    migrated_order = _one_active_order(empty_engine)
    _downgrade(empty_engine)
    with empty_engine.begin() as conn:
        Base.metadata.create_all(conn)
    from_models = _snapshot(empty_engine)

    assert set(migrated) == OUR_TABLES
    assert migrated == from_models
    partial = {
        index[0]
        for table in migrated.values()
        for index in table["indexes"]
        if any(key.endswith("_where") for key, _ in index[3])
    }
    if empty_engine.dialect.name in ("mysql", "mariadb"):
        # No partial indexes there: the unique rules are unique indexes over generated columns
        # (the other partial indexes are plain ones led by `state`).
        assert partial == set()
        unique = {
            (index[0], index[1])
            for table in migrated.values()
            for index in table["indexes"]
            if index[2]
        }
        assert {
            ("ix_geneva_drive_workflows_unique_ongoing", ("ongoing_unique_key",)),
            ("ix_geneva_drive_step_executions_one_active", ("active_unique_key",)),
            ("ix_geneva_drive_workflows_scheduled_tick", ("type", "scheduled_tick")),
        } <= unique
        # Descending (0007: no deadlock ring between neighbouring workflows), both ways.
        assert migrated_order == _one_active_order(empty_engine) == "D"
        return
    # On both backends the predicates survive (SQLite and PostgreSQL reflect them).
    assert partial == {
        "ix_geneva_drive_workflows_unique_ongoing",
        "ix_geneva_drive_step_executions_one_active",
        "ix_geneva_drive_step_executions_scheduled",
        "ix_geneva_drive_step_executions_due",
        "ix_geneva_drive_step_executions_due_any",
        "ix_geneva_drive_step_executions_lease",
        "ix_geneva_drive_step_executions_waiting",
        "ix_geneva_drive_step_executions_awaiting",
        "ix_geneva_drive_step_executions_failed",
        "ix_geneva_drive_step_executions_fair",  # scheduled rows that have a key (0015)
        # Only the rows that have a value (0006).
        "ix_geneva_drive_step_executions_finished_at",
        "ix_geneva_drive_step_executions_continues_from_id",
        "ix_geneva_drive_step_executions_signal_id",
        # Only scheduled workflows (0011).
        "ix_geneva_drive_workflows_scheduled_tick",
        # Children only (0012).
        "ix_geneva_drive_workflows_child",
    }


# Builds the models' schema in an interpreter that has done nothing else (argv[1]: the URL).
CREATE_ALL_FRESH = """
import sys
import sqlalchemy as sa
import geneva_drive.definition.workflow
from geneva_drive.storage.models import Base
engine = sa.create_engine(sys.argv[1])
with engine.begin() as conn:
    Base.metadata.create_all(conn)
engine.dispose()
"""


def test_create_all_in_a_fresh_process_builds_the_migrated_schema(empty_engine: sa.Engine):
    # The per-database options (partial-index predicates, MySQL's utf8mb4) must be in the
    # models however they are declared: create_all in a process where no migration ran must
    # build the migrated schema (issue 42 tried declaring them only for the database in use).
    src = Path(geneva_drive.definition.workflow.__file__).resolve().parents[2]
    url = empty_engine.url.render_as_string(hide_password=False)
    subprocess.run(
        [sys.executable, "-c", CREATE_ALL_FRESH, url],
        env={**os.environ, "PYTHONPATH": str(src)},
        check=True,
        capture_output=True,
        timeout=120,
    )
    from_models = _snapshot(empty_engine)
    with empty_engine.begin() as conn:
        Base.metadata.drop_all(conn)
    migrate.install(empty_engine)

    assert _snapshot(empty_engine) == from_models


def test_there_is_a_single_head_and_install_reaches_it(empty_engine: sa.Engine):
    assert migrate.current_revision(empty_engine) is None
    migrate.install(empty_engine)
    assert migrate.current_revision(empty_engine) == _head()


# --- (b) install is idempotent -------------------------------------------------------------------


def test_install_twice_is_a_no_op(empty_engine: sa.Engine):
    migrate.install(empty_engine)
    schema = _snapshot(empty_engine)
    with empty_engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO geneva_drive_workflows (type, created_at, updated_at) "
                "VALUES ('Probe', :now, :now)"
            ),
            {"now": datetime(2025, 1, 1)},
        )

    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    sa.event.listen(empty_engine, "before_cursor_execute", record)
    try:
        migrate.install(empty_engine)
    finally:
        sa.event.remove(empty_engine, "before_cursor_execute", record)

    # Only reads: the version table and reflection. No DDL, no version bump.
    writes = ("CREATE", "ALTER", "DROP", "INSERT", "UPDATE", "DELETE")
    assert [s for s in statements if s.lstrip().upper().startswith(writes)] == []
    assert _snapshot(empty_engine) == schema
    assert migrate.current_revision(empty_engine) == _head()
    with empty_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT type FROM geneva_drive_workflows")).scalars().all() == [
            "Probe"
        ]


def test_concurrent_installs_in_threads_do_not_collide(empty_engine: sa.Engine):
    # Alembic's context/op proxies are process-global: install() must serialize its threads.
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def run() -> None:
        try:
            barrier.wait()
            migrate.install(empty_engine)
        except BaseException as error:  # reported by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert not any(thread.is_alive() for thread in threads), "install() hung"
    assert errors == []
    assert migrate.current_revision(empty_engine) == _head()
    assert _schema_diff(empty_engine) == []


_INSTALL_IN_A_PROCESS = """
import sys, time
from pathlib import Path
from geneva_drive.storage.db import create_engine
from geneva_drive.storage.migrate import install
engine = create_engine(sys.argv[1])
print("ready", flush=True)
while not Path(sys.argv[2]).exists():
    time.sleep(0.002)
install(engine)
"""


@pytest.mark.slow  # ~1 s: three interpreters start
def test_concurrent_installs_in_processes_do_not_collide(
    empty_engine: sa.Engine, database_url: str, tmp_path: Path
):
    # Several application processes booting at once all call install(); one creates the schema,
    # the others wait for it (the database's lock) and then find nothing to do.
    go = tmp_path / "go"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _INSTALL_IN_A_PROCESS, database_url, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
        go.touch()
        results = [child.communicate(timeout=60) for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait()

    failures = [err for child, (_, err) in zip(children, results, strict=True) if child.returncode]
    if failures:
        pytest.fail("install() failed in a concurrent process:\n" + "\n".join(failures))
    assert migrate.current_revision(empty_engine) == _head()
    assert _schema_diff(empty_engine) == []


# --- (c) our own version table -------------------------------------------------------------------


def test_the_revision_lives_in_our_own_version_table(empty_engine: sa.Engine):
    migrate.install(empty_engine)

    assert migrate.VERSION_TABLE == "geneva_drive_alembic_version"
    assert "alembic_version" not in _tables(empty_engine)
    with empty_engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT version_num FROM geneva_drive_alembic_version")).all()
    assert rows == [(_head(),)]


def test_the_head_revision_the_startup_check_expects_is_the_last_migration():
    # The startup check reads it without loading the scripts: a new migration updates it.
    assert _head() == HEAD_REVISION


def test_the_applications_alembic_version_is_untouched(empty_engine: sa.Engine):
    with empty_engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
        conn.execute(sa.text("INSERT INTO alembic_version VALUES ('app_rev_42')"))

    migrate.install(empty_engine)
    _downgrade(empty_engine)
    migrate.install(empty_engine)

    with empty_engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT version_num FROM alembic_version")).all()
    assert rows == [("app_rev_42",)]
    assert migrate.current_revision(empty_engine) == _head()


# --- (d) downgrade ------------------------------------------------------------------------------


def test_downgrade_to_base_removes_our_tables(empty_engine: sa.Engine):
    migrate.install(empty_engine)
    _downgrade(empty_engine)

    # Alembic keeps its (now empty) version table; every table of ours is gone.
    assert _tables(empty_engine) == {migrate.VERSION_TABLE}
    assert migrate.current_revision(empty_engine) is None
    if empty_engine.dialect.name == "postgresql":
        with empty_engine.connect() as conn:
            sequences = conn.execute(
                sa.text("SELECT relname FROM pg_class WHERE relkind = 'S'")
            ).all()
        assert sequences == []

    # And the round trip works.
    migrate.install(empty_engine)
    assert _schema_diff(empty_engine) == []


def test_upgrade_to_an_explicit_revision(empty_engine: sa.Engine):
    migrate.upgrade(empty_engine, "0001")
    assert migrate.current_revision(empty_engine) == "0001"
    later = (
        {
            "geneva_drive_operator_actions",
            "geneva_drive_schedules",
        }
        | LIMIT_TABLES
        | {"geneva_drive_fair_keys"}
    )  # 0005, 0011, 0013, 0015
    assert _tables(empty_engine) >= OUR_TABLES - later


def test_upgrade_to_an_unknown_revision_changes_nothing(empty_engine: sa.Engine):
    with pytest.raises(CommandError, match="nonexistent"):
        migrate.upgrade(empty_engine, "nonexistent")
    tables = _tables(empty_engine)
    if empty_engine.dialect.name in ("mysql", "mariadb"):
        # DDL commits implicitly there: Alembic's (empty) version table stays behind.
        tables -= {migrate.VERSION_TABLE}
    assert tables == set()


def test_0008_drops_the_in_progress_started_at_index_and_its_downgrade_restores_it(
    empty_engine: sa.Engine,
):
    name = "ix_geneva_drive_step_executions_in_progress_started_at"

    def reflected() -> tuple[str, ...] | None:
        """The index's columns, then its dialect options (the predicate); None: no index."""
        indexes = sa.inspect(empty_engine).get_indexes("geneva_drive_step_executions")
        return next(
            (
                (*i["column_names"], *map(str, i.get("dialect_options", {}).values()))
                for i in indexes
                if i["name"] == name
            ),
            None,
        )

    migrate.upgrade(empty_engine, "0007")
    before = reflected()
    migrate.install(empty_engine)
    assert reflected() is None
    _downgrade(empty_engine, "0007")

    # Back as 0001 made it: partial over in-progress rows, or led by `state` on MySQL/MariaDB.
    restored = reflected()
    assert restored == before
    if empty_engine.dialect.name in ("mysql", "mariadb"):
        assert restored == ("state", "started_at")
    else:
        assert restored is not None and restored[0] == "started_at"
        assert "in_progress" in restored[1]  # the predicate, as reflected
    migrate.install(empty_engine)
    assert _schema_diff(empty_engine) == []


def test_0009_leads_the_hero_index_with_the_hero_id_and_its_downgrade_restores_the_order(
    empty_engine: sa.Engine,
):
    def columns() -> list[str] | None:
        indexes = sa.inspect(empty_engine).get_indexes("geneva_drive_workflows")
        return next(
            (
                list(i["column_names"])
                for i in indexes
                if i["name"] == "ix_geneva_drive_workflows_hero"
            ),
            None,
        )

    migrate.upgrade(empty_engine, "0008")
    assert columns() == ["hero_type", "hero_id"]
    migrate.install(empty_engine)
    assert columns() == ["hero_id", "hero_type"]  # the hero-id search is its prefix
    assert _schema_diff(empty_engine) == []
    _downgrade(empty_engine, "0008")
    assert columns() == ["hero_type", "hero_id"]
    migrate.install(empty_engine)
    assert _schema_diff(empty_engine) == []


def test_0010_adds_a_nullable_trace_context_to_workflows_and_signals_and_its_downgrade_drops_it(
    empty_engine: sa.Engine,
):
    tables = ("geneva_drive_workflows", "geneva_drive_signals")

    def trace_columns() -> list[bool]:
        inspector = sa.inspect(empty_engine)
        return [
            c["nullable"]
            for table in tables
            for c in inspector.get_columns(table)
            if c["name"] == "trace_context"
        ]

    migrate.upgrade(empty_engine, "0009")
    assert trace_columns() == []
    migrate.install(empty_engine)
    assert trace_columns() == [True, True]
    assert _schema_diff(empty_engine) == []
    _downgrade(empty_engine, "0009")
    assert trace_columns() == []


def test_0011_adds_the_schedules_and_the_tick_column_and_its_downgrade_removes_them(
    empty_engine: sa.Engine,
):
    migrate.upgrade(empty_engine, "0010")
    migrate.install(empty_engine)
    columns = {c["name"] for c in sa.inspect(empty_engine).get_columns("geneva_drive_workflows")}
    assert "scheduled_tick" in columns
    assert "geneva_drive_schedules" in _tables(empty_engine)
    _downgrade(empty_engine, "0010")
    inspector = sa.inspect(empty_engine)
    assert "geneva_drive_schedules" not in inspector.get_table_names()
    columns = {c["name"] for c in inspector.get_columns("geneva_drive_workflows")}
    assert "scheduled_tick" not in columns

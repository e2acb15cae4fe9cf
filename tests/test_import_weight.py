"""What a command imports: only what it uses, so that the CLI starts at once (issue 42).

Each check runs a fresh interpreter and reads its ``sys.modules`` after the command: Alembic
only for ``migrate``/``check``, Celery only for ``dispatch``, Rich only where a table is
printed, the dashboard's Starlette/Jinja2 only for ``dashboard`` — and ``--version`` imports
no SQLAlchemy at all. Timings are the benchmark's business (``benchmarks/cli_start.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import geneva_drive

SRC = Path(geneva_drive.__file__).resolve().parents[1]
HEAVY = ("sqlalchemy", "alembic", "celery", "kombu", "rich", "starlette", "jinja2", "uvicorn")

# The workflow DSL and the modules only it (and the engine) import: a command that reads the
# tables needs none of them (the workflows table is declared in storage.models).
DSL = (
    "geneva_drive.definition.workflow",
    "geneva_drive.definition.job_options",
    "geneva_drive.definition.steps",
)

# Runs the code given in argv[1], then prints which of the names in argv[2] it loaded — a
# top-level package, or a module by its full name (SystemExit, as the console script ends, is
# caught so the report still prints).
PROBE = """
import json, sys
try:
    exec(sys.argv[1])
except SystemExit:
    pass
loaded = {m.partition(".")[0] for m in sys.modules} | set(sys.modules)
print(json.dumps(sorted(loaded & set(json.loads(sys.argv[2])))))
"""


def loaded_after(code: str, cwd: Path, names: tuple[str, ...] = HEAVY) -> set[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    env.pop("GENEVA_DRIVE_DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, "-c", PROBE, code, json.dumps(names)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


def command(*args: str) -> str:
    return f"from geneva_drive.cli import main; main({list(args)!r})"


def test_version_imports_neither_sqlalchemy_nor_any_extra(tmp_path):
    assert loaded_after(command("--version"), tmp_path) == set()


def test_importing_the_package_imports_neither_alembic_nor_celery_nor_sqlalchemy(tmp_path):
    assert loaded_after("import geneva_drive", tmp_path) == set()


def test_a_public_name_imports_what_it_needs_and_no_alembic_or_celery(tmp_path):
    loaded = loaded_after("from geneva_drive import Workflow, configure", tmp_path)
    assert "sqlalchemy" in loaded
    assert not loaded & {"alembic", "celery", "kombu", "rich", "starlette", "jinja2"}


@pytest.fixture(scope="module")
def database(tmp_path_factory) -> str:
    """A migrated SQLite file with one workflow in it (id 1)."""
    from sqlalchemy import create_engine as sa_engine
    from sqlalchemy.orm import Session

    from geneva_drive import Workflow, install, step
    from geneva_drive.runtime.configure import configured

    path = tmp_path_factory.mktemp("weight") / "gd.db"
    url = f"sqlite:///{path}"
    engine = sa_engine(url)
    install(engine)

    class ImportWeightProbe(Workflow):
        may_proceed_without_hero = True

        @step
        def only(self) -> None:
            pass

    with configured(engine=engine), Session(engine) as session, session.begin():
        ImportWeightProbe.create(session, hero=None)
    engine.dispose()
    return url


@pytest.mark.parametrize(
    "args", [("list", "--limit", "50"), ("show", "1"), ("stats",)], ids=["list", "show", "stats"]
)
def test_reading_commands_import_no_alembic_celery_or_dashboard(database, args, tmp_path):
    loaded = loaded_after(command(*args, "--database-url", database), tmp_path)
    assert "rich" in loaded  # they print tables: the probe sees what the command loaded
    assert not loaded & {"alembic", "celery", "kombu", "starlette", "jinja2", "uvicorn"}


@pytest.mark.parametrize(
    "args", [("list", "--limit", "50"), ("show", "1"), ("stats",)], ids=["list", "show", "stats"]
)
def test_reading_commands_import_no_workflow_dsl(database, args, tmp_path):
    loaded = loaded_after(command(*args, "--database-url", database), tmp_path, (*DSL, "rich"))
    assert "rich" in loaded  # the command ran and printed its table
    assert not loaded & set(DSL)


@pytest.mark.parametrize(
    "args", [("list", "--limit", "50"), ("show", "1"), ("stats",)], ids=["list", "show", "stats"]
)
def test_reading_commands_convert_their_options_without_pydantic(database, args, tmp_path):
    # Typer 0.29 converts every option through a pydantic TypeAdapter: ~45 ms of a `list`.
    loaded = loaded_after(
        command(*args, "--database-url", database), tmp_path, ("pydantic", "rich")
    )
    assert loaded == {"rich"}


# The engine's queries and its wake-ups, which configure()'s DatabaseBackend imported: a
# command that reads rows writes none and wakes nobody (~16 ms).
ENGINE_QUERIES = (
    *(
        f"geneva_drive.storage.queries.{name}"
        for name in ("bypass", "claims", "executions", "handover", "housekeeping", "signals")
    ),
    "geneva_drive.engine.wakeups",
)


@pytest.mark.parametrize(
    "args", [("list", "--limit", "50"), ("show", "1"), ("stats",)], ids=["list", "show", "stats"]
)
def test_reading_commands_import_no_engine_queries(database, args, tmp_path):
    code = command(*args, "--database-url", database)
    assert loaded_after(code, tmp_path, (*ENGINE_QUERIES, "rich")) == {"rich"}


@pytest.mark.parametrize(
    "args", [("list", "--json"), ("show", "1", "--json")], ids=["list", "show"]
)
def test_json_output_imports_no_rich(database, args, tmp_path):
    loaded = loaded_after(command(*args, "--database-url", database), tmp_path)
    assert "sqlalchemy" in loaded
    assert "rich" not in loaded


OTHER_DATABASES = ("sqlalchemy.dialects.postgresql", "sqlalchemy.dialects.mysql")


@pytest.mark.parametrize(
    "args", [("list", "--limit", "50"), ("show", "1"), ("stats",)], ids=["list", "show", "stats"]
)
def test_reading_commands_on_sqlite_import_no_other_database(database, args, tmp_path):
    """SQLAlchemy's PostgreSQL and MySQL dialect packages (their drivers' modules, asyncpg's
    and aiomysql's adapters) cost a SQLite command ~25 ms; the schema's types for those
    databases are chosen when one of them compiles it."""
    code = command(*args, "--database-url", database)
    assert loaded_after(code, tmp_path, (*OTHER_DATABASES, "rich")) == {"rich"}


def test_admin_find_stays_the_function_after_its_module_is_imported(tmp_path):
    code = (
        "import geneva_drive.admin.find as _\n"
        "from geneva_drive import admin\n"
        "assert callable(admin.find) and admin.find.__name__ == 'find', admin.find\n"
        "assert callable(admin.count)"
    )
    loaded_after(code, tmp_path)  # the asserts run in the probe; a failure is its exit code


def test_a_query_run_before_anything_imported_the_dsl_finds_the_workflows_table(database, tmp_path):
    code = (
        "import sqlalchemy as sa\n"
        "from sqlalchemy.orm import Session\n"
        "from geneva_drive.admin.measure import stats\n"
        f"with Session(sa.create_engine({database!r})) as session:\n"
        "    assert stats(session).by_class_state == (('ImportWeightProbe', 'ready', 1),)\n"
    )
    loaded_after(code, tmp_path)


@pytest.mark.parametrize(
    "args", [("list", "--limit", "50"), ("show", "1"), ("stats",)], ids=["list", "show", "stats"]
)
def test_reading_commands_load_no_emoji_table(database, args, tmp_path):
    # Rich's table of emoji codes (~2 ms): a table of data replaces no ":name:" codes.
    code = command(*args, "--database-url", database)
    assert loaded_after(code, tmp_path, ("rich._emoji_codes", "rich")) == {"rich"}

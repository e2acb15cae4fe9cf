"""The database fixtures give every test a working, empty database of its own.

These tests use plain SQLAlchemy, not geneva_drive, so they check the harness by itself.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.support.postgres import PostgresServer, unique_database_name

_marker = sa.Table(
    "gd_smoke_marker",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("note", sa.String(50)),
)


@pytest.fixture
def plain_engine(database_url: str):
    engine = sa.create_engine(database_url)
    yield engine
    engine.dispose()


def test_a_fresh_database_accepts_connections_and_has_no_tables(plain_engine: sa.Engine):
    with plain_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
    assert sa.inspect(plain_engine).get_table_names() == []


# Both attempts find the database empty and then dirty it; if a database were shared between
# tests (or parametrizations), whichever attempt ran second would find the table.
@pytest.mark.parametrize("attempt", [1, 2])
def test_a_table_created_by_one_test_is_absent_in_the_next(plain_engine: sa.Engine, attempt: int):
    assert not sa.inspect(plain_engine).has_table(_marker.name)
    with plain_engine.begin() as conn:
        _marker.create(conn)
        conn.execute(_marker.insert().values(note=f"attempt {attempt}"))
    assert sa.inspect(plain_engine).has_table(_marker.name)


def test_the_url_names_the_backend_under_test(database_url: str, db_backend: str):
    url = sa.make_url(database_url)
    if db_backend == "sqlite":
        assert url.drivername == "sqlite"
    else:
        drivers = {"postgresql": "postgresql+psycopg", "mariadb": "mariadb+pymysql"}
        assert url.drivername == drivers[db_backend]
        assert url.database is not None and url.database.startswith("gd_test_")


@pytest.mark.postgres
def test_a_postgres_database_is_dropped_even_with_connections_left_open(
    postgres_server: PostgresServer,
):
    name = unique_database_name()
    engine = sa.create_engine(postgres_server.create_database(name))
    leaked = engine.connect()  # a test that forgets to close must not block the drop
    try:
        assert name in postgres_server.database_names()
        postgres_server.drop_database(name)
        assert name not in postgres_server.database_names()
    finally:
        leaked.invalidate()
        engine.dispose()


@pytest.mark.postgres
def test_the_postgres_server_is_a_current_release(postgres_server: PostgresServer):
    engine = sa.create_engine(postgres_server.url("postgres"))
    try:
        with engine.connect() as conn:
            version = conn.execute(sa.text("SHOW server_version_num")).scalar_one()
    finally:
        engine.dispose()
    assert int(version) >= 160000

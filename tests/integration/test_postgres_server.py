"""The real PostgreSQL server the store, leader and queue tests meet (tests/postgres_server.py): it authenticates
by password over TCP, keeps committed data across a kill and a restart, and refuses connections while down."""

from __future__ import annotations

import psycopg
import pytest

from tests.postgres_server import PostgresServer


def test_fresh_databases_are_empty_and_separate(postgres_server: PostgresServer) -> None:
    first, second = postgres_server.create_database(), postgres_server.create_database()
    with psycopg.connect(first, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x int)")
    with psycopg.connect(second) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE tablename = 't'").fetchone() == (0,)


def test_a_wrong_password_is_refused_by_the_server(postgres_server: PostgresServer) -> None:
    postgres_server.create_role("reader_pw_test", "right-password")
    with psycopg.connect(postgres_server.uri("postgres", "reader_pw_test", "right-password")) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("reader_pw_test",)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(postgres_server.uri("postgres", "reader_pw_test", "wrong"))


def test_committed_rows_survive_a_killed_server(private_postgres_server: PostgresServer) -> None:
    uri = private_postgres_server.create_database("kept")
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (1)")
    private_postgres_server.kill()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(uri, connect_timeout=2)
    private_postgres_server.start()
    with psycopg.connect(uri) as conn:
        assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]

"""The store contract's two adapters side by side: `StoreFactory` opens a named store on SQLite (a file under the
test's tmp_path) or on the shared real PostgreSQL server (a database of its own per name), so one test runs
against both (`store_factory` fixture in conftest.py, parametrised `sqlite` / `postgres`). The same name opens
the same store again (close and reopen); `raw_text` is everything stored, for tests that prove what never
reaches the database."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from reconciler.adapters.store.schema import SQLITE_HISTORY
from reconciler.adapters.store.sql import SqlStore
from reconciler.adapters.store.sqlite import SqliteStore
from tests.postgres_server import PostgresServer


class StoreFactory:
    def __init__(self, adapter: str, tmp_path: Path, server: PostgresServer | None):
        self.adapter = adapter
        self._tmp_path = tmp_path
        self._server = server
        self._uris: dict[str, str] = {}
        self._opened: list[SqlStore] = []

    def location(self, name: str = "c") -> str:
        if self._server is None:
            return str(self._tmp_path / f"{name}.db")
        if name not in self._uris:
            self._uris[name] = self._server.create_database()
        return self._uris[name]

    def __call__(self, name: str = "c", **options: Any) -> SqlStore:
        store: SqlStore
        if self._server is None:
            store = SqliteStore(self.location(name), **options)
        else:
            from reconciler.adapters.store.postgres import PostgresStore

            store = PostgresStore(self.location(name), **options)
        self._opened.append(store)
        return store

    def raw_text(self, name: str = "c") -> str:
        """Every byte the store holds, as text: the SQLite files, or every row of every table."""
        if self._server is None:
            return "".join(p.read_bytes().decode("latin-1") for p in self._tmp_path.iterdir()
                           if p.name.startswith(f"{name}.db"))
        import psycopg

        with psycopg.connect(self.location(name)) as conn:
            tables = [row[0] for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()]
            return "\n".join(str(row) for table in tables
                             for row in conn.execute(f'SELECT * FROM "{table}"').fetchall())  # noqa: S608

    def close_all(self) -> None:
        for store in self._opened:
            store.close()  # (closing twice is harmless: a test may have closed it already)


def sqlite_store_at(path: Path, version: int) -> None:
    """An empty SQLite store as code of schema `version` (1 to 3) created it."""
    conn = sqlite3.connect(path, isolation_level=None)
    for step in SQLITE_HISTORY[:version]:
        conn.executescript(step)
    conn.execute(f"PRAGMA user_version={version}")
    conn.close()


def back_to_version_3(path: Path) -> None:
    """A closed SQLite store of the current version, its rows kept, returned to version 3's layout (before the
    change sequence and the sessions): how a file written by that code looks, with rows today's code wrote for the
    test."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript("""
        BEGIN;
        DROP INDEX directives_by_change;
        ALTER TABLE instances DROP COLUMN change_seq;
        ALTER TABLE directives DROP COLUMN change_seq;
        DROP TABLE change_sequence;
        ALTER TABLE instances DROP COLUMN log_key_lines;
        DROP TABLE sessions;
        PRAGMA user_version=3;
        COMMIT;""")
    conn.close()

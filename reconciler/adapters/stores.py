"""Which store adapter a `--db` / `--controller-db` value names: a libpq URI opens the PostgreSQL store, anything
else is a SQLite file. The one place that knows both adapters (they share `store/sql.py` and know nothing of each
other); psycopg is imported only when a URI is given, so the embedded default never loads it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from reconciler.adapters.store.port import ControllerStore
from reconciler.adapters.store.sqlite import SqliteStore


def is_database_uri(target: str | Path) -> bool:
    """A libpq URI (`postgresql://...`, `postgres://...`) rather than a SQLite file path."""
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def open_store(target: str | Path, *, ring_lines: int = 5000, now: Callable[[], datetime] | None = None
               ) -> ControllerStore:
    """The store at `target`: a `postgresql://user@host:port/dbname` URI (PostgreSQL; the password from the URI,
    PGPASSWORD or ~/.pgpass, as libpq reads them) or a file path (SQLite, created if missing). Raises StoreError
    naming the target (never a password) when it cannot be opened."""
    if is_database_uri(target):
        from reconciler.adapters.store.postgres import PostgresStore

        return PostgresStore(str(target), ring_lines=ring_lines, now=now)
    return SqliteStore(Path(target), ring_lines=ring_lines, now=now)

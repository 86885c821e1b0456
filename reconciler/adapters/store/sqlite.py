"""The embedded controller store: one SQLite file (WAL) used by one process (`SqliteStore`). The SQL and the
transaction discipline are `sql.SqlStore`'s; this module adds the connection, the file's settings and the
schema upgrade in `PRAGMA user_version`."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

from reconciler.adapters.store.port import SqlConnection, StoreError, StoreUnavailable
from reconciler.adapters.store.schema import SCHEMA_VERSION, statements
from reconciler.adapters.store.sql import SqlStore
from reconciler.domain.redact import Redactor


class SqliteStore(SqlStore):
    """The embedded store: one SQLite file (WAL) used by one process. Thread-safe: one connection behind a lock.

    One connection and a lock rather than a connection per thread: SQLite serialises writers anyway, every
    statement here is short, and a single connection cannot deadlock with itself on upgrade from read to write
    locks. Other processes (`fleet status`) may read the same file concurrently (WAL); several serving
    processes or hosts are PostgreSQL's job (`PostgresStore`).
    """

    _BEGIN_WRITE = "BEGIN IMMEDIATE"
    _BEGIN_READ = "BEGIN"

    def __init__(self, path: str | Path, ring_lines: int = 5000, *, now: Callable[[], datetime] | None = None,
                 max_progress_events: int = 1000, max_other_events: int = 1000, redactor: Redactor | None = None):
        super().__init__(ring_lines, now=now, max_progress_events=max_progress_events,
                         max_other_events=max_other_events, redactor=redactor)
        self.path = Path(path)
        self.location = str(self.path)
        self._lock = threading.Lock()  # guards the connection
        try:
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open the controller store: {exc}") from None
        try:
            self._configure()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise StoreError(f"{self.path}: not a usable controller store: {exc}") from None

    def _configure(self) -> None:
        mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise sqlite3.DatabaseError(f"journal_mode is {mode!r}, WAL is required")
        # In WAL mode, synchronous=NORMAL fsyncs only at checkpoints, not on every commit. A committed
        # transaction survives a crash of this process (SIGKILL, OOM) because the WAL is in the OS page
        # cache; only an OS crash or power loss can roll back the last few commits, never corrupt the
        # file. That is the right trade for ingest speed: workers keep (and resend) their own log tail.
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        self._conn.execute("PRAGMA busy_timeout=10000")
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            if version < SCHEMA_VERSION:
                # Each step is additive: a store written by older code keeps all its data.
                for statement in statements("sqlite", version):
                    self._conn.execute(statement)
                self._conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif version > SCHEMA_VERSION:
                raise StoreError(f"{self.path}: store schema version {version} is newer than this code "
                                 f"understands ({SCHEMA_VERSION}); upgrade the fleet package")
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def _connection(self) -> Iterator[SqlConnection]:
        with self._lock:
            yield self._conn

    def _unavailable(self, exc: BaseException) -> StoreUnavailable | None:
        # "database is locked" (another process, e.g. a copy, held the file for busy_timeout), disk I/O errors:
        # temporary. Integrity or programming errors are bugs, never "retry later".
        if isinstance(exc, sqlite3.OperationalError):
            return StoreUnavailable(f"{self.path}: {exc}")
        return None

    def _rollback(self, conn: SqlConnection) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def integrity_check(self) -> list[str]:
        """`PRAGMA integrity_check` rows: ['ok'] for a sound file."""
        return [r[0] for r in self._snapshot(lambda conn: conn.execute("PRAGMA integrity_check").fetchall())]

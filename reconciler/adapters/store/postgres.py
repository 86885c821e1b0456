"""The controller store on PostgreSQL: what several controller replicas on different hosts share.

Where it sits: the production adapter of the store port (`port.ControllerStore`); the SQL and the transaction
discipline are `sql.SqlStore`'s, shared with the embedded SQLite adapter. This module adds what only a server
database needs:
- Connections: a `psycopg_pool.ConnectionPool` (autocommit connections; the shared code opens and commits its
  own transactions). A connection lost to a server restart is discarded by the pool and replaced on demand, so a
  replica reconnects by itself; meanwhile every read or write fails as `StoreUnavailable` (the API answers 503
  with Retry-After; a pass observes nothing and judges nothing).
- Locks: a write locks the instance's row (`FOR UPDATE`) before deciding on it (see the package docstring).
- Reads: `REPEATABLE READ READ ONLY`, one snapshot across tables, as SQLite's read transaction gives.
- Schema (the tables are `schema.py`'s, shared with SQLite, plus the leader lease's `fleet_lease`): `fleet_schema`
  holds the version; `migrate` upgrades under `pg_advisory_lock` (one replica migrates, the others wait and then
  find the work done) and refuses a database of a newer schema than this code.
- Secrets: the password comes from the URI, PGPASSWORD or ~/.pgpass (libpq reads them); anything shown (errors,
  `location`) carries the URI without it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import psycopg
import psycopg_pool

from reconciler.adapters.store.port import REPORT_TAIL_LINES, SqlConnection, SqlCursor, StoreError, StoreUnavailable
from reconciler.adapters.store.schema import SCHEMA_VERSION, statements
from reconciler.adapters.store.sql import SqlStore
from reconciler.domain.redact import Redactor, redact_line

log = logging.getLogger(__name__)

#: pg_advisory_lock key held while one replica migrates the schema ('fleetmig' in ASCII).
MIGRATION_LOCK_KEY = 0x666C6565746D6967
#: Seconds libpq waits for a server that does not answer (unless the URI says `connect_timeout`).
CONNECT_TIMEOUT_S = 5
#: Seconds a read or write waits for a pooled connection before it fails as StoreUnavailable (the server is
#: down or every connection busy): short, because the HTTP edge waits on it.
ACQUIRE_TIMEOUT_S = 1.0


def redacted_uri(uri: str) -> str:
    """The URI as it may be shown: user, host, port, database and options, never a password (in the authority,
    whatever characters it holds, or as a `password=` option): the fleet's redaction of URL passwords."""
    return redact_line(uri)


def _password_of(uri: str) -> str | None:
    parts = urlsplit(uri)
    if parts.password:
        return unquote(parts.password)
    return dict(parse_qsl(parts.query)).get("password")


def scrubbed(message: str, uri: str) -> str:
    """A driver's message with the password replaced, should libpq ever quote it, in plain or URI-encoded form."""
    password = _password_of(uri)
    if password:
        for form in {password, quote(password, safe="")}:
            message = message.replace(form, "***")
    return " ".join(message.split())  # libpq's messages span lines ("\n\tIs the server running ...")


@functools.lru_cache(maxsize=256)
def _pg_sql(sql: str) -> str:
    """The shared SQL's `?` placeholders as psycopg's `%s` (no statement here holds a literal `?` or `%`)."""
    return sql.replace("?", "%s")


class _PgConnection:
    """A psycopg connection as the shared SQL expects one (`port.SqlConnection`)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: psycopg.Connection[Any]):
        self._conn = conn

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> SqlCursor:
        return self._conn.execute(_pg_sql(sql), parameters or None)

    def executemany(self, sql: str, parameters: Any, /) -> SqlCursor:
        cursor = self._conn.cursor()
        cursor.executemany(_pg_sql(sql), parameters)
        return cursor


def schema_version(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT to_regclass('fleet_schema') IS NOT NULL").fetchone()
    if row is None or not row[0]:
        return 0
    found = conn.execute("SELECT max(version) FROM fleet_schema").fetchone()
    return int(found[0]) if found is not None and found[0] is not None else 0


def migrate(conn: psycopg.Connection[Any], location: str) -> int:
    """Bring the database to SCHEMA_VERSION under an advisory lock (an autocommit connection); returns the
    version found. A newer version than this code knows: StoreError, nothing written."""
    conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
    try:
        found = schema_version(conn)
        if found > SCHEMA_VERSION:
            raise StoreError(f"{location}: store schema version {found} is newer than this code understands "
                             f"({SCHEMA_VERSION}); upgrade the fleet package")
        if found < SCHEMA_VERSION:
            with conn.transaction():  # DDL is transactional: a step applies whole or not at all
                for statement in statements("postgres", found):
                    conn.execute(statement.encode())
                conn.execute("CREATE TABLE IF NOT EXISTS fleet_schema (version INTEGER NOT NULL, "
                             "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
                conn.execute("INSERT INTO fleet_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
            log.info("%s: store schema upgraded from version %d to %d", location, found, SCHEMA_VERSION)
        return found
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))


class PostgresStore(SqlStore):
    """The controller store in a PostgreSQL database (see the module docstring)."""

    _BEGIN_WRITE = "BEGIN"
    _BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
    _LOCK_ROW = " FOR UPDATE"
    remote = True

    def __init__(self, uri: str, ring_lines: int = 5000, *, now: Callable[[], datetime] | None = None,
                 max_progress_events: int = 1000, max_other_events: int = 1000, redactor: Redactor | None = None,
                 pool_size: int = 4, acquire_timeout_s: float = ACQUIRE_TIMEOUT_S):
        super().__init__(ring_lines, now=now, max_progress_events=max_progress_events,
                         max_other_events=max_other_events, redactor=redactor)
        self.location = redacted_uri(uri)
        self._uri = uri
        connect_kwargs: dict[str, Any] = {"autocommit": True, "application_name": "fleet-controller"}
        if "connect_timeout" not in uri:
            connect_kwargs["connect_timeout"] = CONNECT_TIMEOUT_S
        try:
            with psycopg.connect(uri, **connect_kwargs) as conn:
                migrate(conn, self.location)
        except psycopg.Error as exc:
            raise StoreError(f"{self.location}: cannot open the controller store: "
                             f"{scrubbed(str(exc), uri)}") from None
        self._acquire_timeout_s = acquire_timeout_s
        self._pool = psycopg_pool.ConnectionPool(uri, min_size=1, max_size=max(1, pool_size), kwargs=connect_kwargs,
                                                 open=False, timeout=acquire_timeout_s, name="fleet-store")
        try:
            self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_S * 2)
        except psycopg_pool.PoolTimeout as exc:
            self._pool.close()
            raise StoreError(f"{self.location}: cannot open the controller store: {exc}") from None

    @contextlib.contextmanager
    def _connection(self) -> Iterator[SqlConnection]:
        try:
            conn = self._pool.getconn(timeout=self._acquire_timeout_s)
        except psycopg_pool.PoolTimeout as exc:
            raise StoreUnavailable(f"{self.location}: no database connection within "
                                   f"{self._acquire_timeout_s:g} s ({exc})") from None
        try:
            yield _PgConnection(conn)
        finally:
            self._pool.putconn(conn)  # a broken connection is discarded and replaced by the pool

    def _unavailable(self, exc: BaseException) -> StoreUnavailable | None:
        # OperationalError: connection lost, server shutting down or starting, deadlock or serialization
        # failure (TransactionRollback); InterfaceError: a connection found closed. Both mean "not now".
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | psycopg_pool.PoolTimeout):
            return StoreUnavailable(f"{self.location}: {scrubbed(str(exc), self._uri)}")
        return None

    def _tails(self, conn: SqlConnection, instance_ids: Sequence[str], *, everyone: bool) -> dict[str, list[str]]:
        if len(instance_ids) < 2:
            return super()._tails(conn, instance_ids, everyone=everyone)
        # One statement for all of them (a pass reads every instance, a view a page of them), each tail from the
        # primary key's index, as one array per instance built by the server: a round trip per instance, or a
        # row per line, is what a server database makes expensive.
        tail = ("SELECT i.instance_id, ARRAY(SELECT line FROM (SELECT seq, line FROM log_lines l "
                "WHERE l.instance_id = i.instance_id ORDER BY seq DESC LIMIT ?) t ORDER BY seq) FROM instances i")
        rows = (conn.execute(tail, (REPORT_TAIL_LINES,)) if everyone else
                conn.execute(f"{tail} WHERE i.instance_id = ANY(?)", (REPORT_TAIL_LINES, list(instance_ids))))
        return {instance_id: lines for instance_id, lines in rows.fetchall()}

    def close(self) -> None:
        self._pool.close()

"""`fleet db copy SRC DST`: move an embedded SQLite store into PostgreSQL, when a fleet outgrows one process.

Where it sits: an adapter step between the two store adapters, run once by an operator with the controller
stopped (a live source keeps changing under the copy). What is copied: every table the store holds (instances
with their counters, events, results, log rings, directives), so replicas started on the destination carry on
where the embedded controller stopped: workers keep their tokens, duplicates stay duplicates, rings keep their
sequence numbers.

Idempotent and resumable: every row is inserted with `ON CONFLICT DO NOTHING` on the table's own keys, in chunks
committed one by one, tables in foreign-key order. A copy killed midway leaves whole chunks behind; running it
again inserts only what is missing, and a second complete run inserts nothing. Events are keyed by
(instance, time, fingerprint) rather than by SQLite's row id, and inserted in row-id order, so their order is kept
and a rerun cannot store one twice.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from reconciler.adapters.store.port import StoreError
from reconciler.adapters.store.postgres import PostgresStore, redacted_uri
from reconciler.adapters.store.schema import SCHEMA_VERSION
from reconciler.adapters.store.sqlite import SqliteStore

#: Rows per committed chunk: small enough that a kill loses little work, large enough to amortise a commit.
CHUNK_ROWS = 2_000

_INSTANCE_COLUMNS = ("instance_id", "received_at", "worker_at", "pool", "slot", "machine_id", "host_id",
                     "contract_id", "gpu_name", "image_digest", "image_version", "hostname", "gpus", "registrations",
                     "next_line_seq", "ring_dropped", "worker_dropped", "progress_events", "other_events",
                     "destroyed_at", "log_key_lines")
_EVENT_COLUMNS = ("instance_id", "phase", "status", "at", "received_at", "exit_code", "message", "log_tail",
                  "details", "fingerprint")


@dataclass(frozen=True)
class _Table:
    name: str
    columns: tuple[str, ...]
    #: The source's order (resumable chunks follow it; events keep their order).
    order_by: str


#: In foreign-key order: instances before the rows that reference them.
TABLES = (
    _Table("instances", _INSTANCE_COLUMNS, "instance_id"),
    _Table("events", _EVENT_COLUMNS, "id"),
    _Table("results", ("instance_id", "received_at", "body"), "instance_id"),
    _Table("log_lines", ("instance_id", "seq", "line"), "instance_id, seq"),
    _Table("directives", ("instance_id", "set_at", "body"), "instance_id"),
)


@dataclass(frozen=True)
class TableCopy:
    table: str
    read: int
    inserted: int

    @property
    def already_there(self) -> int:
        return self.read - self.inserted


def _source_rows(conn: sqlite3.Connection, table: _Table) -> Iterator[list[tuple[Any, ...]]]:
    cursor = conn.execute(f"SELECT {', '.join(table.columns)} FROM {table.name} ORDER BY {table.order_by}")  # noqa: S608
    while chunk := cursor.fetchmany(CHUNK_ROWS):
        yield chunk


def copy_store(source: Path, destination: str, *,
               on_chunk: Callable[[str, int, int], None] | None = None) -> list[TableCopy]:
    """Copy the SQLite store at `source` into the PostgreSQL database at `destination` (migrated first); per
    table, rows read and rows inserted. `on_chunk(table, rows read so far, rows in the table)` after each
    committed chunk. StoreError (naming the file or the URI without its password) when either cannot be used."""
    if not source.is_file():
        raise StoreError(f"{source}: no SQLite controller store there")
    SqliteStore(source).close()  # refuses what is not a store (or is newer than this code); upgrades an older one
    PostgresStore(destination).close()  # creates or upgrades the schema, refuses a newer one
    shown = redacted_uri(destination)
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        version = src.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA_VERSION:
            raise StoreError(f"{source}: store schema version {version}, expected {SCHEMA_VERSION}")
        src.execute("BEGIN")  # one snapshot of the source for the whole copy
        try:
            with psycopg.connect(destination, autocommit=False) as dst:
                return [_copy_table(src, dst, table, on_chunk) for table in TABLES]
        except psycopg.Error as exc:
            raise StoreError(f"{shown}: copy failed: {' '.join(str(exc).split())}") from None
    finally:
        src.close()


def _copy_table(src: sqlite3.Connection, dst: psycopg.Connection[Any], table: _Table,
                on_chunk: Callable[[str, int, int], None] | None) -> TableCopy:
    total = src.execute(f"SELECT COUNT(*) FROM {table.name}").fetchone()[0]  # noqa: S608
    insert = (f"INSERT INTO {table.name} ({', '.join(table.columns)}) "  # noqa: S608
              f"VALUES ({', '.join(['%s'] * len(table.columns))}) ON CONFLICT DO NOTHING")
    read = inserted = 0
    for chunk in _source_rows(src, table):
        with dst.cursor() as cursor:
            cursor.executemany(insert, chunk)
            inserted += max(cursor.rowcount, 0)
        dst.commit()
        read += len(chunk)
        if on_chunk is not None:
            on_chunk(table.name, read, total)
    return TableCopy(table.name, read, inserted)

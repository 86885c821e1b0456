"""`fleet db copy SRC DST`: move the embedded SQLite controller store into PostgreSQL (see
`reconciler.adapters.store.copy_to_postgres`). Stop the controller first; run it again after an interruption: it
inserts only what is missing. Exit 0 copied (or nothing left to copy), 1 a store could not be used (the message
names it, the URI without its password), 2 usage."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("db", help="controller store maintenance (copy SQLite into PostgreSQL)")
    actions = p.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    copy = actions.add_parser("copy", help="copy an embedded SQLite store into PostgreSQL (idempotent, resumable)")
    copy.add_argument("source", metavar="SRC", help="the SQLite store file (stop its controller first)")
    copy.add_argument("destination", metavar="DST",
                      help="postgresql://user@host:port/dbname (password from the URI, PGPASSWORD or ~/.pgpass)")
    copy.set_defaults(func=run_copy)


def run_copy(args: argparse.Namespace) -> int:
    from reconciler.adapters.store.port import StoreError
    from reconciler.adapters.stores import StoreTargetError, is_database_uri, shown_target, store_target

    try:
        source, destination = store_target(args.source), store_target(args.destination)
    except StoreTargetError as exc:
        print(f"fleet db copy: {exc}", file=sys.stderr)
        return 2
    if is_database_uri(source) or not isinstance(source, Path):
        print(f"fleet db copy: SRC must be a SQLite store file, got {shown_target(source)}", file=sys.stderr)
        return 2
    if not is_database_uri(destination):
        print(f"fleet db copy: DST must be a postgresql:// URI, got {shown_target(destination)}", file=sys.stderr)
        return 2
    from reconciler.adapters.store.copy_to_postgres import copy_store

    def progress(table: str, done: int, total: int) -> None:
        print(f"  {table}: {done:,} of {total:,} rows", flush=True)

    print(f"copying {shown_target(source)} into {shown_target(destination)}", flush=True)
    try:
        copied = copy_store(source, str(destination), on_chunk=progress)
    except StoreError as exc:
        print(f"fleet db copy: {exc}", file=sys.stderr)
        return 1
    for table in copied:
        print(f"{table.table}: {table.inserted:,} rows copied, {table.already_there:,} already there", flush=True)
    return 0

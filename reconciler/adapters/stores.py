"""Which store adapter a `--db` / `--controller-db` / `fleet db copy` target names: a libpq URI opens the PostgreSQL
store, a file path the SQLite one. The one place that knows both adapters (they share `store/sql.py` and know
nothing of each other); psycopg is imported only when a URI is given, so the embedded default never loads it.

A target is read here once, before anything opens it: a URI in a scheme the CLI does not take
(`postgresql+psycopg://` as SQLAlchemy-based tools write it, a typo such as `postgresq://`, `mysql://`,
`sqlite:///...`) or a libpq `key=value` string is refused in one line naming the scheme and the accepted ones
(it would otherwise be taken for a SQLite file name, and its password printed in "no store there"); a user or
password holding a raw `@`, `/` or a stray `%` is refused too (libpq would split the URI elsewhere, and quote
the pieces in its errors). Every message shows the target through `shown_target`: the password masked.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from reconciler.adapters.store.port import ControllerStore, StoreError
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.domain.redact import MASK, redact_line

#: The URI schemes libpq (so the PostgreSQL store) takes.
ACCEPTED_SCHEMES = ("postgresql", "postgres")
ACCEPTED = "postgresql:// or postgres:// (PostgreSQL) or a SQLite file path"
#: `scheme://...`, or `scheme:user:password@...` without the slashes: anything a reader would take for a URI.
_URI_LIKE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*+):(?://|[^/\\\s]*@)")
#: A libpq connection string (`host=db password=x`): the CLI takes URIs only.
_CONNINFO = re.compile(r"(?i)(?:^|\s)(?:host|hostaddr|port|dbname|user|password|passfile|service|sslmode)\s*=")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


class StoreTargetError(StoreError):
    """A target the CLI does not take; the message names it with its password masked, in one line."""


def shown_target(target: str | Path) -> str:
    """`target` as it may be printed: a URI's password (however it is written: any character, `@` and `/`
    included; also `scheme:user:password@host` without the slashes) and a `password=` option masked, control
    characters escaped."""
    text = str(target)
    uri = _URI_LIKE.match(text)
    if uri is not None and not text.startswith("://", uri.end(1)):
        text = f"{text[:uri.end(1) + 1]}{MASK}{text[text.rfind('@'):]}"
    return redact_line(text)


def store_target(target: str | Path) -> str | Path:
    """The target as the stores take it: a `postgresql://`/`postgres://` URI (str) or a SQLite file (Path).
    StoreTargetError for a URI in another scheme, a libpq key=value string, or a URI whose user or password
    needs percent-encoding."""
    if isinstance(target, Path):
        return target
    shown = shown_target(target)
    if _CONNINFO.search(target):
        raise StoreTargetError(f"{shown}: a libpq key=value connection string; give a URI instead "
                               "(postgresql://user@host:port/dbname) or a SQLite file path")
    uri = _URI_LIKE.match(target)
    if uri is None:
        return Path(target)
    scheme = uri.group(1)
    if scheme not in ACCEPTED_SCHEMES or not target.startswith(f"{scheme}://"):
        raise StoreTargetError(f"{shown}: a {scheme}: URI is not a store this CLI opens; it takes {ACCEPTED}"
                               f"{_hint(scheme)}")
    authority = target[len(scheme) + 3:].split("?", 1)[0]
    at = authority.rfind("@")
    if at >= 0:
        userinfo = authority[:at]
        if "@" in userinfo or "/" in userinfo:
            raise StoreTargetError(f"{shown}: the user or password holds '@' or '/': percent-encode them in the URI "
                                   "(%40, %2F), or give the password in PGPASSWORD or ~/.pgpass")
        if _BAD_PERCENT.search(userinfo):
            raise StoreTargetError(f"{shown}: the user or password holds a '%' that is not a percent-encoding: "
                                   "write it as %25, or give the password in PGPASSWORD or ~/.pgpass")
    return target


def _hint(scheme: str) -> str:
    base = scheme.split("+", 1)[0].lower()
    if base in ACCEPTED_SCHEMES:
        return f" (drop the driver suffix: {base}://)" if "+" in scheme else f" (write the scheme in lower case: {base}://)"
    if base.startswith("sqlite"):
        return " (give the SQLite file's path itself)"
    close = difflib.get_close_matches(base, ACCEPTED_SCHEMES, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}://?)" if close else ""


def is_database_uri(target: str | Path) -> bool:
    """A libpq URI (`postgresql://...`, `postgres://...`) rather than a SQLite file path."""
    return isinstance(target, str) and target.startswith(tuple(f"{s}://" for s in ACCEPTED_SCHEMES))


def open_store(target: str | Path, *, ring_lines: int = 5000, now: Callable[[], datetime] | None = None
               ) -> ControllerStore:
    """The store at `target`: a `postgresql://user@host:port/dbname` URI (PostgreSQL; the password from the URI,
    PGPASSWORD or ~/.pgpass, as libpq reads them) or a file path (SQLite, created if missing). Raises StoreError
    naming the target (never a password) when it cannot be opened, StoreTargetError when it is neither."""
    chosen = store_target(target)
    if isinstance(chosen, str):
        from reconciler.adapters.store.postgres import PostgresStore

        return PostgresStore(chosen, ring_lines=ring_lines, now=now)
    return SqliteStore(chosen, ring_lines=ring_lines, now=now)

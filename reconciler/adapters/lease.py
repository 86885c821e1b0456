"""The leader lease in PostgreSQL: which `fleet reconcile` replica may run passes, commit and push.

One row per lease (`fleet_lease`, name `reconcile`, a table of the store's schema): holder, epoch, since,
expires_at. Taking and renewing it is ONE statement (`INSERT ... ON CONFLICT DO UPDATE ... WHERE` the row is ours or
has expired): the database serialises competing replicas on the row, and its clock (`clock_timestamp()`) is the only
clock that decides expiry, so replicas' clocks may disagree. The epoch grows whenever the lease changes hands or
lapses, even back to the same holder: a pass that started in an older term can never write in a newer one.

Why a row and not an advisory lock: an advisory lock lives as long as its session, so a leader paused by
SIGSTOP (or behind a half-open TCP connection) keeps it until the kernel gives up on the socket, minutes later,
and nothing on the database says since when or in which term. A row with an expiry is released by the clock,
survives reconnects (a leader that reconnects within its lease keeps leading), carries the epoch the commit
step checks, and is what `fleet status` and /healthz read.

`LeaseKeeper` renews the lease on its own thread every `duration / 3` (followers try to take it as often) and
on its own connection, so a busy store never starves a renewal. Locally it trusts its term only until the
instant the renewal *started* plus the duration (never later than the database's expiry); `fence` asks the
database itself, right before the push; `store_fence` asks inside the store transaction that writes the
directives and holds the lease row (FOR SHARE) until it commits, so the lease cannot change hands mid-write.

The embedded store (SQLite, one process) needs none of this: that process is always the leader.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from reconciler.domain import errors
from reconciler.domain.leadership import Leadership, LeaseLost, describe
from reconciler.domain.observations import format_time

log = logging.getLogger(__name__)

LEASE_NAME = "reconcile"
DEFAULT_LEASE_S = 15.0

# Take the lease when it is free (no row, or expired) or renew it when it is ours. The epoch and `since` move
# only when the term changes: another holder, or ours after it lapsed (a pass of the lapsed term must not write).
_TAKE_OR_RENEW = """
INSERT INTO fleet_lease AS l (name, holder, epoch, since, renewed_at, expires_at)
VALUES (%(name)s, %(holder)s, 1, clock_timestamp(), clock_timestamp(),
        clock_timestamp() + make_interval(secs => %(seconds)s))
ON CONFLICT (name) DO UPDATE SET
    epoch = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > clock_timestamp()
                 THEN l.epoch ELSE l.epoch + 1 END,
    since = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > clock_timestamp()
                 THEN l.since ELSE clock_timestamp() END,
    holder = EXCLUDED.holder,
    renewed_at = clock_timestamp(),
    expires_at = clock_timestamp() + make_interval(secs => %(seconds)s)
WHERE l.holder = EXCLUDED.holder OR l.expires_at <= clock_timestamp()
RETURNING holder, epoch, since, expires_at"""

_CURRENT = "SELECT holder, epoch, since, expires_at FROM fleet_lease WHERE name = %(name)s"

# Inside a store transaction (the store's `?` placeholders): the term is still ours, and FOR SHARE keeps any other
# replica's take-over (an UPDATE of this row) waiting until that transaction has committed or rolled back.
_HOLDS_IN_STORE = """SELECT 1 FROM fleet_lease WHERE name = ? AND holder = ? AND epoch = ?
                     AND expires_at > clock_timestamp() FOR SHARE"""

_HOLDS = """SELECT 1 FROM fleet_lease WHERE name = %(name)s AND holder = %(holder)s AND epoch = %(epoch)s
            AND expires_at > clock_timestamp()"""

# A replica that stops cleanly hands the lease over at once instead of making the others wait out its term.
_RELEASE = """UPDATE fleet_lease SET expires_at = clock_timestamp()
              WHERE name = %(name)s AND holder = %(holder)s AND epoch = %(epoch)s RETURNING epoch"""


def replica_name(listen_port: int | None = None) -> str:
    """This process as operators know it: host and listening port (or pid, without --listen)."""
    return f"{socket.gethostname()}:{listen_port if listen_port is not None else os.getpid()}"


def holder_id(name: str) -> str:
    """The lease holder for one process: its name plus a random suffix, so two replicas given the same name
    (or a restart that reuses a pid) never mistake each other's lease for their own."""
    return f"{name}~{secrets.token_hex(3)}"


class LeaseUnavailable(errors.TemporaryError):
    """The lease's database did not answer (down, restarting, unreachable, wrong password): this replica cannot
    confirm a term, so it does not write; it tries again on its next renewal."""

    reason = errors.STORE_FAILED


class PostgresLease:
    """The lease row, on one dedicated connection (autocommit; reconnects after any failure)."""

    def __init__(self, uri: str, *, name: str = LEASE_NAME, timeout_s: float = 5.0) -> None:
        from reconciler.adapters.store.postgres import redacted_uri  # psycopg only where PostgreSQL is used

        self.uri, self.name, self.timeout_s = uri, name, timeout_s
        self.location = redacted_uri(uri)  # for messages: never the password
        self._conn: Any = None
        self._lock = threading.Lock()  # one connection, used by the keeper's thread and the pass's fence

    def _connection(self) -> Any:
        import psycopg

        if self._conn is not None and not self._conn.closed:
            return self._conn
        timeout_ms = max(100, int(self.timeout_s * 1000))
        # The `fleet_lease` table is part of the store's schema (store.schema): whoever holds a lease
        # opened the store first, which migrates it under the store's own lock.
        self._conn = psycopg.connect(self.uri, autocommit=True, connect_timeout=max(1, round(self.timeout_s)),
                                     application_name="fleet-lease",
                                     options=f"-c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms}")
        return self._conn

    def _run(self, sql: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
        """One statement; LeaseUnavailable (naming the URI, never the password) on any database failure."""
        import psycopg

        from reconciler.adapters.store.postgres import scrubbed

        with self._lock:
            try:
                row = self._connection().execute(sql, params).fetchone()
            except psycopg.Error as exc:
                self._drop()
                raise LeaseUnavailable(f"{self.location}: {scrubbed(str(exc), self.uri)}") from None
        return tuple(row) if row is not None else None

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # a broken connection may fail to close; dropped either way
                conn.close()

    def take_or_renew(self, holder: str, duration_s: float) -> Leadership | None:
        """Take the lease if free, renew it if ours: the lease as it now stands (ours or another's)."""
        row = self._run(_TAKE_OR_RENEW, {"name": self.name, "holder": holder, "seconds": duration_s})
        return _leadership(row) if row is not None else self.current()

    def current(self) -> Leadership | None:
        row = self._run(_CURRENT, {"name": self.name})
        return _leadership(row) if row is not None else None

    def holds(self, holder: str, epoch: int) -> bool:
        """Whether `holder` still holds the lease in term `epoch`, by the database's clock."""
        return self._run(_HOLDS, {"name": self.name, "holder": holder, "epoch": epoch}) is not None

    def release(self, holder: str, epoch: int) -> bool:
        """End `holder`'s term `epoch` now; False if it was not (or no longer) theirs."""
        return self._run(_RELEASE, {"name": self.name, "holder": holder, "epoch": epoch}) is not None

    def close(self) -> None:
        with self._lock:
            self._drop()


def _leadership(row: tuple[Any, ...]) -> Leadership:
    holder, epoch, since, expires_at = row
    return Leadership(holder=str(holder), epoch=int(epoch), since=since, expires_at=expires_at)


class LeaseKeeper:
    """Keeps (or waits for) the lease on a thread; tells the loop this replica's term, and fences its writes.

    `tick()` is one attempt (tests call it directly); `start()` runs it every `poll_s`. `on_gain` is called on
    the keeper's thread when this replica becomes leader (the loop uses it to start a pass at once)."""

    def __init__(self, lease: PostgresLease, holder: str, duration_s: float = DEFAULT_LEASE_S, *,
                 poll_s: float | None = None, monotonic: Callable[[], float] = time.monotonic,
                 on_gain: Callable[[], None] | None = None) -> None:
        if duration_s <= 0:
            raise ValueError(f"lease duration must be > 0 seconds, got {duration_s:g}")
        self.lease, self.holder, self.duration_s = lease, holder, duration_s
        self.poll_s = poll_s if poll_s is not None else duration_s / 3
        self._monotonic = monotonic
        self._on_gain = on_gain
        self._state = threading.Lock()
        self._leader: Leadership | None = None  # as last read
        self._term: tuple[int, float] | None = None  # (epoch, local monotonic deadline) while we lead
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- what the loop and the surfaces read ---

    def term(self) -> int | None:
        """The epoch this replica leads in, or None (follower, or our term ran out locally)."""
        with self._state:
            if self._term is None:
                return None
            epoch, deadline = self._term
            return epoch if self._monotonic() < deadline else None

    def leader(self) -> Leadership | None:
        """The lease as last read (whoever holds it)."""
        with self._state:
            return self._leader

    def fence(self, epoch: int) -> None:
        """Right before a write of the term `epoch`: LeaseLost unless the DATABASE says we still hold it."""
        try:
            held = self.lease.holds(self.holder, epoch)
        except Exception as exc:
            raise LeaseLost(f"cannot confirm the lease (epoch {epoch}) with the database: "
                            f"{type(exc).__name__}: {exc}; not writing") from None
        if not held:
            try:
                current = self.lease.current()
            except Exception:  # only for the message
                current = None
            who = f"; {current.holder} holds epoch {current.epoch}" if current and current.holder != self.holder else ""
            raise LeaseLost(f"lease epoch {epoch} is no longer held by {self.holder}{who}; not writing")

    def store_fence(self, epoch: int) -> Callable[[Any], None]:
        """The same check as `fence`, to run inside a store transaction (`set_directives(..., fence=...)`):
        the write commits only in term `epoch`, and no other replica takes the lease until it has."""
        def check(conn: Any) -> None:
            if conn.execute(_HOLDS_IN_STORE, (self.lease.name, self.holder, epoch)).fetchone() is None:
                raise LeaseLost(f"lease epoch {epoch} is no longer held by {self.holder}; not writing")

        return check

    # --- keeping it ---

    def tick(self) -> int | None:
        """One take-or-renew; returns our epoch, or None if another replica leads or the database is away."""
        started = self._monotonic()
        try:
            leader = self.lease.take_or_renew(self.holder, self.duration_s)
        except Exception as exc:
            with self._state:
                self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("lease: cannot reach the database (%s); leading only until the current term ends",
                        self.last_error)
            return self.term()
        gained = False
        with self._state:
            self.last_error = None
            self._leader = leader
            if leader is not None and leader.holder == self.holder:
                gained = self._term is None or self._term[0] != leader.epoch
                # The database's expiry is at least `duration` after `started`: trusting the term until then
                # is never longer than the database does.
                self._term = (leader.epoch, started + self.duration_s)
            else:
                self._term = None
        if gained and self._on_gain is not None:
            self._on_gain()
        return self.term()

    def start(self) -> None:
        self.tick()
        self._thread = threading.Thread(target=self._loop, name="fleet-lease", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.tick()

    def stop(self, *, release: bool = True) -> None:
        """Stop renewing; with `release`, hand the lease over at once (a clean shutdown or redeploy)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.lease.timeout_s + self.poll_s + 1)
        epoch = self.term()
        with self._state:
            self._term = None
        if release and epoch is not None:
            try:
                self.lease.release(self.holder, epoch)
            except Exception as exc:  # the lease then simply expires
                log.warning("lease: could not release epoch %s: %s", epoch, exc)
        self.lease.close()

    def status(self, now: datetime) -> dict[str, object]:
        """For /healthz and the page: this replica, the leader and since when."""
        leader = self.leader()
        doc: dict[str, object] = {"replica": self.holder, "leading": self.term() is not None,
                                  "summary": describe(leader, self.holder, now), "at": format_time(now),
                                  "leader": leader.to_json(self.holder, now) if leader else None}
        if self.last_error:
            doc["error"] = self.last_error
        return doc

"""Controller store: what workers reported, in SQLite, safe across crashes and restarts.

Written by the controller HTTP API (`reconciler/controller.py`) after it has authenticated and validated a
request; read by the reconcile loop and `fleet status` as `reconciler.observations.InstanceReport`s.
Every write is one transaction: a request the controller answered 2xx is in the database, a rejected one
left nothing behind. Log lines live in a bounded ring per instance (last `ring_lines`, older ones counted
as dropped), and every free-text field is redacted (`reconciler.redact`) before it is written, so nothing
secret is ever stored, served or committed as evidence.

Clocks: `registered_at` in a report is the controller's clock at first registration (the loop compares
it with its own `now` for deadlines; a worker's clock may be wrong); the worker's own `at` of every
registration, event and result is kept as sent.

Replay and retry semantics (v1 has no nonces): registration is idempotent; an event identical to one
already stored is a no-op (a worker retrying after a lost response must not duplicate it), also inside
an event batch, which is stored all or nothing (`add_events`); the result is
accepted once, an identical resend is a no-op and a different one is a conflict; log batches are appended
as sent (at-least-once: a retried batch can appear twice, which is harmless in a log tail). Once an
instance is marked destroyed its token no longer writes anything, so a captured token cannot be replayed
into a finished record, while its logs stay readable.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from reconciler.adapters.settings import known_secret_values
from reconciler.domain import errors
from reconciler.domain.observations import BenchmarkResult, InstanceReport, PhaseEvent, ProofResult, parse_time
from reconciler.domain.redact import Redactor

SCHEMA_VERSION = 3
#: Lines of the ring buffer copied into InstanceReport.log_tail (evidence for verdicts).
REPORT_TAIL_LINES = 50

_T = TypeVar("_T")

log = logging.getLogger(__name__)

#: How long a writer waits for another process's write transaction (then: "database is locked", temporary).
WRITE_LOCK_TIMEOUT_S = 10.0
#: Background checkpoints (ControllerStore.checkpoint_in_background): how often the helper thread copies the
#: WAL into the database file, and the WAL size (pages) at which a writer still checkpoints itself should the
#: helper fall behind (SQLite's default is 1,000 pages at every commit that crosses it).
CHECKPOINT_INTERVAL_S = 0.25
CHECKPOINT_BACKSTOP_PAGES = 50_000

_SCHEMA_V1 = """
CREATE TABLE instances (
    instance_id     TEXT PRIMARY KEY,
    received_at     TEXT NOT NULL,
    worker_at       TEXT NOT NULL,
    pool            TEXT,
    slot            TEXT,
    machine_id      TEXT,
    host_id         TEXT,
    contract_id     TEXT,
    gpu_name        TEXT,
    image_digest    TEXT,
    image_version   TEXT,
    hostname        TEXT,
    gpus            TEXT NOT NULL DEFAULT '[]',
    registrations   INTEGER NOT NULL DEFAULT 1,
    next_line_seq   INTEGER NOT NULL DEFAULT 0,
    ring_dropped    INTEGER NOT NULL DEFAULT 0,
    worker_dropped  INTEGER NOT NULL DEFAULT 0,
    progress_events INTEGER NOT NULL DEFAULT 0,
    other_events    INTEGER NOT NULL DEFAULT 0,
    destroyed_at    TEXT
);
CREATE TABLE events (
    id          INTEGER PRIMARY KEY,
    instance_id TEXT NOT NULL REFERENCES instances(instance_id),
    phase       TEXT NOT NULL,
    status      TEXT NOT NULL,
    at          TEXT NOT NULL,
    received_at TEXT NOT NULL,
    exit_code   INTEGER,
    message     TEXT,
    log_tail    TEXT NOT NULL,
    details     TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    UNIQUE (instance_id, fingerprint)
);
CREATE INDEX events_by_status ON events (instance_id, status, id);
CREATE TABLE results (
    instance_id TEXT PRIMARY KEY REFERENCES instances(instance_id),
    received_at TEXT NOT NULL,
    body        TEXT NOT NULL
);
CREATE TABLE log_lines (
    instance_id TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    line        TEXT NOT NULL,
    PRIMARY KEY (instance_id, seq)
) WITHOUT ROWID;
"""

#: Version 2: what the reconciler decided per instance, for workers to read (GET .../directive).
_SCHEMA_V2 = """
CREATE TABLE IF NOT EXISTS directives (
    instance_id TEXT PRIMARY KEY,
    set_at      TEXT NOT NULL,
    body        TEXT NOT NULL
);
"""

#: Version 3: an event's identity is keyed (instance, time, fingerprint) instead of (instance, fingerprint).
#: The same events are distinct (the time is part of what the fingerprint covers, so it adds no new
#: distinction), but a worker's events arrive in time order, so new keys land next to each other in the
#: index: a batch of 20 events dirties one or two index pages instead of up to 20 random ones, and every
#: COMMIT writes those pages to the WAL. The table is rebuilt (SQLite cannot change a table constraint).
_SCHEMA_V3 = """
CREATE TABLE events_v3 (
    id          INTEGER PRIMARY KEY,
    instance_id TEXT NOT NULL REFERENCES instances(instance_id),
    phase       TEXT NOT NULL,
    status      TEXT NOT NULL,
    at          TEXT NOT NULL,
    received_at TEXT NOT NULL,
    exit_code   INTEGER,
    message     TEXT,
    log_tail    TEXT NOT NULL,
    details     TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    UNIQUE (instance_id, at, fingerprint)
);
INSERT INTO events_v3 (id, instance_id, phase, status, at, received_at, exit_code, message, log_tail, details,
                       fingerprint)
    SELECT id, instance_id, phase, status, at, received_at, exit_code, message, log_tail, details, fingerprint
    FROM events ORDER BY id;
DROP TABLE events;
ALTER TABLE events_v3 RENAME TO events;
CREATE INDEX events_by_status ON events (instance_id, status, id);
"""


class StoreError(errors.PermanentError):
    """Base of everything the store refuses; the message names the instance and the reason."""

    reason = errors.STORE_FAILED


class UnknownInstance(StoreError):
    """A report for an instance that never registered."""


class InstanceDestroyed(StoreError):
    """A write for an instance already marked destroyed."""


class ResultConflict(StoreError):
    """A second, different benchmark result for the same instance."""


class EventLimitExceeded(StoreError):
    """The instance sent more non-progress events than any sane worker would."""


@dataclass(frozen=True)
class InstanceMeta:
    """What the read API shows beyond an InstanceReport: worker clock, counters, arrival times."""

    worker_registered_at: datetime
    registrations: int
    hostname: str | None
    gpus: tuple[str, ...]
    stored_log_lines: int
    ring_dropped: int
    worker_dropped: int
    event_received_at: tuple[datetime, ...]
    result_received_at: datetime | None


@dataclass(frozen=True)
class LogView:
    instance_id: str
    lines: tuple[str, ...]
    dropped: int
    destroyed_at: datetime | None


#: One encoder for every canonical dump: json.dumps with options builds a new JSONEncoder per call.
_canonical_encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
#: Its C core, built once (JSONEncoder.encode builds it on every call: a third of an event's encoding cost
#: on the ingest path). No circular-reference markers: everything encoded here was decoded from JSON or
#: built from it, and a shared markers dict would not be thread-safe. Same output as `_canonical_encoder`.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_c_encoder = None if _c_make_encoder is None else _c_make_encoder(
    None, _canonical_encoder.default, json.encoder.encode_basestring, None, ":", ",", True, False, True)


def _canonical(doc: Any) -> str:
    if _c_encoder is None:
        return _canonical_encoder.encode(doc)
    return "".join(_c_encoder(doc, 0))


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat()


#: `2026-12-02T18:00:00Z`, what workers send (`date -u +%Y-%m-%dT%H:%M:%SZ`).
_WHOLE_SECONDS_UTC = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")


def _iso_of(text: str) -> str:
    """`_iso(parse_time(text))` for a time the protocol validated; whole seconds in UTC (the usual case)
    become `...+00:00` without building a datetime (an event batch has one per event)."""
    if _WHOLE_SECONDS_UTC.fullmatch(text):
        return text[:-1] + "+00:00"
    return _iso(parse_time(text))


def _dt(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _redacted_event(doc: Mapping[str, Any], redactor: Redactor) -> dict[str, Any]:
    out = dict(doc)
    if out.get("message") is not None:
        out["message"] = redactor.line(out["message"])
    out["log_tail"] = redactor.lines(out.get("log_tail", []))
    out["details"] = redactor.value(out.get("details", {}))
    return out


def _redacted_result(doc: Mapping[str, Any], redactor: Redactor) -> dict[str, Any]:
    out = dict(doc)
    out["log_tail"] = redactor.lines(out.get("log_tail", []))
    if out.get("daemon_log_tail"):
        out["daemon_log_tail"] = redactor.lines(out["daemon_log_tail"])
    if out.get("proofs"):
        out["proofs"] = [{**p, "reason": redactor.line(p["reason"])} if isinstance(p, Mapping) and p.get("reason")
                         else p for p in out["proofs"]]
    if isinstance(out.get("warmup"), dict) and out["warmup"].get("reason"):
        out["warmup"] = {**out["warmup"], "reason": redactor.line(out["warmup"]["reason"])}
    return out


def _result_from_doc(doc: Mapping[str, Any]) -> BenchmarkResult:
    started = doc.get("started_at")
    return BenchmarkResult(
        outcome=doc["outcome"], at=parse_time(doc["at"]), requested=doc["requested"], completed=doc["completed"],
        failed=doc["failed"], started_at=None if started is None else parse_time(started),
        exit_code=doc.get("exit_code"), proofs_per_hour=doc.get("proofs_per_hour"),
        seconds_per_proof=doc.get("seconds_per_proof"), proof_type=doc.get("proof_type"),
        concurrency=doc.get("concurrency"), image_digest=doc.get("image_digest"),
        log_tail=tuple(doc.get("log_tail", ())),
        # Protocol additions (issue 13; optional): per-proof results and the daemon's filtered log.
        proofs=tuple(ProofResult(p["index"], p["label"], p.get("seconds"), p.get("reason"))
                     for p in doc.get("proofs") or () if isinstance(p, Mapping)),
        daemon_log=tuple(doc.get("daemon_log_tail") or ()))


_INSERT_EVENT = ("INSERT INTO events (instance_id, phase, status, at, received_at, exit_code, message, log_tail, "
                 "details, fingerprint) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                 "ON CONFLICT (instance_id, at, fingerprint) DO NOTHING")


@dataclass(frozen=True)
class _StoredEvent:
    """An event as written: redacted, its identity (fingerprint of the redacted document) and its row."""

    progress: bool
    fingerprint: str
    #: The event's time as stored (`at` column; part of its key, see _SCHEMA_V3).
    at: str
    #: phase, status, at, received_at, exit_code, message, log_tail, details, fingerprint
    row: tuple[Any, ...]

    @classmethod
    def of(cls, doc: Mapping[str, Any], received_at: str, redactor: Redactor) -> _StoredEvent:
        event = _redacted_event(doc, redactor)
        fingerprint = hashlib.sha256(_canonical(event).encode("utf-8")).hexdigest()
        at = _iso_of(event["at"])
        return cls(event["status"] == "progress", fingerprint, at,
                   (event["phase"], event["status"], at, received_at,
                    event.get("exit_code"), event.get("message"),
                    _canonical(event["log_tail"]) if event["log_tail"] else "[]",
                    _canonical(event["details"]), fingerprint))


_REGISTER_FIELDS = ("pool", "slot", "machine_id", "host_id", "contract_id", "gpu_name", "image_digest",
                    "image_version", "hostname")


@dataclass(frozen=True)
class PreparedWrite(Generic[_T]):
    """A write whose CPU work (redaction, encoding, fingerprints) is done and whose statements are not run
    yet: `ControllerStore.write` runs them. A caller that stores many reports at once (the HTTP edge's
    group commit) prepares them all first, so the write transaction, and with it the write lock that
    other controller processes wait for, is held only for the statements."""

    body: Callable[[sqlite3.Connection], _T]


class WriteLock:
    """Exclusive lock (flock on `<store>.write-lock`) held by a connection for the whole of each write
    transaction, so several controller processes writing one store take turns without SQLite's busy
    handler, which sleeps 1 ms or more per retry (an event loop stalls for that long on every collision).
    A waiter retries after 20 us, doubling up to 1 ms, until `timeout_s`, then raises the "database is
    locked" OperationalError SQLite itself would (a temporary failure: the API answers 503). Writers that
    do not take it (older code) are still serialised by SQLite (busy_timeout).

    An event loop must not sleep on the lock, and retrying on a timer is slow: uvloop rounds every delay to
    whole milliseconds (below 0.5 ms: at once, a busy loop; above: ~1.1 ms added to every report of the
    flush). `wait_in_background(on_free)` has a helper thread block in flock on a second descriptor of the
    lock file, so the kernel wakes it the moment the other process lets go; it then holds the lock for this
    process and calls `on_free()` (from that thread). The next `try_acquire`/`acquire` takes the lock over
    from it (`adopted`): the lock never passes through a free state another process could grab first."""

    def __init__(self, path: Path, timeout_s: float = WRITE_LOCK_TIMEOUT_S, *,
                 sleep: Callable[[float], None] = time.sleep, monotonic: Callable[[], float] = time.monotonic):
        self.path = path
        self.timeout_s = timeout_s
        self._sleep, self._monotonic = sleep, monotonic
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        #: The descriptor whose flock this process holds while `held` (`_fd`, or the helper's after adoption).
        self._held_fd = self._fd
        self.held = False
        self.waits = 0
        #: Locks the helper thread obtained and a writer took over (`wait_in_background`).
        self.adopted = 0
        self._state = threading.Lock()  # guards the fields the helper thread shares with writers below
        self._wanted = threading.Event()
        self._on_free: Callable[[], None] | None = None  # a background wait is under way (or granted)
        self._granted_fd: int | None = None  # the helper holds the lock on this descriptor for us
        self._helper: threading.Thread | None = None
        self._closed = False

    def _try_once(self) -> bool:
        """One attempt without waiting: take over a lock the helper obtained, else flock(LOCK_NB)."""
        if self._granted_fd is not None:
            with self._state:
                fd, self._granted_fd, self._on_free = self._granted_fd, None, None
            if fd is not None:
                self._held_fd, self.held = fd, True
                self.adopted += 1
                return True
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self._held_fd, self.held = self._fd, True
        return True

    def granted(self) -> bool:
        """The helper holds the lock for this process and no writer took it over yet."""
        return self._granted_fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if no other process holds it; never waits."""
        if self.held or self._try_once():
            return True
        self.waits += 1
        return False

    def acquire(self) -> None:
        if self.held or self._try_once():
            return
        self.waits += 1
        deadline = self._monotonic() + self.timeout_s
        delay = 20e-6
        while True:
            self._sleep(delay)
            if self._try_once():
                return
            if self._monotonic() >= deadline:
                raise sqlite3.OperationalError(f"database is locked: another process held {self.path} for "
                                               f"{self.timeout_s:g} s")
            delay = min(delay * 2, 1e-3)

    def release(self) -> None:
        if self.held:
            self.held = False
            fcntl.flock(self._held_fd, fcntl.LOCK_UN)
            self._held_fd = self._fd

    def wait_in_background(self, on_free: Callable[[], None]) -> None:
        """Have the helper thread wait for the lock and call `on_free()` once it holds it for this process
        (the next try_acquire takes it over). A wait already under way or granted: `on_free` replaces its
        callback (called once either way)."""
        call_now = False
        with self._state:
            if self._closed:
                return
            if self._granted_fd is not None:
                call_now = True  # granted meanwhile and not yet taken over: tell the new caller at once
            else:
                waiting = self._on_free is not None
                self._on_free = on_free
                if waiting:
                    return
                if self._helper is None:
                    self._helper = threading.Thread(target=self._helper_main, name="store-write-lock",
                                                    daemon=True)
                    self._helper.start()
                self._wanted.set()
        if call_now:
            on_free()

    def _helper_main(self) -> None:
        # The helper's own descriptor: flock excludes it from `_fd` as it excludes another process, so a
        # writer of this process and the helper never both believe they hold the lock.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            while True:
                self._wanted.wait()
                self._wanted.clear()
                with self._state:
                    if self._closed:
                        return
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)  # the kernel wakes this thread when the lock is free
                except OSError:
                    # Never leave a writer waiting for a wake-up that cannot come: it retries (and a new wait
                    # starts a new helper).
                    log.exception("%s: waiting for the write lock failed", self.path)
                    with self._state:
                        callback, self._on_free, self._helper = self._on_free, None, None
                    if callback is not None:
                        callback()
                    return
                with self._state:
                    callback = self._on_free
                    if self._closed or callback is None:
                        fcntl.flock(fd, fcntl.LOCK_UN)
                        if self._closed:
                            return
                        continue
                    self._granted_fd = fd
                try:
                    callback()
                except Exception:
                    log.exception("write lock: the waiter's callback failed")
                # Wait until the lock was taken over and released before waiting again on this descriptor.
        finally:
            os.close(fd)  # (releases the lock if it is still held here)

    def close(self) -> None:
        self.release()
        with self._state:
            self._closed = True
            granted, self._granted_fd = self._granted_fd, None
        self._wanted.set()
        if granted is not None:
            fcntl.flock(granted, fcntl.LOCK_UN)
        os.close(self._fd)


class _PendingWrite:
    """One queued write of a group commit (see ControllerStore._transaction)."""

    __slots__ = ("body", "done", "error", "result")

    def __init__(self, body: Callable[[sqlite3.Connection], Any]):
        self.body = body
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


class ControllerStore:
    """SQLite (WAL) store of worker reports. Thread-safe: one connection behind a lock.

    One connection and a lock rather than a connection per thread: SQLite serialises writers anyway,
    every statement here is short, and a single connection cannot deadlock with itself on upgrade from
    read to write locks. Other processes (`fleet status`) may open the same file concurrently (WAL).
    """

    def __init__(self, path: str | Path, ring_lines: int = 5000, *, now: Callable[[], datetime] | None = None,
                 max_progress_events: int = 1000, max_other_events: int = 1000, redactor: Redactor | None = None):
        if ring_lines < 1:
            raise ValueError(f"ring_lines must be >= 1, got {ring_lines}")
        self.path = Path(path)
        self.ring_lines = ring_lines
        self.max_progress_events = max_progress_events
        self.max_other_events = max_other_events
        #: Applied to everything a worker sends before it is stored: the patterns plus the secrets this
        #: deployment knows by value (settings: vast.ai key, registry password, controller tokens).
        self.redactor = redactor or Redactor.with_secrets(known_secret_values())
        #: The store's clock (received_at); the controller uses it for admin actions too.
        self.clock: Callable[[], datetime] = now or (lambda: datetime.now(UTC))
        self._lock = threading.Lock()  # guards the connection
        self._queue_lock = threading.Lock()  # guards the group-commit queue
        self._queue: list[_PendingWrite] = []
        self._group_thread: int | None = None
        self._checkpointer: threading.Thread | None = None
        self._checkpoint_stop = threading.Event()
        #: Checkpoints run by `checkpoint` (the background thread's included); set after each one.
        self.checkpoints = 0
        self.checkpointed = threading.Event()
        try:
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open the controller store: {exc}") from None
        self._write_lock: WriteLock | None = None
        try:
            self._write_lock = WriteLock(Path(f"{self.path}.write-lock"))
        except OSError as exc:  # e.g. a read-only directory: SQLite's own locking still serialises writers
            log.warning("%s: no write lock file (%s); concurrent writers rely on SQLite's busy timeout",
                        self.path, exc)
        try:
            self._configure()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            if self._write_lock is not None:
                self._write_lock.close()
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
        self._begin_write()
        try:
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            if version < SCHEMA_VERSION:
                # Each step is additive: a store written by older code keeps all its data.
                for schema in (_SCHEMA_V1, _SCHEMA_V2, _SCHEMA_V3)[version:]:
                    for statement in schema.split(";"):
                        if statement.strip():
                            self._conn.execute(statement)
                self._conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif version > SCHEMA_VERSION:
                raise StoreError(f"{self.path}: store schema version {version} is newer than this code "
                                 f"understands ({SCHEMA_VERSION}); upgrade the fleet package")
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        finally:
            self._end_write()

    def checkpoint_in_background(self, interval_s: float = CHECKPOINT_INTERVAL_S) -> None:
        """Checkpoint the WAL from a helper thread with its own connection, every `interval_s`, instead of in
        whichever write crosses SQLite's 1,000-page mark. That checkpoint (copy the WAL's pages into the
        database file, fsync both) ran inside a request's COMMIT: the event loop stalled for it, holding the
        write lock every other controller process waited for (in-process, 4 single events per COMMIT: one
        checkpoint per ~265 events, 4.7 ms each, i.e. ~7% of the time at 4,000 events/s). Each round
        (`checkpoint_round`) does the bulk beside the writers (PASSIVE: blocks no writer or reader; in-process
        at ~6,000 events/s, 18-32 ms every 0.25 s, mostly the fsync of the WAL written meanwhile) and the rest
        holding the write lock (2-4 ms), so the WAL starts over each round (~20-45 MB on disk at 6,000-10,000
        events/s). Durability is unchanged (commits are in the WAL, synchronous=NORMAL). Writers keep a
        backstop (`CHECKPOINT_BACKSTOP_PAGES`) should the helper fall behind. Stopped by `close`. For a
        serving controller; short-lived commands need none."""
        with self._lock:
            if self._checkpointer is not None:
                return
            self._conn.execute(f"PRAGMA wal_autocheckpoint={CHECKPOINT_BACKSTOP_PAGES}")
            self._checkpoint_stop.clear()
            self._checkpointer = threading.Thread(target=self._checkpoint_loop, args=(interval_s,),
                                                  name="store-checkpoint", daemon=True)
            self._checkpointer.start()

    def _checkpoint_loop(self, interval_s: float) -> None:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=0)
            conn.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            log.error("%s: no background checkpoints (%s); writers checkpoint at %d pages", self.path, exc,
                      CHECKPOINT_BACKSTOP_PAGES)
            return
        # Each round: one PASSIVE checkpoint while writers go on (the bulk: fsync the WAL written since the
        # last round, copy its pages, fsync the database), then one holding the write lock for what was
        # appended meanwhile. A checkpoint that writers keep appending to never copies the whole WAL, so
        # SQLite never starts it over and it grows to the backstop (200 MB in a test); the second one
        # finishes it, and the next write starts the WAL from its beginning again. Its own descriptor:
        # writers of this process wait for it like other processes' writers do (their event loops keep
        # serving); a blocking flock, so the kernel queues this thread rather than letting it lose every
        # race against writers that take the lock again at once.
        fd = None
        if self._write_lock is not None:
            with contextlib.suppress(OSError):
                fd = os.open(self._write_lock.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            while not self._checkpoint_stop.wait(interval_s):
                self.checkpoint_round(conn, fd)
        except OSError as exc:
            log.error("%s: background checkpoints stopped (%s); writers checkpoint at %d pages", self.path, exc,
                      CHECKPOINT_BACKSTOP_PAGES)
        finally:
            conn.close()
            if fd is not None:
                os.close(fd)

    def checkpoint_round(self, conn: sqlite3.Connection | None = None, lock_fd: int | None = None) -> None:
        """One round of the background thread (see `_checkpoint_loop`): a checkpoint beside writers, then one
        holding the write lock on `lock_fd` (a descriptor of the lock file of its own), so the WAL starts over."""
        self.checkpoint(conn)
        if lock_fd is not None:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            self.checkpoint(conn)
        finally:
            if lock_fd is not None:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)

    def checkpoint(self, conn: sqlite3.Connection | None = None) -> tuple[int, int] | None:
        """One PASSIVE checkpoint: (WAL frames, frames now in the database file), None if it failed (logged;
        the next one retries). `conn`: the background thread's own connection (default: the store's)."""
        try:
            if conn is None:
                with self._lock:
                    row = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            else:
                row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:
            log.warning("%s: checkpoint failed (%s); retrying at the next one", self.path, exc)
            return None
        self.checkpoints += 1
        self.checkpointed.set()
        return int(row[1]), int(row[2])

    def close(self) -> None:
        checkpointer, self._checkpointer = self._checkpointer, None
        if checkpointer is not None:
            self._checkpoint_stop.set()
            # (It may wait for another process's write transaction: a daemon thread, not waited for long.)
            checkpointer.join(timeout=5)
        with self._lock:
            self._conn.close()
            if self._write_lock is not None:
                self._write_lock.close()

    def _begin_write(self) -> None:
        """BEGIN IMMEDIATE under the store's write lock (see WriteLock); `_end_write` after COMMIT/ROLLBACK."""
        if self._write_lock is not None:
            self._write_lock.acquire()
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._end_write()
            raise

    def _end_write(self) -> None:
        if self._write_lock is not None:
            self._write_lock.release()

    # --- writes ------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """Writes made by this thread inside the block share one transaction, committed when it ends.

        For a single-threaded caller that answers many requests at once (the asyncio HTTP edge): each write
        still runs alone (a savepoint: one that fails leaves the others intact) and its result is returned
        at once, but nothing is durable until the block exits, so the caller must answer only after that.
        If the final COMMIT fails the block raises and none of the writes happened.
        """
        with self._lock:
            self._group_thread = threading.get_ident()
            try:
                yield
                if self._conn.in_transaction:
                    self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            finally:
                self._group_thread = None
                self._end_write()

    def _in_group(self) -> bool:
        return self._group_thread is not None and self._group_thread == threading.get_ident()

    def _grouped_write(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        conn = self._conn
        if not conn.in_transaction:
            self._begin_write()
        conn.execute("SAVEPOINT grouped_write")
        try:
            result = body(conn)
        except BaseException:
            conn.execute("ROLLBACK TO grouped_write")
            conn.execute("RELEASE grouped_write")
            raise
        conn.execute("RELEASE grouped_write")
        return result

    def _transaction(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run `body` in a committed transaction; return only once it is committed (or, inside `group`,
        once it ran: the group commits).

        Group commit: a write queues itself, and whichever thread gets the connection runs every queued
        write in one transaction and commits once for all. Under concurrent workers this turns N commits
        (each a WAL append) into one; alone, a write is still its own transaction. A write's caller is
        answered only after the COMMIT that contains it.
        """
        if self._in_group():
            return self._grouped_write(body)
        pending = _PendingWrite(body)
        with self._queue_lock:
            self._queue.append(pending)
        with self._lock:
            if not pending.done:
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                self._commit_batch(batch)
        if pending.error is not None:
            raise pending.error
        return pending.result

    def _commit_batch(self, batch: list[_PendingWrite]) -> None:
        """One transaction for the whole batch. Write bodies refuse (raise StoreError) only before they
        modify anything, so a refusal needs no savepoint. Any other failure rolls the batch back; the write
        that broke fails alone and the others run again without it."""
        conn = self._conn
        current: _PendingWrite | None = None
        try:
            self._begin_write()
            for item in batch:
                current = item
                try:
                    item.result = item.body(conn)
                except StoreError as exc:
                    item.error = exc
            current = None
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._end_write()
            if current is not None and len(batch) > 1 and isinstance(exc, Exception):
                others = [item for item in batch if item is not current]
                for item in others:
                    item.result, item.error = None, None
                self._commit_batch(others)
                current.result, current.error = None, exc
                return
            for item in batch:
                item.result, item.error = None, exc
            if not isinstance(exc, Exception):
                raise
        finally:
            self._end_write()
            for item in batch:
                item.done = True

    @staticmethod
    def _writable(conn: sqlite3.Connection, instance_id: str) -> tuple[Any, ...]:
        row = conn.execute("SELECT destroyed_at, progress_events, other_events, next_line_seq FROM instances "
                           "WHERE instance_id = ?", (instance_id,)).fetchone()
        if row is None:
            raise UnknownInstance(f"instance {instance_id!r} never registered")
        if row[0] is not None:
            raise InstanceDestroyed(f"instance {instance_id!r} was destroyed at {row[0]}; "
                                    "it accepts no more reports")
        return row

    def write(self, prepared: PreparedWrite[_T]) -> _T:
        """Run a write made by one of the `prepare_*` methods, in a committed transaction (see _transaction)."""
        return self._transaction(prepared.body)

    def write_all(self, prepared: Sequence[PreparedWrite[Any]], *, wait: bool = True,
                  on_free: Callable[[], None] | None = None) -> list[tuple[BaseException | None, Any]] | None:
        """Run many prepared writes in one transaction (with any other thread's queued writes) and return,
        per write, (error, result) once committed. Each write succeeds or fails alone, as by `write`: a
        refusal (StoreError) leaves the others intact, any other failure is retried without the write that
        caused it (see _commit_batch); an error of the COMMIT itself is every write's error.

        `wait=False`: None at once, nothing run, when another process holds the write lock (an event loop
        serves other requests meanwhile instead of blocking on the lock); with `on_free`, a helper thread
        then waits for the lock, holds it for this process and calls `on_free()` (from that thread) for the
        caller to try again (see WriteLock.wait_in_background; `settle_write_lock` if it no longer wants it)."""
        pending = [_PendingWrite(p.body) for p in prepared]
        if not wait:
            with self._lock:
                if self._write_lock is not None and not self._write_lock.try_acquire():
                    if on_free is not None:
                        # Under the connection's lock: no thread of this process holds the write lock now,
                        # so the helper's wait cannot be mistaken for ours (see WriteLock).
                        self._write_lock.wait_in_background(on_free)
                    return None
                with self._queue_lock:
                    batch, self._queue = [*self._queue, *pending], []
                self._commit_batch(batch)  # it releases the write lock when it ends
            return [(p.error, p.result) for p in pending]
        with self._queue_lock:
            self._queue.extend(pending)  # all or none of them are in one committer's batch
        with self._lock:
            if pending and not pending[0].done:
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                self._commit_batch(batch)
        return [(p.error, p.result) for p in pending]

    @property
    def write_lock(self) -> WriteLock | None:
        """The lock writers of this store take turns on (None: the lock file could not be opened)."""
        return self._write_lock

    def settle_write_lock(self) -> None:
        """Let go of a write lock the background wait (write_all's `on_free`) obtained and no write took
        over, e.g. because its caller gave up meanwhile; otherwise nothing."""
        with self._lock:
            lock = self._write_lock
            if lock is not None and not lock.held and lock.granted() and lock.try_acquire():
                lock.release()

    def register(self, instance_id: str, doc: Mapping[str, Any]) -> Literal["registered", "already-registered"]:
        """Record a validated `register` document. Re-registering is a no-op apart from a counter and
        filling fields the first registration left empty."""
        return self.write(self.prepare_register(instance_id, doc))

    def prepare_register(self, instance_id: str, doc: Mapping[str, Any]
                         ) -> PreparedWrite[Literal["registered", "already-registered"]]:
        # Free text from the worker (GPU names, hostnames, versions) is redacted like its logs: it is shown and
        # may reach a commit message. An id that redaction changes is stored changed (never judged).
        values = [self.redactor.value(doc.get(name)) for name in _REGISTER_FIELDS]
        gpus = _canonical(self.redactor.value(list(doc.get("gpus", []))))
        worker_at = _iso(parse_time(doc["at"]))
        received = _iso(self.clock())

        def body(conn: sqlite3.Connection) -> Literal["registered", "already-registered"]:
            row = conn.execute("SELECT destroyed_at FROM instances WHERE instance_id = ?", (instance_id,)).fetchone()
            if row is None:
                conn.execute(
                    f"INSERT INTO instances (instance_id, received_at, worker_at, {', '.join(_REGISTER_FIELDS)}, "  # noqa: S608
                    f"gpus) VALUES (?, ?, ?, {', '.join('?' for _ in _REGISTER_FIELDS)}, ?)",
                    (instance_id, received, worker_at, *values, gpus))
                return "registered"
            if row[0] is not None:
                raise InstanceDestroyed(f"instance {instance_id!r} was destroyed at {row[0]}; "
                                        "it cannot register again")
            fill = ", ".join(f"{name} = COALESCE({name}, ?)" for name in _REGISTER_FIELDS)
            conn.execute(f"UPDATE instances SET registrations = registrations + 1, {fill} "  # noqa: S608
                         "WHERE instance_id = ?", (*values, instance_id))
            return "already-registered"

        return PreparedWrite(body)

    def add_event(self, instance_id: str, doc: Mapping[str, Any]) -> Literal["stored", "duplicate"]:
        """Append a validated `event` document (redacted). An identical resend is a no-op."""
        return self.write(self.prepare_event(instance_id, doc))

    def prepare_event(self, instance_id: str, doc: Mapping[str, Any]) -> PreparedWrite[Literal["stored", "duplicate"]]:
        event = _StoredEvent.of(doc, _iso(self.clock()), self.redactor)

        def body(conn: sqlite3.Connection) -> Literal["stored", "duplicate"]:
            # Refusals first (nothing modified yet), then at most three statements: this is the hot path.
            state = self._writable(conn, instance_id)
            counts = [state[1], state[2]]
            status = self._insert_event(conn, instance_id, event, counts)
            if counts != [state[1], state[2]]:
                column = "progress_events" if event.progress else "other_events"
                conn.execute(f"UPDATE instances SET {column} = {column} + 1 WHERE instance_id = ?",  # noqa: S608
                             (instance_id,))
            return status

        return PreparedWrite(body)

    def add_events(self, instance_id: str, docs: Sequence[Mapping[str, Any]]) -> list[Literal["stored", "duplicate"]]:
        """Append validated `event` documents in order, in one transaction and all or nothing: if the batch
        is refused (event limit) none is stored. Each is deduplicated as by `add_event`, also against events
        earlier in the same batch, so a retried batch stores nothing twice. One status per event."""
        return self.write(self.prepare_events(instance_id, docs))

    def prepare_events(self, instance_id: str, docs: Sequence[Mapping[str, Any]]
                       ) -> PreparedWrite[list[Literal["stored", "duplicate"]]]:
        received = _iso(self.clock())  # they arrived together
        events = [_StoredEvent.of(doc, received, self.redactor) for doc in docs]

        def body(conn: sqlite3.Connection) -> list[Literal["stored", "duplicate"]]:
            # Set-wise rather than one add_event per event (same outcome, a third of the statements):
            # find what is already stored, refuse before modifying anything, insert the rest with one
            # executemany, then trim the progress ring once.
            state = self._writable(conn, instance_id)
            progress_count, other_count = state[1], state[2]
            known = self._stored_fingerprints(conn, instance_id, events)
            statuses: list[Literal["stored", "duplicate"]] = []
            new: list[_StoredEvent] = []
            for event in events:
                if event.fingerprint in known:
                    statuses.append("duplicate")
                else:
                    known.add(event.fingerprint)
                    new.append(event)
                    statuses.append("stored")
            new_other = sum(1 for event in new if not event.progress)
            if new_other and other_count + new_other > self.max_other_events:
                raise EventLimitExceeded(f"instance {instance_id!r} already sent {other_count} non-progress events "
                                         f"and this batch has {new_other} more (limit {self.max_other_events})")
            if not new:
                return statuses
            new_progress = len(new) - new_other
            repeats_progress = any(status == "duplicate" and event.progress
                                   for status, event in zip(statuses, events, strict=True))
            if repeats_progress and progress_count + new_progress > self.max_progress_events:
                # The batch evicts progress events from the ring and also repeats one: if the repeat comes after
                # that event's eviction, one add_event per event would store it again. Rare: one by one.
                counts = [progress_count, other_count]
                statuses = [self._insert_event(conn, instance_id, event, counts) for event in events]
                progress_count, other_count = counts
            else:
                conn.executemany(_INSERT_EVENT, [(instance_id, *event.row) for event in new])
                # As one add_event per event would: at the limit, each new progress event evicts the oldest.
                evicted = min(new_progress, max(0, progress_count + new_progress - self.max_progress_events))
                if evicted:
                    conn.execute("DELETE FROM events WHERE id IN (SELECT id FROM events WHERE instance_id = ? "
                                 "AND status = 'progress' ORDER BY id LIMIT ?)", (instance_id, evicted))
                progress_count, other_count = progress_count + new_progress - evicted, other_count + new_other
            conn.execute("UPDATE instances SET progress_events = ?, other_events = ? WHERE instance_id = ?",
                         (progress_count, other_count, instance_id))
            return statuses

        return PreparedWrite(body)

    @staticmethod
    def _stored_fingerprints(conn: sqlite3.Connection, instance_id: str, events: Sequence[_StoredEvent]) -> set[str]:
        """Fingerprints of `events` already stored. By time first (the index's order; usually no row has
        one of these times), then the fingerprint of each row found."""
        wanted = {event.fingerprint for event in events}
        times = sorted({event.at for event in events})
        found: set[str] = set()
        for start in range(0, len(times), 500):  # far below SQLite's limit on bound parameters
            chunk = times[start:start + 500]
            marks = ", ".join("?" * len(chunk))
            found.update(row[0] for row in conn.execute(
                f"SELECT fingerprint FROM events WHERE instance_id = ? AND at IN ({marks})",  # noqa: S608
                (instance_id, *chunk)) if row[0] in wanted)
        return found

    def _insert_event(self, conn: sqlite3.Connection, instance_id: str, event: _StoredEvent,
                      counts: list[int]) -> Literal["stored", "duplicate"]:
        """Insert one event unless already stored; `counts` = [progress, other] events, updated in place."""
        if not event.progress and counts[1] >= self.max_other_events:
            if conn.execute("SELECT 1 FROM events WHERE instance_id = ? AND at = ? AND fingerprint = ?",
                            (instance_id, event.at, event.fingerprint)).fetchone():
                return "duplicate"
            raise EventLimitExceeded(f"instance {instance_id!r} already sent {counts[1]} non-progress events "
                                     f"(limit {self.max_other_events})")
        inserted = conn.execute(_INSERT_EVENT, (instance_id, *event.row))
        if inserted.rowcount == 0:
            return "duplicate"
        if event.progress and counts[0] >= self.max_progress_events:
            # Progress events are a ring: the newest says where the worker is, old ones add nothing.
            conn.execute("DELETE FROM events WHERE id = (SELECT MIN(id) FROM events WHERE instance_id = ? "
                         "AND status = 'progress')", (instance_id,))
        else:
            counts[0 if event.progress else 1] += 1
        return "stored"

    def add_logs(self, instance_id: str, lines: Sequence[str], dropped: int = 0) -> int:
        """Append redacted log lines to the instance's ring; returns how many older lines it evicted."""
        return self.write(self.prepare_logs(instance_id, lines, dropped))

    def prepare_logs(self, instance_id: str, lines: Sequence[str], dropped: int = 0) -> PreparedWrite[int]:
        clean = self.redactor.lines(lines)
        # Lines that would be evicted by this very batch are never written.
        skipped = max(0, len(clean) - self.ring_lines)
        clean = clean[skipped:]

        def body(conn: sqlite3.Connection) -> int:
            state = self._writable(conn, instance_id)
            start = state[3] + skipped
            conn.executemany("INSERT INTO log_lines (instance_id, seq, line) VALUES (?, ?, ?)",
                             [(instance_id, start + i, line) for i, line in enumerate(clean)])
            next_seq = start + len(clean)
            evicted = conn.execute("DELETE FROM log_lines WHERE instance_id = ? AND seq < ?",
                                   (instance_id, next_seq - self.ring_lines)).rowcount
            conn.execute("UPDATE instances SET next_line_seq = ?, ring_dropped = ring_dropped + ?, "
                         "worker_dropped = worker_dropped + ? WHERE instance_id = ?",
                         (next_seq, evicted + skipped, dropped, instance_id))
            return int(evicted + skipped)

        return PreparedWrite(body)

    def set_result(self, instance_id: str, doc: Mapping[str, Any]) -> Literal["stored", "duplicate"]:
        """Store the validated benchmark `result` (redacted). Accepted once; see module docstring."""
        return self.write(self.prepare_result(instance_id, doc))

    def prepare_result(self, instance_id: str, doc: Mapping[str, Any]) -> PreparedWrite[Literal["stored", "duplicate"]]:
        canonical = _canonical(_redacted_result(doc, self.redactor))
        received = _iso(self.clock())

        def body(conn: sqlite3.Connection) -> Literal["stored", "duplicate"]:
            self._writable(conn, instance_id)
            row = conn.execute("SELECT body, received_at FROM results WHERE instance_id = ?",
                               (instance_id,)).fetchone()
            if row is not None:
                if row[0] == canonical:
                    return "duplicate"
                raise ResultConflict(f"instance {instance_id!r} already reported a different result "
                                     f"(received {row[1]}); a result is accepted once")
            conn.execute("INSERT INTO results (instance_id, received_at, body) VALUES (?, ?, ?)",
                         (instance_id, received, canonical))
            return "stored"

        return PreparedWrite(body)

    def mark_destroyed(self, instance_id: str, now: datetime) -> bool:
        """Mark the instance destroyed (first time wins). False if it never registered."""
        def body(conn: sqlite3.Connection) -> bool:
            cur = conn.execute("UPDATE instances SET destroyed_at = COALESCE(destroyed_at, ?) WHERE instance_id = ?",
                               (_iso(now), instance_id))
            return cur.rowcount > 0

        return self._transaction(body)

    def set_directives(self, directives: Mapping[str, Mapping[str, Any]], now: datetime) -> int:
        """Store the reconciler's directive per instance (recomputed every pass); returns how many changed."""
        rows = [(instance_id, _iso(now), _canonical(body)) for instance_id, body in sorted(directives.items())]

        def body(conn: sqlite3.Connection) -> int:
            before = conn.total_changes
            conn.executemany(
                "INSERT INTO directives (instance_id, set_at, body) VALUES (?, ?, ?) ON CONFLICT (instance_id) "
                "DO UPDATE SET set_at = excluded.set_at, body = excluded.body WHERE body != excluded.body", rows)
            return conn.total_changes - before

        return self._transaction(body) if rows else 0

    def directive(self, instance_id: str) -> dict[str, Any] | None:
        """The directive stored for the instance, with `at` (when it was set), or None."""
        row = self._snapshot(lambda conn: conn.execute(
            "SELECT set_at, body FROM directives WHERE instance_id = ?", (instance_id,)).fetchone())
        if row is None:
            return None
        doc = json.loads(row[1])
        at = datetime.fromisoformat(row[0]).astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
        return {**doc, "at": at} if isinstance(doc, dict) else None

    # --- reads -------------------------------------------------------------------------------------

    def _snapshot(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run the SELECTs of one read in a single transaction: a consistent view across tables."""
        if self._in_group():
            return body(self._conn)  # inside the group's transaction: it sees the group's own writes
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                return body(self._conn)
            finally:
                self._conn.execute("COMMIT")

    def tail(self, instance_id: str, n: int) -> list[str]:
        """The last `n` stored log lines of the instance, oldest first ([] if unknown)."""
        if n <= 0:
            return []
        return self._snapshot(lambda conn: self._tail(conn, instance_id, n))

    @staticmethod
    def _tail(conn: sqlite3.Connection, instance_id: str, n: int) -> list[str]:
        rows = conn.execute("SELECT line FROM log_lines WHERE instance_id = ? ORDER BY seq DESC LIMIT ?",
                            (instance_id, n)).fetchall()
        return [r[0] for r in reversed(rows)]

    def log_rings(self, instance_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """The whole stored log ring of each instance (oldest first; bounded by `ring_lines`): the evidence of an
        instance about to be judged (`flows.judge`), where `reports()` carries only the last REPORT_TAIL_LINES."""
        def body(conn: sqlite3.Connection) -> dict[str, tuple[str, ...]]:
            return {iid: tuple(r[0] for r in conn.execute(
                        "SELECT line FROM log_lines WHERE instance_id = ? ORDER BY seq", (iid,)))
                    for iid in dict.fromkeys(instance_ids)}

        return self._snapshot(body) if instance_ids else {}

    def log_view(self, instance_id: str, n: int) -> LogView | None:
        def body(conn: sqlite3.Connection) -> LogView | None:
            row = conn.execute("SELECT ring_dropped + worker_dropped, destroyed_at FROM instances "
                               "WHERE instance_id = ?", (instance_id,)).fetchone()
            if row is None:
                return None
            lines = self._tail(conn, instance_id, n) if n > 0 else []
            return LogView(instance_id, tuple(lines), row[0], _dt(row[1]))

        return self._snapshot(body)

    def report(self, instance_id: str) -> InstanceReport | None:
        found = self._snapshot(lambda conn: self._load(conn, instance_id))
        return found[0][0] if found else None

    def detail(self, instance_id: str) -> tuple[InstanceReport, InstanceMeta] | None:
        found = self._snapshot(lambda conn: self._load(conn, instance_id))
        return found[0] if found else None

    def reports(self, include_destroyed: bool = True) -> list[InstanceReport]:
        """Every instance, ordered by first registration (controller clock)."""
        found = self._snapshot(lambda conn: self._load(conn, None))
        return [r for r, _ in found if include_destroyed or r.destroyed_at is None]

    def _load(self, conn: sqlite3.Connection, instance_id: str | None) -> list[tuple[InstanceReport, InstanceMeta]]:
        where, args = ("WHERE instance_id = ?", (instance_id,)) if instance_id is not None else ("", ())
        instances = conn.execute(
            "SELECT instance_id, received_at, worker_at, pool, slot, machine_id, host_id, contract_id, gpu_name, "  # noqa: S608
            "image_digest, image_version, hostname, gpus, registrations, next_line_seq, ring_dropped, "
            f"worker_dropped, destroyed_at FROM instances {where} ORDER BY received_at, instance_id",
            args).fetchall()
        if not instances:
            return []
        events: dict[str, list[tuple[PhaseEvent, datetime]]] = {}
        event_sql = ("SELECT instance_id, phase, status, at, received_at, exit_code, message, log_tail, details "  # noqa: S608
                     f"FROM events {where} ORDER BY id")
        unreadable: dict[str, str] = {}
        for row in conn.execute(event_sql, args):
            try:
                # One clock: the event is placed at its arrival on the controller's clock; the worker's
                # timestamp stays as evidence (a worker with a skewed clock cannot reorder the timeline).
                received = datetime.fromisoformat(row[4])
                event = PhaseEvent(phase=row[1], status=row[2], at=received, worker_at=datetime.fromisoformat(row[3]),
                                   exit_code=row[5], message=row[6], log_tail=tuple(json.loads(row[7])),
                                   details=json.loads(row[8]))
                events.setdefault(row[0], []).append((event, received))
            except (ValueError, TypeError) as exc:
                unreadable.setdefault(row[0], f"an event is unreadable: {type(exc).__name__}: {exc}")
        results: dict[str, tuple[Any, datetime]] = {}
        for row in conn.execute(f"SELECT instance_id, received_at, body FROM results {where}", args):  # noqa: S608
            try:
                results[row[0]] = (json.loads(row[2]), datetime.fromisoformat(row[1]))
            except (ValueError, TypeError) as exc:
                unreadable.setdefault(row[0], f"the result is unreadable: {type(exc).__name__}: {exc}")
        # One index-backed query per instance (last N by primary key) rather than a window over every
        # stored line: the loop reads all reports each pass, and rings hold thousands of lines each.
        tails = {row[0]: self._tail(conn, row[0], REPORT_TAIL_LINES) for row in instances}
        out = []
        for row in instances:
            if row[0] in unreadable:
                out.append(self._quarantined(row, f"stored report unreadable: {unreadable[row[0]]}"))
                continue
            try:
                out.append(self._report_of(row, events, results, tails))
            except (ValueError, TypeError, KeyError, OverflowError) as exc:
                # One unreadable instance (a row written by an older or buggy controller) must not stop the
                # loop from judging every other one: it is quarantined with its reason.
                out.append(self._quarantined(row, f"stored report unreadable: {type(exc).__name__}: {exc}"))
        return out

    @staticmethod
    def _quarantined(row: Sequence[Any], reason: str) -> tuple[InstanceReport, InstanceMeta]:
        try:
            registered = datetime.fromisoformat(row[1])
        except (TypeError, ValueError):
            registered = datetime.min.replace(tzinfo=UTC)
        report = InstanceReport(instance_id=str(row[0]), registered_at=registered, pool=row[3],
                                machine_id=row[5] if isinstance(row[5], str) else None, quarantine=reason)
        return report, InstanceMeta(worker_registered_at=registered, registrations=0, hostname=None, gpus=(),
                                    stored_log_lines=0, ring_dropped=0, worker_dropped=0, event_received_at=(),
                                    result_received_at=None)

    @staticmethod
    def _report_of(row: Sequence[Any], events: Mapping[str, list[tuple[PhaseEvent, datetime]]],
                   results: Mapping[str, tuple[Any, datetime]], tails: Mapping[str, list[str]]
                   ) -> tuple[InstanceReport, InstanceMeta]:
        iid = row[0]
        evs = events.get(iid, [])
        result_doc, result_received = results.get(iid, (None, None))
        registered, worker_registered = datetime.fromisoformat(row[1]), datetime.fromisoformat(row[2])
        skew = (worker_registered - registered).total_seconds()
        for event, received in evs:
            if event.worker_at is not None:
                skew = (event.worker_at - received).total_seconds()
        result = None
        if result_doc is not None and result_received is not None:
            sent = _result_from_doc(result_doc)
            shift = sent.at - result_received  # the worker's clock minus ours when it sent the result
            skew = shift.total_seconds()
            result = replace(sent, at=result_received, worker_at=sent.at,
                             started_at=None if sent.started_at is None else sent.started_at - shift)
        report = InstanceReport(
            instance_id=iid, registered_at=registered, pool=row[3], slot=row[4],
            machine_id=row[5], host_id=row[6], contract_id=row[7], gpu_name=row[8], image_digest=row[9],
            image_version=row[10], events=tuple(e for e, _ in evs), result=result,
            log_tail=tuple(tails.get(iid, ())), dropped_log_lines=row[15] + row[16], destroyed_at=_dt(row[17]),
            clock_skew_s=round(skew, 3), gpu_probe=tuple(str(line) for line in json.loads(row[12])))
        meta = InstanceMeta(
            worker_registered_at=datetime.fromisoformat(row[2]), registrations=row[13], hostname=row[11],
            gpus=tuple(json.loads(row[12])), stored_log_lines=row[14] - row[15], ring_dropped=row[15],
            worker_dropped=row[16], event_received_at=tuple(r for _, r in evs),
            result_received_at=result_received)
        return report, meta

    def instance_count(self) -> int:
        """Cheap liveness probe for /healthz (stats() counts every log line)."""
        return int(self._snapshot(lambda conn: conn.execute("SELECT COUNT(*) FROM instances").fetchone()[0]))

    def stats(self) -> dict[str, int]:
        """Row counts per table: cheap health figures, and how tests prove a rejection stored nothing."""
        def body(conn: sqlite3.Connection) -> dict[str, int]:
            return {table: conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]  # noqa: S608
                    for table in ("instances", "events", "results", "log_lines")}

        return self._snapshot(body)

    def integrity_check(self) -> list[str]:
        """`PRAGMA integrity_check` rows: ['ok'] for a sound file."""
        return [r[0] for r in self._snapshot(lambda conn: conn.execute("PRAGMA integrity_check").fetchall())]

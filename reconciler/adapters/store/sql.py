"""The SQL both store adapters run and the transaction discipline they share (`SqlStore`): group commit,
refusals before modification, a broken write failing alone; and the CPU work of a write done before its
transaction (redaction, canonical encoding, fingerprints). Written for SQLite's `?` placeholders and dialect,
which the PostgreSQL adapter translates; an adapter gives a connection and says which driver errors are temporary.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import json.scanner
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, TypeVar

from reconciler.adapters.settings import known_secret_values
from reconciler.adapters.store.port import (
    REPORT_TAIL_LINES,
    EventLimitExceeded,
    InstanceDestroyed,
    InstanceMeta,
    LogView,
    PreparedWrite,
    ResultConflict,
    SqlConnection,
    StoreChanges,
    StoreError,
    StoreUnavailable,
    UnknownInstance,
)
from reconciler.domain.observations import (
    BenchmarkResult,
    InstanceReport,
    InstanceSummary,
    PhaseEvent,
    ProofResult,
    parse_time,
)
from reconciler.domain.redact import Redactor

_T = TypeVar("_T")


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


#: The C scanner behind json.loads, built once (see _decoded).
_c_make_scanner = getattr(json.scanner, "c_make_scanner", None)
_c_scanner = None if _c_make_scanner is None else _c_make_scanner(json.JSONDecoder())


def _decoded(text: str) -> Any:
    """`json.loads(text)` for a JSON text read back from the store. A pass reads a few hundred thousand small
    texts (every event's log tail and details): "[]" and "{}" need no parser, and the others go straight to the C
    scanner json.loads ends in (json.loads adds two regex matches and three Python calls per text: most of a
    small text's cost). Anything the scanner does not take whole (not canonical, not JSON): json.loads, which
    gives its error."""
    if text == "[]":
        return []
    if text == "{}":
        return {}
    if _c_scanner is not None and type(text) is str:
        try:
            value, end = _c_scanner(text, 0)
        except (StopIteration, ValueError):
            pass
        else:
            if end == len(text):
                return value
    return json.loads(text)


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat()


def _utc_text(stored: str) -> str:
    """A stored time (`_iso`) as the protocol writes times: `2026-12-02T18:00:00Z`, whole seconds."""
    return datetime.fromisoformat(stored).astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


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


def _result_from_doc(doc: Mapping[str, Any], received: datetime) -> BenchmarkResult:
    """The stored result document as a BenchmarkResult on the controller's clock: at its arrival (`received`),
    its start shifted by the worker's clock skew; the worker's own `at` kept as `worker_at`."""
    sent = parse_time(doc["at"])
    started = doc.get("started_at")
    return BenchmarkResult(
        outcome=doc["outcome"], at=received, worker_at=sent, requested=doc["requested"], completed=doc["completed"],
        failed=doc["failed"], started_at=None if started is None else parse_time(started) - (sent - received),
        exit_code=doc.get("exit_code"), proofs_per_hour=doc.get("proofs_per_hour"),
        seconds_per_proof=doc.get("seconds_per_proof"), proof_type=doc.get("proof_type"),
        concurrency=doc.get("concurrency"), image_digest=doc.get("image_digest"),
        log_tail=tuple(doc.get("log_tail", ())),
        # Protocol additions (issue 13; optional): per-proof results and the daemon's filtered log.
        proofs=tuple(ProofResult(p["index"], p["label"], p.get("seconds"), p.get("reason"))
                     for p in doc.get("proofs") or () if isinstance(p, Mapping)),
        daemon_log=tuple(doc.get("daemon_log_tail") or ()))


#: What set_directives sets a changed directive's `change_seq` to: changed by this transaction, whose sequence is
#: taken just before it commits (`SqlStore._sequence_changes`); never committed.
CHANGED = -1

_INSERT_EVENT = ("INSERT INTO events (instance_id, phase, status, at, received_at, exit_code, message, log_tail, "
                 "details, fingerprint) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                 "ON CONFLICT (instance_id, at, fingerprint) DO NOTHING")


@dataclass(frozen=True)
class _StoredEvent:
    """An event as written: redacted, its identity (fingerprint of the redacted document) and its row."""

    progress: bool
    fingerprint: str
    #: The event's time as stored (`at` column; part of its key, see schema.LAYOUT).
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


class _PendingWrite:
    """One queued write of a group commit (see SqlStore.write_all)."""

    __slots__ = ("body", "done", "error", "instance_id", "result")

    def __init__(self, body: Callable[[SqlConnection], Any], instance_id: str = ""):
        self.body = body
        self.instance_id = instance_id
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


class SqlStore:
    """The SQL both adapters run (written for SQLite's `?` placeholders and dialect, which PostgreSQL shares
    here) and the transaction discipline: group commit, refusals before modification, a broken write failing
    alone. An adapter gives `_connection`, `_unavailable` and the statements that differ (class attributes)."""

    #: Opens a write transaction / a read-only snapshot (a consistent view across tables).
    _BEGIN_WRITE: ClassVar[str]
    _BEGIN_READ: ClassVar[str]
    #: Appended to the SELECT of an instance's row that a write then decides on.
    _LOCK_ROW: ClassVar[str] = ""
    remote: bool = False

    def __init__(self, ring_lines: int, *, now: Callable[[], datetime] | None, max_progress_events: int,
                 max_other_events: int, redactor: Redactor | None):
        if ring_lines < 1:
            raise ValueError(f"ring_lines must be >= 1, got {ring_lines}")
        self.ring_lines = ring_lines
        self.max_progress_events = max_progress_events
        self.max_other_events = max_other_events
        #: Applied to everything a worker sends before it is stored: the patterns plus the secrets this
        #: deployment knows by value (settings: vast.ai key, registry password, controller tokens).
        self.redactor = redactor or Redactor.with_secrets(known_secret_values())
        #: The store's clock (received_at); the controller uses it for admin actions too.
        self.clock: Callable[[], datetime] = now or (lambda: datetime.now(UTC))
        self._writer = threading.Lock()  # one batch of this process at a time (the group commit's committer)
        self._queue_lock = threading.Lock()  # guards the group-commit queue
        self._queue: list[_PendingWrite] = []
        #: Stored directives as of change sequence `_directives_at` (see _stored_directives).
        self._directive_bodies: dict[str, str] = {}
        self._directives_at: int | None = None

    # --- what an adapter provides ------------------------------------------------------------------------

    def _connection(self) -> contextlib.AbstractContextManager[SqlConnection]:
        raise NotImplementedError

    def _unavailable(self, exc: BaseException) -> StoreUnavailable | None:
        """`exc` (a driver error) as a temporary failure, or None when it is not one (a bug)."""
        raise NotImplementedError

    # --- transactions ------------------------------------------------------------------------------------

    def _snapshot(self, body: Callable[[SqlConnection], _T]) -> _T:
        """Run the SELECTs of one read in a single transaction: a consistent view across tables, all or nothing
        (a pass never judges from a half-read store)."""
        try:
            with self._connection() as conn:
                conn.execute(self._BEGIN_READ)
                try:
                    return body(conn)
                finally:
                    conn.execute("COMMIT")
        except StoreUnavailable:
            raise
        except Exception as exc:
            unavailable = self._unavailable(exc)
            if unavailable is None:
                raise
            raise unavailable from exc

    def _transaction(self, body: Callable[[SqlConnection], _T]) -> _T:
        """Run `body` in a committed transaction; return only once it is committed (see write_all)."""
        return self.write(PreparedWrite(body))

    def write(self, prepared: PreparedWrite[_T]) -> _T:
        """Run a write made by one of the `prepare_*` methods, in a committed transaction."""
        [(error, result)] = self.write_all([prepared])
        if error is not None:
            raise error
        return result

    def write_all(self, prepared: Sequence[PreparedWrite[Any]]) -> list[tuple[BaseException | None, Any]]:
        """Run many prepared writes in one transaction (with any other thread's queued writes) and return, per
        write, (error, result) once committed. Each write succeeds or fails alone, as by `write`: a refusal
        (StoreError) leaves the others intact, any other failure is retried without the write that caused it
        (see _commit_batch); the database being unavailable, or an error of the COMMIT itself, is every
        write's error.

        Group commit: a write queues itself, and whichever thread gets to write runs every queued write in one
        transaction and commits once for all. Under concurrent callers this turns N commits into one; alone, a
        write is still its own transaction. A caller is answered only after the COMMIT that contains its writes.
        """
        pending = [_PendingWrite(p.body, p.instance_id) for p in prepared]
        with self._queue_lock:
            self._queue.extend(pending)  # all or none of them are in one committer's batch
        with self._writer:
            if pending and not pending[0].done:
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                # Row locks in one order (instance id; a stable sort keeps one instance's writes in order).
                batch.sort(key=lambda item: item.instance_id)
                try:
                    with self._connection() as conn:
                        self._commit_batch(conn, batch)
                except Exception as exc:
                    failure: BaseException = exc if isinstance(exc, StoreUnavailable) else (
                        self._unavailable(exc) or exc)
                    for item in batch:
                        if not item.done:  # (a batch that ran was answered by _commit_batch: committed or not)
                            item.result, item.error, item.done = None, failure, True
        return [(p.error, p.result) for p in pending]

    def _commit_batch(self, conn: SqlConnection, batch: list[_PendingWrite]) -> None:
        """One transaction for the whole batch. Write bodies refuse (raise StoreError) only before they
        modify anything, so a refusal needs no savepoint. Any other failure rolls the batch back; the write
        that broke fails alone and the others run again without it; a failure that is the database's
        (`_unavailable`) fails them all."""
        current: _PendingWrite | None = None
        try:
            conn.execute(self._BEGIN_WRITE)
            for item in batch:
                current = item
                try:
                    item.result = item.body(conn)
                except StoreError as exc:
                    item.error = exc
            current = None
            self._sequence_changes(conn, batch)
            conn.execute("COMMIT")
        except BaseException as exc:
            self._rollback(conn)
            unavailable = self._unavailable(exc) if isinstance(exc, Exception) else None
            if unavailable is None and current is not None and len(batch) > 1 and isinstance(exc, Exception):
                others = [item for item in batch if item is not current]
                for item in others:
                    item.result, item.error = None, None
                self._commit_batch(conn, others)
                current.result, current.error = None, exc
                return
            for item in batch:
                item.result, item.error = None, unavailable or exc
            if not isinstance(exc, Exception):
                raise
        finally:
            for item in batch:
                item.done = True

    @staticmethod
    def _sequence_changes(conn: SqlConnection, batch: Sequence[_PendingWrite]) -> None:
        """The last statements before COMMIT: take the next change sequence and stamp it on the instances the
        batch's writes went to (those not refused: `instances.change_seq`) and on the directives it changed
        (`directives.change_seq` = CHANGED, marked by set_directives); nothing when there are none.

        The sequence is taken by updating the one `change_sequence` row, whose lock is then held until COMMIT:
        of several writers (PostgreSQL replicas), the next one's update waits until this one has committed, so
        sequences are taken in commit order and a reader that sees sequence N committed sees every write at or
        below N (a sequence drawn from a PostgreSQL SEQUENCE could commit after a higher one a reader already
        passed, and be missed for good). Taken last, the lock serialises only the commits, not the writes; SQLite
        has one writer at a time anyway. A transaction that rolls back gives its sequence back, unseen.
        Instances are stamped by key, in one statement per 500: `change_seq` has no index of its own, so the
        updates of an instance's row on the ingest path maintain none (and stay HOT on PostgreSQL);
        `changes_since` scans the instances instead, once per pass."""
        written = sorted({item.instance_id for item in batch if item.instance_id and item.error is None})
        row = conn.execute("UPDATE change_sequence SET sequence = sequence + 1 WHERE ? OR EXISTS "  # noqa: S608
                           f"(SELECT 1 FROM directives WHERE change_seq = {CHANGED}) RETURNING sequence",
                           (bool(written),)).fetchone()
        if row is None:
            return
        for start in range(0, len(written), 500):
            chunk = written[start:start + 500]
            conn.execute(f"UPDATE instances SET change_seq = ? WHERE instance_id IN ({', '.join('?' * len(chunk))})",  # noqa: S608
                         (row[0], *chunk))
        conn.execute(f"UPDATE directives SET change_seq = ? WHERE change_seq = {CHANGED}", (row[0],))  # noqa: S608

    def _rollback(self, conn: SqlConnection) -> None:
        with contextlib.suppress(Exception):  # none open (it failed to begin), or the connection is gone
            conn.execute("ROLLBACK")

    def _writable(self, conn: SqlConnection, instance_id: str) -> tuple[Any, ...]:
        """The instance's row (destroyed_at, progress_events, other_events, next_line_seq, log_key_lines), locked
        for this transaction; refuses an unknown or destroyed instance (before anything is modified)."""
        row = conn.execute("SELECT destroyed_at, progress_events, other_events, next_line_seq, log_key_lines "  # noqa: S608
                           "FROM instances "
                           f"WHERE instance_id = ?{self._LOCK_ROW}", (instance_id,)).fetchone()
        if row is None:
            raise UnknownInstance(f"instance {instance_id!r} never registered")
        if row[0] is not None:
            raise InstanceDestroyed(f"instance {instance_id!r} was destroyed at {row[0]}; "
                                    "it accepts no more reports")
        return tuple(row)

    # --- writes ------------------------------------------------------------------------------------------

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

        def body(conn: SqlConnection) -> Literal["registered", "already-registered"]:
            # Insert first: of two replicas registering the same new instance at once, one inserts and the other
            # (its insert waits for the first's commit, then does nothing) re-registers below.
            inserted = conn.execute(
                f"INSERT INTO instances (instance_id, received_at, worker_at, {', '.join(_REGISTER_FIELDS)}, "  # noqa: S608
                f"gpus) VALUES (?, ?, ?, {', '.join('?' for _ in _REGISTER_FIELDS)}, ?) "
                "ON CONFLICT (instance_id) DO NOTHING",
                (instance_id, received, worker_at, *values, gpus)).rowcount
            if inserted:
                return "registered"
            row = conn.execute(f"SELECT destroyed_at FROM instances WHERE instance_id = ?{self._LOCK_ROW}",  # noqa: S608
                               (instance_id,)).fetchone()
            if row[0] is not None:
                raise InstanceDestroyed(f"instance {instance_id!r} was destroyed at {row[0]}; "
                                        "it cannot register again")
            fill = ", ".join(f"{name} = COALESCE({name}, ?)" for name in _REGISTER_FIELDS)
            conn.execute(f"UPDATE instances SET registrations = registrations + 1, {fill} "  # noqa: S608
                         "WHERE instance_id = ?", (*values, instance_id))
            return "already-registered"

        return PreparedWrite(body, instance_id)

    def add_event(self, instance_id: str, doc: Mapping[str, Any]) -> Literal["stored", "duplicate"]:
        """Append a validated `event` document (redacted). An identical resend is a no-op."""
        return self.write(self.prepare_event(instance_id, doc))

    def prepare_event(self, instance_id: str, doc: Mapping[str, Any]) -> PreparedWrite[Literal["stored", "duplicate"]]:
        event = _StoredEvent.of(doc, _iso(self.clock()), self.redactor)

        def body(conn: SqlConnection) -> Literal["stored", "duplicate"]:
            # Refusals first (nothing modified yet), then at most three statements: this is the hot path.
            state = self._writable(conn, instance_id)
            counts = [state[1], state[2]]
            status = self._insert_event(conn, instance_id, event, counts)
            if counts != [state[1], state[2]]:
                column = "progress_events" if event.progress else "other_events"
                conn.execute(f"UPDATE instances SET {column} = {column} + 1 WHERE instance_id = ?",  # noqa: S608
                             (instance_id,))
            return status

        return PreparedWrite(body, instance_id)

    def add_events(self, instance_id: str, docs: Sequence[Mapping[str, Any]]) -> list[Literal["stored", "duplicate"]]:
        """Append validated `event` documents in order, in one transaction and all or nothing: if the batch
        is refused (event limit) none is stored. Each is deduplicated as by `add_event`, also against events
        earlier in the same batch, so a retried batch stores nothing twice. One status per event."""
        return self.write(self.prepare_events(instance_id, docs))

    def prepare_events(self, instance_id: str, docs: Sequence[Mapping[str, Any]]
                       ) -> PreparedWrite[list[Literal["stored", "duplicate"]]]:
        received = _iso(self.clock())  # they arrived together
        events = [_StoredEvent.of(doc, received, self.redactor) for doc in docs]

        def body(conn: SqlConnection) -> list[Literal["stored", "duplicate"]]:
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

        return PreparedWrite(body, instance_id)

    @staticmethod
    def _stored_fingerprints(conn: SqlConnection, instance_id: str, events: Sequence[_StoredEvent]) -> set[str]:
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

    def _insert_event(self, conn: SqlConnection, instance_id: str, event: _StoredEvent,
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
        # Redacted as if no private-key block were open before this batch (the usual case); the transaction reads
        # the instance's stream state and redacts again as the block's continuation when one is (rare).
        redacted, key_lines_after = self.redactor.stream(lines)
        # Lines that would be evicted by this very batch are never written.
        skipped = max(0, len(redacted) - self.ring_lines)

        def body(conn: SqlConnection) -> int:
            state = self._writable(conn, instance_id)
            clean, key_lines = redacted, key_lines_after
            if state[4]:
                clean, key_lines = self.redactor.stream(lines, state[4])
            clean = clean[skipped:]
            start = state[3] + skipped
            conn.executemany("INSERT INTO log_lines (instance_id, seq, line) VALUES (?, ?, ?)",
                             [(instance_id, start + i, line) for i, line in enumerate(clean)])
            next_seq = start + len(clean)
            evicted = conn.execute("DELETE FROM log_lines WHERE instance_id = ? AND seq < ?",
                                   (instance_id, next_seq - self.ring_lines)).rowcount
            conn.execute("UPDATE instances SET next_line_seq = ?, ring_dropped = ring_dropped + ?, "
                         "worker_dropped = worker_dropped + ?, log_key_lines = ? WHERE instance_id = ?",
                         (next_seq, evicted + skipped, dropped, key_lines, instance_id))
            return int(evicted + skipped)

        return PreparedWrite(body, instance_id)

    def set_result(self, instance_id: str, doc: Mapping[str, Any]) -> Literal["stored", "duplicate"]:
        """Store the validated benchmark `result` (redacted). Accepted once; see module docstring."""
        return self.write(self.prepare_result(instance_id, doc))

    def prepare_result(self, instance_id: str, doc: Mapping[str, Any]) -> PreparedWrite[Literal["stored", "duplicate"]]:
        canonical = _canonical(_redacted_result(doc, self.redactor))
        received = _iso(self.clock())

        def body(conn: SqlConnection) -> Literal["stored", "duplicate"]:
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

        return PreparedWrite(body, instance_id)

    def mark_destroyed(self, instance_id: str, now: datetime) -> bool:
        """Mark the instance destroyed (first time wins). False if it never registered."""
        def body(conn: SqlConnection) -> bool:
            cur = conn.execute("UPDATE instances SET destroyed_at = COALESCE(destroyed_at, ?) WHERE instance_id = ?",
                               (_iso(now), instance_id))
            return cur.rowcount > 0

        return self.write(PreparedWrite(body, instance_id))

    def set_directives(self, directives: Mapping[str, Mapping[str, Any]], now: datetime, *,
                       fence: Callable[[SqlConnection], None] | None = None) -> int:
        """Store the reconciler's directive per instance (recomputed every pass); returns how many changed.
        `fence` runs first in the same transaction and may raise to write nothing (a replica's lease check,
        reconciler/adapters/lease.py: it also keeps the lease from changing hands until this commits)."""
        at = _iso(now)
        rows = [(instance_id, at, _canonical(body)) for instance_id, body in sorted(directives.items())]

        def body(conn: SqlConnection) -> int:
            if fence is not None:
                fence(conn)
            stored = self._stored_directives(conn)
            changed = [row for row in rows if stored.get(row[0]) != row[2]]
            if not changed:
                return 0
            return conn.executemany(
                f"INSERT INTO directives (instance_id, set_at, body, change_seq) VALUES (?, ?, ?, {CHANGED}) "  # noqa: S608
                "ON CONFLICT (instance_id) DO UPDATE SET set_at = excluded.set_at, body = excluded.body, "
                "change_seq = excluded.change_seq WHERE directives.body != excluded.body", changed).rowcount

        return self._transaction(body) if rows else 0

    def _stored_directives(self, conn: SqlConnection) -> dict[str, str]:
        """Every stored directive's body, kept in memory and brought up to date from the directives changed since
        the last call (by the change sequence): a pass stores 10,000 directives of which a few changed, and
        comparing them here costs a fraction of sending all of them to the database. Run inside a write (under
        the group commit's writer lock): the sequence is read first, so every row at or below it is then
        visible, and a rolled-back write leaves the memory as the database is."""
        sequence = conn.execute("SELECT sequence FROM change_sequence").fetchone()[0]
        if self._directives_at is None or sequence < self._directives_at:  # first call, or not the same store
            self._directive_bodies = dict(conn.execute("SELECT instance_id, body FROM directives").fetchall())
        elif sequence > self._directives_at:
            self._directive_bodies.update(conn.execute(
                "SELECT instance_id, body FROM directives WHERE change_seq > ?", (self._directives_at,)).fetchall())
        self._directives_at = sequence
        return self._directive_bodies

    # --- the status page's sign-in sessions (render/live.py; schema.py `_SESSIONS`) ----------------------

    def create_session(self, id_hash: str, token_fp: str, now: datetime, expires_at: datetime) -> None:
        """A session found by `id_hash` until `expires_at`; sessions already expired are deleted with it."""
        def body(conn: SqlConnection) -> None:
            conn.execute("DELETE FROM sessions WHERE expires_at <= ?", (_iso(now),))
            conn.execute("INSERT INTO sessions (id_hash, token_fp, created_at, expires_at) VALUES (?, ?, ?, ?)",
                         (id_hash, token_fp, _iso(now), _iso(expires_at)))

        self._transaction(body)

    def session(self, id_hash: str, now: datetime) -> str | None:
        """The fingerprint of the token that signed in the session `id_hash`, while it has not expired or been
        revoked; None otherwise."""
        row = self._snapshot(lambda conn: conn.execute(
            "SELECT token_fp FROM sessions WHERE id_hash = ? AND expires_at > ?", (id_hash, _iso(now))).fetchone())
        return None if row is None else str(row[0])

    def revoke_session(self, id_hash: str) -> bool:
        return bool(self._transaction(lambda conn: conn.execute(
            "DELETE FROM sessions WHERE id_hash = ?", (id_hash,)).rowcount))

    def revoke_sessions(self) -> int:
        """End every session (every replica's): each browser signs in again."""
        return int(self._transaction(lambda conn: conn.execute("DELETE FROM sessions").rowcount))

    def directive(self, instance_id: str) -> dict[str, Any] | None:
        """The directive stored for the instance, with `at` (when it was set), or None; `stop` once the instance
        is marked destroyed, whatever the last pass decided (its token is good for nothing else then)."""
        row = self._snapshot(lambda conn: conn.execute(
            "SELECT (SELECT destroyed_at FROM instances WHERE instance_id = ?), "
            "(SELECT set_at FROM directives WHERE instance_id = ?), "
            "(SELECT body FROM directives WHERE instance_id = ?)", (instance_id,) * 3).fetchone())
        destroyed_at, set_at, body = row if row is not None else (None, None, None)
        if destroyed_at is not None:
            return {"protocol": 1, "action": "stop", "reason": "instance destroyed", "at": _utc_text(destroyed_at)}
        if body is None:
            return None
        doc = json.loads(body)
        return {**doc, "at": _utc_text(str(set_at))} if isinstance(doc, dict) else None

    # --- reads -------------------------------------------------------------------------------------

    def tail(self, instance_id: str, n: int) -> list[str]:
        """The last `n` stored log lines of the instance, oldest first ([] if unknown)."""
        if n <= 0:
            return []
        return self._snapshot(lambda conn: self._tail(conn, instance_id, n))

    @staticmethod
    def _tail(conn: SqlConnection, instance_id: str, n: int) -> list[str]:
        rows = conn.execute("SELECT line FROM log_lines WHERE instance_id = ? ORDER BY seq DESC LIMIT ?",
                            (instance_id, n)).fetchall()
        return [r[0] for r in reversed(rows)]

    def _tails(self, conn: SqlConnection, instance_ids: Sequence[str], *, everyone: bool) -> dict[str, list[str]]:
        """The last REPORT_TAIL_LINES of each instance (`everyone`: every stored instance is asked for)."""
        return {iid: self._tail(conn, iid, REPORT_TAIL_LINES) for iid in instance_ids}

    def log_rings(self, instance_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """The whole stored log ring of each instance (oldest first; bounded by `ring_lines`): the evidence of an
        instance about to be judged (`flows.judge`), where `reports()` carries only the last REPORT_TAIL_LINES."""
        def body(conn: SqlConnection) -> dict[str, tuple[str, ...]]:
            return {iid: tuple(r[0] for r in conn.execute(
                        "SELECT line FROM log_lines WHERE instance_id = ? ORDER BY seq", (iid,)))
                    for iid in dict.fromkeys(instance_ids)}

        return self._snapshot(body) if instance_ids else {}

    def log_view(self, instance_id: str, n: int) -> LogView | None:
        def body(conn: SqlConnection) -> LogView | None:
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

    def changes_since(self, since: int) -> StoreChanges:
        """See `ControllerStore.changes_since` (and `_sequence_changes` for why none is missed). One snapshot:
        the sequence, then the instances whose rows carry a higher one (a scan of the instances: a few
        milliseconds at 10,000, once per pass, where an index would cost every write on the ingest path)."""
        def body(conn: SqlConnection) -> StoreChanges:
            sequence = conn.execute("SELECT sequence FROM change_sequence").fetchone()[0]
            if since == sequence:
                return StoreChanges(sequence, (), complete=False)
            complete = since <= 0 or since > sequence
            where, args = ("", ()) if complete else ("WHERE change_seq > ?", (since,))
            rows = conn.execute(f"SELECT instance_id FROM instances {where} "  # noqa: S608
                                "ORDER BY received_at, instance_id", args).fetchall()
            return StoreChanges(sequence, tuple(row[0] for row in rows), complete=complete)

        return self._snapshot(body)

    def reports_of(self, instance_ids: Sequence[str]) -> list[InstanceReport]:
        """The reports of these instances only (with their events), ordered by first registration: what a view
        shows of a 10,000-instance fleet is a page of them, not all of them."""
        if not instance_ids:
            return []
        wanted = list(dict.fromkeys(instance_ids))
        # Chunks of bound parameters (portable SQL: SQLite and PostgreSQL alike), all in one read transaction.
        found = self._snapshot(lambda conn: [pair for start in range(0, len(wanted), 500)
                                             for pair in self._load(conn, None, wanted[start:start + 500])])
        found.sort(key=lambda pair: (pair[0].registered_at, pair[0].instance_id))
        return [r for r, _ in found]

    def instance_summaries(self) -> list[InstanceSummary]:
        """Every instance in a few columns, without its events, log or result body: what the views need to
        decide which instances need the operator (and to count the rest). One query; the aggregates use the
        events' (instance_id, at, ...) and (instance_id, status, ...) indexes."""
        def body(conn: SqlConnection) -> list[InstanceSummary]:
            rows = conn.execute(
                "SELECT i.instance_id, i.received_at, i.pool, i.slot, i.machine_id, i.host_id, i.gpu_name, "
                "i.image_digest, i.destroyed_at, "
                "EXISTS (SELECT 1 FROM results r WHERE r.instance_id = i.instance_id), "
                "EXISTS (SELECT 1 FROM events e WHERE e.instance_id = i.instance_id AND e.status = 'failed'), "
                "EXISTS (SELECT 1 FROM events e WHERE e.instance_id = i.instance_id AND e.status = 'started' "
                "        AND e.phase = 'serve'), "
                "EXISTS (SELECT 1 FROM events e WHERE e.instance_id = i.instance_id AND e.status = 'done' "
                "        AND e.phase = 'serve'), "
                "(SELECT e.received_at FROM events e WHERE e.instance_id = i.instance_id ORDER BY e.at DESC "
                " LIMIT 1) "
                "FROM instances i ORDER BY i.received_at, i.instance_id").fetchall()
            out = []
            for row in rows:
                try:
                    registered = datetime.fromisoformat(row[1])
                    last = datetime.fromisoformat(row[13]) if row[13] else registered
                    destroyed = _dt(row[8])
                except (TypeError, ValueError):  # an unreadable row: the full report quarantines it
                    registered = last = datetime.min.replace(tzinfo=UTC)
                    destroyed = None
                out.append(InstanceSummary(
                    instance_id=row[0], registered_at=registered, pool=row[2], slot=row[3], machine_id=row[4],
                    host_id=row[5], gpu_name=row[6], image_digest=row[7], destroyed_at=destroyed,
                    has_result=bool(row[9]), failed=bool(row[10]), serving=bool(row[11]) and not row[12],
                    last_signal=max(last, registered)))
            return out

        return self._snapshot(body)

    def _load(self, conn: SqlConnection, instance_id: str | None,
              only: list[str] | None = None) -> list[tuple[InstanceReport, InstanceMeta]]:
        where: str = "WHERE instance_id = ?" if instance_id is not None else ""
        args: tuple[str, ...] = (instance_id,) if instance_id is not None else ()
        if only is not None:  # these instances (a chunk of at most a few hundred bound parameters)
            where, args = f"WHERE instance_id IN ({', '.join('?' for _ in only)})", tuple(only)
        instances = conn.execute(
            "SELECT instance_id, received_at, worker_at, pool, slot, machine_id, host_id, contract_id, gpu_name, "  # noqa: S608
            "image_digest, image_version, hostname, gpus, registrations, next_line_seq, ring_dropped, "
            f"worker_dropped, destroyed_at FROM instances {where} ORDER BY received_at, instance_id",
            args).fetchall()
        if not instances:
            return []
        events: dict[str, list[PhaseEvent]] = {}
        event_sql = ("SELECT instance_id, phase, status, at, received_at, exit_code, message, log_tail, details "  # noqa: S608
                     f"FROM events {where} ORDER BY id")
        unreadable: dict[str, str] = {}
        time_of = datetime.fromisoformat
        # fetchall: rows converted in one call (a driver's per-row iteration costs as much again on PostgreSQL).
        for row in conn.execute(event_sql, args).fetchall():
            try:
                # One clock: the event is placed at its arrival on the controller's clock; the worker's
                # timestamp stays as evidence (a worker with a skewed clock cannot reorder the timeline).
                event = PhaseEvent(phase=row[1], status=row[2], at=time_of(row[4]), worker_at=time_of(row[3]),
                                   exit_code=row[5], message=row[6], log_tail=tuple(_decoded(row[7])),
                                   details=_decoded(row[8]))
                events.setdefault(row[0], []).append(event)
            except (ValueError, TypeError) as exc:
                unreadable.setdefault(row[0], f"an event is unreadable: {type(exc).__name__}: {exc}")
        results: dict[str, tuple[Any, datetime]] = {}
        for row in conn.execute(f"SELECT instance_id, received_at, body FROM results {where}",  # noqa: S608
                                args).fetchall():
            try:
                results[row[0]] = (_decoded(row[2]), datetime.fromisoformat(row[1]))
            except (ValueError, TypeError) as exc:
                unreadable.setdefault(row[0], f"the result is unreadable: {type(exc).__name__}: {exc}")
        # One index-backed query per instance (last N by primary key) rather than a window over every
        # stored line: the loop reads all reports each pass, and rings hold thousands of lines each.
        tails = self._tails(conn, [row[0] for row in instances], everyone=instance_id is None and only is None)
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
    def _report_of(row: Sequence[Any], events: Mapping[str, list[PhaseEvent]],
                   results: Mapping[str, tuple[Any, datetime]], tails: Mapping[str, list[str]]
                   ) -> tuple[InstanceReport, InstanceMeta]:
        iid = row[0]
        evs = tuple(events.get(iid, ()))
        result_doc, result_received = results.get(iid, (None, None))
        registered, worker_registered = datetime.fromisoformat(row[1]), datetime.fromisoformat(row[2])
        skew = (worker_registered - registered).total_seconds()
        if evs and evs[-1].worker_at is not None:  # the latest event's (each is placed at its arrival)
            skew = (evs[-1].worker_at - evs[-1].at).total_seconds()
        result = None
        if result_doc is not None and result_received is not None:
            result = _result_from_doc(result_doc, result_received)
            if result.worker_at is not None:  # (always: the worker's own time of the result)
                skew = (result.worker_at - result.at).total_seconds()
        gpus = tuple(_decoded(row[12]))
        report = InstanceReport(
            instance_id=iid, registered_at=registered, pool=row[3], slot=row[4],
            machine_id=row[5], host_id=row[6], contract_id=row[7], gpu_name=row[8], image_digest=row[9],
            image_version=row[10], events=evs, result=result,
            log_tail=tuple(tails.get(iid, ())), dropped_log_lines=row[15] + row[16], destroyed_at=_dt(row[17]),
            clock_skew_s=round(skew, 3), gpu_probe=tuple(str(line) for line in gpus))
        meta = InstanceMeta(
            worker_registered_at=datetime.fromisoformat(row[2]), registrations=row[13], hostname=row[11],
            gpus=gpus, stored_log_lines=row[14] - row[15], ring_dropped=row[15],
            worker_dropped=row[16], event_received_at=tuple(e.at for e in evs),
            result_received_at=result_received)
        return report, meta

    def instance_count(self) -> int:
        """Cheap liveness probe for /healthz (stats() counts every log line)."""
        return int(self._snapshot(lambda conn: conn.execute("SELECT COUNT(*) FROM instances").fetchone()[0]))

    def stats(self) -> dict[str, int]:
        """Row counts per table: cheap health figures, and how tests prove a rejection stored nothing."""
        def body(conn: SqlConnection) -> dict[str, int]:
            return {table: conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]  # noqa: S608
                    for table in ("instances", "events", "results", "log_lines")}

        return self._snapshot(body)

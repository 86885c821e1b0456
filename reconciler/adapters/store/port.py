"""The store's port: what the controller API, the reconcile loop, `fleet status` and the demo use of a controller
store (`ControllerStore`), the data it returns beyond the domain's `InstanceReport`, and the errors it raises.
The adapters are `sqlite.SqliteStore` and `postgres.PostgresStore` (see the package docstring)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Literal, Protocol, TypeVar

from reconciler.domain import errors
from reconciler.domain.observations import InstanceReport, InstanceSummary

#: Lines of the ring buffer copied into InstanceReport.log_tail (evidence for verdicts).
REPORT_TAIL_LINES = 50
#: What a 503 tells a worker about when to retry while the database is unreachable (seconds).
RETRY_AFTER_S = 2

_T = TypeVar("_T")


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


class StoreUnavailable(errors.TemporaryError):
    """The database cannot be reached or refused the transaction for now (server restarting, connection lost,
    pool exhausted, SQLite busy): nothing was stored or read; retry later."""

    reason = errors.STORE_FAILED


class SqlCursor(Protocol):
    """What the shared SQL reads from a statement's cursor (sqlite3 and the PostgreSQL wrapper both give it)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class SqlConnection(Protocol):
    """The connection a write or read body gets: `?` placeholders, as sqlite3 takes them (the PostgreSQL
    adapter translates)."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> SqlCursor: ...

    def executemany(self, sql: str, parameters: Any, /) -> SqlCursor: ...


@dataclass(frozen=True)
class PreparedWrite(Generic[_T]):
    """A write whose CPU work (redaction, encoding, fingerprints) is done and whose statements are not run
    yet: `write`/`write_all` run them. A caller that stores many reports at once (the HTTP edge's group
    commit) prepares them all first, so the write transaction (and its row locks) lasts only for the statements.
    `instance_id`: the instance whose row the body locks; a batch runs its writes in that order."""

    body: Callable[[SqlConnection], _T]
    instance_id: str = ""


@dataclass(frozen=True)
class StoreChanges:
    """Which instances' reports changed since a change sequence (`ControllerStore.changes_since`)."""

    #: The change sequence this answer is complete up to: every write at or below it is in `instance_ids` (if
    #: newer than the `since` asked with); pass it as `since` next time.
    sequence: int
    #: The instances whose reports were written to after `since` and at or before `sequence`, in order of first
    #: registration.
    instance_ids: tuple[str, ...]
    #: `instance_ids` is every instance in the store (asked with `since` 0, or with a sequence this store never
    #: reached: another store's, e.g. before `fleet db copy`): replace what you hold rather than merge into it.
    complete: bool


class ControllerStore(Protocol):
    """The port: what the controller API, the reconcile loop, `fleet status` and the demo use of the store."""

    ring_lines: int
    clock: Callable[[], datetime]
    #: Where the store is, safe to show (a path, or a URI without its password).
    location: str
    #: The database is another process reached over a socket (a write waits on round trips), not in-process.
    remote: bool

    def prepare_register(self, instance_id: str, doc: Mapping[str, Any]
                         ) -> PreparedWrite[Literal["registered", "already-registered"]]: ...

    def prepare_event(self, instance_id: str, doc: Mapping[str, Any]
                      ) -> PreparedWrite[Literal["stored", "duplicate"]]: ...

    def prepare_events(self, instance_id: str, docs: Sequence[Mapping[str, Any]]
                       ) -> PreparedWrite[list[Literal["stored", "duplicate"]]]: ...

    def prepare_logs(self, instance_id: str, lines: Sequence[str], dropped: int = 0) -> PreparedWrite[int]: ...

    def prepare_result(self, instance_id: str, doc: Mapping[str, Any]
                       ) -> PreparedWrite[Literal["stored", "duplicate"]]: ...

    def write(self, prepared: PreparedWrite[_T]) -> _T: ...

    def write_all(self, prepared: Sequence[PreparedWrite[Any]]) -> list[tuple[BaseException | None, Any]]: ...

    def register(self, instance_id: str, doc: Mapping[str, Any]) -> Literal["registered", "already-registered"]: ...

    def add_event(self, instance_id: str, doc: Mapping[str, Any]) -> Literal["stored", "duplicate"]: ...

    def add_events(self, instance_id: str, docs: Sequence[Mapping[str, Any]]
                   ) -> list[Literal["stored", "duplicate"]]: ...

    def add_logs(self, instance_id: str, lines: Sequence[str], dropped: int = 0) -> int: ...

    def set_result(self, instance_id: str, doc: Mapping[str, Any]) -> Literal["stored", "duplicate"]: ...

    def mark_destroyed(self, instance_id: str, now: datetime) -> bool: ...

    def set_directives(self, directives: Mapping[str, Mapping[str, Any]], now: datetime, *,
                       fence: Callable[[SqlConnection], None] | None = None) -> int: ...

    def directive(self, instance_id: str) -> dict[str, Any] | None: ...

    def create_session(self, id_hash: str, token_fp: str, now: datetime, expires_at: datetime) -> None: ...

    def session(self, id_hash: str, now: datetime) -> str | None: ...

    def revoke_session(self, id_hash: str) -> bool: ...

    def revoke_sessions(self) -> int: ...

    def tail(self, instance_id: str, n: int) -> list[str]: ...

    def log_rings(self, instance_ids: Sequence[str]) -> dict[str, tuple[str, ...]]: ...

    def log_view(self, instance_id: str, n: int) -> LogView | None: ...

    def report(self, instance_id: str) -> InstanceReport | None: ...

    def detail(self, instance_id: str) -> tuple[InstanceReport, InstanceMeta] | None: ...

    def reports(self, include_destroyed: bool = True) -> list[InstanceReport]: ...

    def reports_of(self, instance_ids: Sequence[str]) -> list[InstanceReport]: ...

    def changes_since(self, since: int) -> StoreChanges:
        """The instances whose reports changed since change sequence `since`, and the sequence to ask from next
        time: what lets a pass read only what changed (`reports_of(changes.instance_ids)`) and keep the rest in
        memory.

        Every committed write moves the store's change sequence forward and marks what it wrote: a
        registration, an event or an event batch, a result, a log batch, a destroyed mark (the instance), a
        changed directive (the directive row only: the pass wrote it and knows it, so its own directives do not
        send it back to read those instances). A write that was accepted but changed nothing (a worker's
        resend) may name its instance again: read twice, harmless. The sequence only grows and no write is
        ever missed: a write committed after this answer has a sequence above `sequence`, on SQLite and on
        PostgreSQL with several replicas writing at once (taken at commit, in commit order; see
        `sql.SqlStore._sequence_changes`). One read, one snapshot. Use: `since` 0 (a new leader, a restart)
        answers every instance (`complete`); then pass the answer's `sequence` back each pass. Reading the
        reports in a later snapshot is safe: they are at least as new as the answer, and anything written
        after `sequence` is answered again next time (read twice, never missed)."""
        ...

    def instance_summaries(self) -> list[InstanceSummary]: ...

    def instance_count(self) -> int: ...

    def stats(self) -> dict[str, int]: ...

    def close(self) -> None: ...

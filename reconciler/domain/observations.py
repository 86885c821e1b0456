"""What the controller store knows about each worker, as plain frozen data.

The contract between the controller (writer: `adapters/store`, fed by workers over the protocol in
`fleet-spec/schema/worker-protocol.v1.schema.json`) and everything that reads it (the loop's `decide`,
`verdict.py`, `fleet status`). Pure data plus time helpers; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from reconciler.domain.quick_init import quick_init

PHASES = ("register", "tunnel", "params", "daemon", "warmup", "benchmark", "report", "serve")
EVENT_STATUSES = ("started", "progress", "done", "failed")
OUTCOMES = ("completed", "error", "timeout")


def parse_time(text: str) -> datetime:
    """RFC 3339 -> aware UTC datetime. Raises ValueError on anything else."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError(f"time {text!r} has no timezone")
    return value.astimezone(UTC)


def format_time(value: datetime) -> str:
    """Aware datetime -> `2026-12-02T18:00:00Z` (seconds precision, UTC)."""
    return value.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


@quick_init
@dataclass(frozen=True)
class PhaseEvent:
    phase: str
    status: str
    at: datetime
    exit_code: int | None = None
    message: str | None = None
    log_tail: tuple[str, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)
    #: The worker's own timestamp, kept as evidence. `at` is the controller's clock (when the event arrived)
    #: for reports loaded from the store: one clock orders the timeline and measures durations.
    worker_at: datetime | None = None


#: cuzk-bench's per-proof labels (curio extern/cuzk/cuzk-bench/src/main.rs:1015-1023 status_label).
PROOF_LABELS = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "UNKNOWN")


@quick_init
@dataclass(frozen=True)
class ProofResult:
    """One proof of a benchmark batch: cuzk-bench's `  [i/N] LABEL — 12.3s (prove=... ms, queue=... ms)`,
    plus, when the worker found it, the failure reason from the daemon's log (cuzk-bench never prints it)."""

    index: int
    label: str
    seconds: float | None = None
    reason: str | None = None


@quick_init
@dataclass(frozen=True)
class BenchmarkResult:
    outcome: str
    at: datetime
    requested: int
    completed: int
    failed: int
    started_at: datetime | None = None
    exit_code: int | None = None
    proofs_per_hour: float | None = None
    seconds_per_proof: float | None = None
    proof_type: str | None = None
    concurrency: int | None = None
    image_digest: str | None = None
    log_tail: tuple[str, ...] = ()
    #: Additive (protocol additions of issue 13): per-proof results and the daemon's filtered log. Empty when
    #: an older worker sent the result; the judge then reads the labels from the bench output in `log_tail`
    #: and the daemon's lines (`cuzk-daemon: ...`) from the instance's log ring.
    proofs: tuple[ProofResult, ...] = ()
    daemon_log: tuple[str, ...] = ()
    #: The worker's own `at` (evidence); `at` and `started_at` are on the controller's clock when loaded from
    #: the store (`started_at` moved by the skew the worker had when it sent the result).
    worker_at: datetime | None = None


class InstanceSummary(NamedTuple):
    """An instance in the few columns the views triage by (the store answers these without its events):
    which instances need the operator, and how many of each kind the rest are. A tuple: 10,000 are made per
    view (a frozen dataclass's __init__ costs several times more)."""

    instance_id: str
    registered_at: datetime
    pool: str | None
    slot: str | None
    machine_id: str | None
    host_id: str | None
    gpu_name: str | None
    image_digest: str | None
    destroyed_at: datetime | None
    has_result: bool  # the benchmark result arrived
    failed: bool  # some phase reported failure
    serving: bool  # serving started and not stopped
    last_signal: datetime  # the newest event's arrival (registration if none)


@quick_init
@dataclass(frozen=True)
class InstanceReport:
    """Everything one worker told the controller, in arrival order."""

    instance_id: str
    registered_at: datetime
    pool: str | None = None
    slot: str | None = None
    machine_id: str | None = None
    host_id: str | None = None
    contract_id: str | None = None
    gpu_name: str | None = None
    image_digest: str | None = None
    image_version: str | None = None
    events: tuple[PhaseEvent, ...] = ()
    result: BenchmarkResult | None = None
    log_tail: tuple[str, ...] = ()
    dropped_log_lines: int = 0
    destroyed_at: datetime | None = None
    #: Why this report cannot be judged (unreadable stored data, an identifier that is not valid): it is
    #: quarantined, shown with this reason, and never stops the judging of the others.
    quarantine: str | None = None
    #: The worker's clock minus the controller's, in seconds, at its latest report (None: unknown). Shown
    #: with the timeline; the timeline itself is on the controller's clock.
    clock_skew_s: float | None = None
    #: The register body's GPU probe (`gpus`): nvidia-smi's answer at boot, one line per GPU, or its error
    #: output when it failed (`Failed to initialize NVML: Driver/library version mismatch`): evidence too.
    gpu_probe: tuple[str, ...] = ()

    def first(self, phase: str, status: str) -> PhaseEvent | None:
        return next((e for e in self.events if e.phase == phase and e.status == status), None)

    def failure(self) -> PhaseEvent | None:
        """The first failed phase event, if any: the worker's own account of what broke."""
        return next((e for e in self.events if e.status == "failed"), None)

    def phase_times(self) -> dict[str, datetime]:
        """Lifecycle timeline: `<phase>-<status>` -> first time seen (registered, params-done, ...)."""
        out: dict[str, datetime] = {"registered": self.registered_at}
        for e in self.events:
            out.setdefault(f"{e.phase}-{e.status}", e.at)
        if self.result is not None:
            out.setdefault("result", self.result.at)
        if self.destroyed_at is not None:
            out.setdefault("destroyed", self.destroyed_at)
        return out

"""Fleet spec as frozen dataclasses: what every flow reads once the spec file is loaded.

Pure data (no YAML, no schema library): `reconciler.adapters.spec_files` loads and validates the file
into these; the planner, the judge and the renderers only ever see these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from reconciler.domain import errors
from reconciler.domain.gpus import GPU_PRIOR_PROOFS_PER_HOUR
from reconciler.domain.hosts import HostSelector, OwnedHost
from reconciler.domain.quick_init import quick_init


@dataclass(frozen=True)
class SpecProblem:
    """One thing wrong with a spec file. `severity` is "error" (spec rejected) or "warning"."""

    file: str
    json_path: str
    message: str
    line: int | None = None
    severity: str = "error"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.severity}: {self.json_path}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "path": self.json_path,
                "severity": self.severity, "message": self.message}


class SpecError(errors.PermanentError):
    """The spec cannot be used. Permanent: retrying will not help until a human edits the file."""

    reason = errors.SPEC_INVALID

    def __init__(self, problems: list[SpecProblem]):
        self.problems = problems
        blocking = [p for p in problems if p.severity == "error"]
        super().__init__(f"{len(blocking)} problem(s) in fleet spec:\n" + "\n".join(str(p) for p in blocking))


@dataclass(frozen=True)
class BenchmarkSettings:
    proof_type: str = "porep"
    proofs: int = 10
    concurrency: int = 2
    timeout_minutes: float = 120.0
    after: str = "serve"
    #: cuzk-daemon's memory budget; None: the worker sizes it from the container's memory limit.
    memory_budget_gib: int | None = None
    #: cuzk-bench --miner-id / --sector-num: must match the c1.json (None: the worker reads its SectorNum).
    miner_id: int = 1000
    sector_num: int | None = None

    @property
    def timeout_seconds(self) -> float:
        return self.timeout_minutes * 60.0


#: curio's harmony task names (`harmony_task.name`) of the GPU proof tasks a cuzk worker serves, from
#: filecoin-project/curio tasks/tasknames/names.go at e0294b0f948132d41e8f42f59fa949495d5fd3af: PoRep (C2 of
#: the sealing pipeline, tasks/seal/task_porep.go), UpdateProve (SnapDeals, tasks/snap/task_prove.go), WdPost
#: and WinPost (tasks/window/compute_task.go, tasks/winning/winning_task.go). The Snark Market's PSProve is not
#: the operator's demand: a pool takes it under `queue.market`, by its price (MARKET_TASK_TYPES).
PROOF_TASK_TYPES: tuple[str, ...] = ("PoRep", "UpdateProve", "WdPost", "WinPost")

#: The task type a pool's benchmark proof type stands for (the queue's default when no task_types are given).
TASK_TYPE_OF_PROOF: Mapping[str, str] = {"porep": "PoRep", "snap": "UpdateProve", "window": "WdPost",
                                          "winning": "WinPost"}


@dataclass(frozen=True)
class ScalingSettings:
    """How an autoscaled pool (`count: {min, max}`) follows demand (domain/capacity.py)."""

    target_utilization: float = 0.8  # busy time / wall time the pool aims at
    scale_up_after_minutes: float = 10.0  # demand above target this long (window) before renting more
    scale_down_after_minutes: float = 30.0  # idle below target this long (window) before draining
    cooldown_minutes: float = 15.0  # no change at all this long after a change (no flapping)
    cold_start_minutes: float = 15.0  # params + benchmark before a new machine serves: size for demand then


#: curio's Snark Market ("proofshare") task a provider cluster runs for the market (tasks/proofshare/task_prove.go
#: TypeDetails: tasknames.PSProve), at filecoin-project/curio e0294b0f948132d41e8f42f59fa949495d5fd3af.
MARKET_TASK_TYPES: tuple[str, ...] = ("PSProve",)


@dataclass(frozen=True)
class MarketSource:
    """Snark Market work a pool takes by its price (`queue.market`): counted as demand only while what the market
    pays per proof exceeds the pool's own $/proof by `min_margin`; never the operator's own demand."""

    usd_per_fil: float  # the exchange rate the operator prices FIL at (curio's payments are in attoFIL)
    task_types: tuple[str, ...] = MARKET_TASK_TYPES
    min_margin: float = 0.2  # revenue must exceed cost by this fraction of the cost
    #: curio's docs (documentation/en/experimental-features/Snark-Market.md): "Proofs must complete within 45
    #: minutes, or your node will lose its active slot and need to re-earn trust".
    deadline_minutes: float = 45.0
    deadline_misses: int = 2  # missed deadlines on one machine within `window_hours` that make a verdict
    window_hours: float = 24.0  # payments and misses counted over this window


@dataclass(frozen=True)
class QueueSource:
    """curio's task queue, read over the PostgreSQL protocol (YugabyteDB YSQL) with a read-only role."""

    url_env: str  # the environment variable holding postgresql://role:password@host:port/db (a secret)
    task_types: tuple[str, ...] = ("PoRep",)
    market: MarketSource | None = None


@dataclass(frozen=True)
class PoolSpec:
    name: str
    gpu_name: str
    #: Slots the pool has now: the spec's integer count, or, for an autoscaled pool, the slots the leader's
    #: fleet-spec/capacity.yaml keeps within [min_count, max_count] (draining ones included).
    count: int
    min_rate_proofs_per_hour: float
    max_price_usd_per_hour: float
    gpus_per_instance: int = 1
    min_reliability: float = 0.95
    min_inet_down_mbps: float = 200.0
    disk_gb: int = 200
    min_host_ram_gb: int = 128
    min_cuda: float = 12.0
    verified_only: bool = True
    benchmark: BenchmarkSettings = field(default_factory=BenchmarkSettings)
    #: Bounds of an autoscaled pool (`count: {min, max}`); None for an integer count (min = max = count).
    min_count: int | None = None
    max_count: int | None = None
    scaling: ScalingSettings | None = None
    queue: QueueSource | None = None
    #: Slot indices from capacity.yaml (None: 0..count-1). Draining slots finish their proofs, then go.
    slot_indices: tuple[int, ...] | None = None
    draining: tuple[str, ...] = ()
    #: What capacity.yaml says the leader wants (None: no decision yet); count - desired slots are draining.
    desired_count: int | None = None
    #: Set: the pool runs on owned Docker hosts (fleet-spec/hosts.yaml) picked by GPU model and these labels,
    #: one GPU per slot; None: it rents from the marketplace.
    hosts: HostSelector | None = None

    @property
    def autoscaled(self) -> bool:
        return self.min_count is not None and self.max_count is not None and self.min_count < self.max_count

    @property
    def bounds(self) -> tuple[int, int]:
        if self.min_count is None or self.max_count is None:
            return self.count, self.count
        return self.min_count, self.max_count

    def slot_names(self) -> list[str]:
        indices = self.slot_indices if self.slot_indices is not None else range(self.count)
        return [f"{self.name}-{i}" for i in indices]


@dataclass(frozen=True)
class ImageSettings:
    repository: str
    context: str = "worker-image"
    base_image: str | None = None
    platform: str = "linux/amd64"


@dataclass(frozen=True)
class ControllerSettings:
    url: str
    log_ring_lines: int = 5000


@dataclass(frozen=True)
class ParamsSettings:
    sector_size: str = "32GiB"
    base_url: str | None = None
    fetch_timeout_minutes: float = 60.0


@dataclass(frozen=True)
class CircuitBreakerSettings:
    distinct_machines: int = 2
    window_hours: float = 24.0


@dataclass(frozen=True)
class KillBudgetSettings:
    max_fraction: float = 0.2
    min_machines: int = 1
    window_hours: float = 24.0

    def allowed(self, pool_count: int) -> int:
        """Machines of a pool of `pool_count` slots that may be marked bad within one window."""
        return max(self.min_machines, math.floor(self.max_fraction * pool_count))


@dataclass(frozen=True)
class ServingSettings:
    """After admission: how serving machines are watched (heartbeats) and judged (degraded, lost)."""

    heartbeat_minutes: float = 5.0  # told to workers in the directive; they report this often
    window_minutes: float = 60.0  # rolling-rate window
    degraded_after_minutes: float = 30.0  # the rate must stay below for this long (hysteresis in time)
    degraded_margin: float = 0.1  # ... and below min * (1 - margin) (hysteresis in rate)
    min_proofs: int = 5  # expected proofs at the pool minimum over the busy time of a window to judge it
    lost_after_minutes: float = 20.0  # no heartbeat for this long -> lost
    verdict_wait_minutes: float = 30.0  # how long a worker waits for its verdict before serving anyway


@dataclass(frozen=True)
class EarlyVerdictSettings:
    """End a benchmark once even its best case cannot reach the pool minimum."""

    enabled: bool = True
    warmup_proofs: int = 1  # the first proof loads SRS/PCE: never used as a speed sample
    #: Measured proofs after the warm-up before an early verdict: one sample is the seed's mistake in a new place
    #: (a good machine killed on one slow proof, issue 29 item 5).
    min_measured_proofs: int = 3


@dataclass(frozen=True)
class RetestSettings:
    """An unknown failure no correlation decides is benchmarked once more on the same machine (issue 29)."""

    enabled: bool = True
    max_per_pool: int = 2  # machines of one pool held for a retest within the window
    window_hours: float = 24.0  # a retest is due this long after the failure; one per machine within it


#: Hours until a bad record expires into probation, by blame (None: never). Network and marketplace faults
#: pass; a machine's own hardware fault much less so.
DEFAULT_EXPIRY_HOURS: Mapping[str, float | None] = {
    "network": 24.0, "marketplace": 24.0, "configuration": 72.0, "params": 24.0, "unknown": 168.0,
    "machine": 720.0, "image": None, "none": None,
}


@dataclass(frozen=True)
class RecordExpirySettings:
    """Bad records expire by blame class (or signature) into probation; a second failure is permanent."""

    hours_by_blame: Mapping[str, float | None] = field(default_factory=lambda: dict(DEFAULT_EXPIRY_HOURS))
    hours_by_signature: Mapping[str, float | None] = field(default_factory=dict)
    probation_hours: float = 720.0  # a failure within this long after an expiry makes the record permanent

    def hours_for(self, blame: str, signature: str | None) -> float | None:
        if signature is not None and signature in self.hours_by_signature:
            return self.hours_by_signature[signature]
        return self.hours_by_blame.get(blame, DEFAULT_EXPIRY_HOURS.get(blame))


@dataclass(frozen=True)
class WebhookSettings:
    """A webhook target named in the spec; its URL is read from the environment variable `url_env` (a secret)."""

    name: str
    url_env: str
    format: str = "generic"
    events: tuple[str, ...] = ()  # empty: every kind


@dataclass(frozen=True)
class NotificationSettings:
    webhooks: tuple[WebhookSettings, ...] = ()


@quick_init
@dataclass(frozen=True)
class FleetSpec:
    image: ImageSettings
    controller: ControllerSettings
    pools: tuple[PoolSpec, ...]
    params: ParamsSettings = field(default_factory=ParamsSettings)
    circuit_breaker: CircuitBreakerSettings = field(default_factory=CircuitBreakerSettings)
    kill_budget: KillBudgetSettings = field(default_factory=KillBudgetSettings)
    serving: ServingSettings = field(default_factory=ServingSettings)
    early_verdict: EarlyVerdictSettings = field(default_factory=EarlyVerdictSettings)
    retest: RetestSettings = field(default_factory=RetestSettings)
    record_expiry: RecordExpirySettings = field(default_factory=RecordExpirySettings)
    gpu_priors: Mapping[str, float] = field(default_factory=dict)
    #: The fleet's name: its marketplace labels are `gpu-fleet/<name>/<instance id>` (see label_prefix).
    name: str = "main"
    #: Fleet spend cap, $/hour over all pools (None: no cap).
    max_total_dph: float | None = None
    notifications: NotificationSettings = field(default_factory=NotificationSettings)
    #: Owned Docker hosts (fleet-spec/hosts.yaml beside the spec; empty without that file).
    hosts: tuple[OwnedHost, ...] = ()
    source: str = "<memory>"
    warnings: tuple[SpecProblem, ...] = ()

    @property
    def label_prefix(self) -> str:
        """Every instance this fleet rents carries a label starting with this; nothing else is ours."""
        return fleet_label_prefix(self.name)

    def pool(self, name: str) -> PoolSpec:
        found = self._pools_by_name.get(name)
        if found is None:
            raise KeyError(name)
        return found

    @cached_property
    def _pools_by_name(self) -> dict[str, PoolSpec]:
        """Each pool by name (the first of a name): `pool` is asked per verdict and per pass, a what-if replay's
        ~100,000 times, and a walk over a fleet's 40 pools cost more than the look-up."""
        by_name: dict[str, PoolSpec] = {}
        for p in self.pools:
            by_name.setdefault(p.name, p)
        return by_name

    def find_pool(self, name: str | None) -> PoolSpec | None:
        """The pool of that name; None without a name or when this spec has none of it (a report or record of a
        pool removed since, or of one another version of the spec had)."""
        try:
            return self.pool(name) if name else None
        except KeyError:
            return None

    def prior_proofs_per_hour(self, gpu_name: str) -> float | None:
        return self.gpu_priors.get(gpu_name, GPU_PRIOR_PROOFS_PER_HOUR.get(gpu_name))


def fleet_label_prefix(name: str) -> str:
    return f"gpu-fleet/{name}/"

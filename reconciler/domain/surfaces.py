"""What the operator surfaces show beyond the status view: each pool's output and spend against its SLO, the
recent audit trail, orphans. Pure: status view + spec + records (+ prices when the provisioner's state is at
hand) in, frozen data out. The live page, `/metrics` and the static export all read these, never the stores.

Proofs/h of a pool: the sum of the measured rates of its instances that are alive and passed their benchmark
(an instance still benchmarking has no rate yet, so a pool that is filling up shows below its SLO, which it
is). $/h of a pool: the sum of the prices of its alive instances; the price of an instance comes from the
provisioner's slot state when given, else from the benchmark record of that instance, else from the latest
price recorded for its machine; instances with no known price are counted in `unpriced`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from reconciler.domain.observations import InstanceSummary
from reconciler.domain.records import MachineRecord, RecordedVerdict, RecordSet
from reconciler.domain.spec import FleetSpec
from reconciler.domain.status import FleetStatus, InstanceStatus, Triage

ALIVE_STATES = frozenset({"benchmarking", "ok", "failed", "serving", "degraded"})
PRODUCING_STATES = frozenset({"ok", "serving"})


@dataclass(frozen=True)
class PoolEconomics:
    pool: str
    desired: int
    proofs_per_hour: float
    slo_proofs_per_hour: float  # desired x min rate: what the operator asked for
    usd_per_hour: float
    cap_usd_per_hour: float  # desired x max price: the most the pool may cost
    producing: int  # alive instances that passed their benchmark
    unpriced: int  # alive instances with no known price (not in usd_per_hour)
    serving: int = 0  # alive instances admitted and serving (heartbeats), not only benchmarked

    @property
    def meets_slo(self) -> bool:
        return self.proofs_per_hour >= self.slo_proofs_per_hour

    @property
    def within_cap(self) -> bool:
        return self.usd_per_hour <= self.cap_usd_per_hour + 1e-9

    @property
    def usd_per_proof(self) -> float | None:
        return self.usd_per_hour / self.proofs_per_hour if self.proofs_per_hour > 0 else None


@dataclass(frozen=True)
class CommitLine:
    """One commit of the fleet repo as the page lists it (newest first)."""

    sha: str
    at: str
    author: str
    summary: str


@dataclass(frozen=True)
class Orphan:
    """An instance the marketplace bills us for that no slot owns (found by the provisioner's sweep)."""

    instance_id: str
    label: str | None
    state: str  # "found" / "destroyed"
    detail: str = ""


@dataclass(frozen=True)
class MarketView:
    """What the provisioner last saw of the market beyond the slots: orphans and the fleet's spend cap."""

    orphans: tuple[Orphan, ...] = ()
    spend_cap_usd_per_hour: float | None = None
    orphans_usd_per_hour: float = 0.0
    at: str | None = None


def _instance_rates(view: FleetStatus) -> dict[str, float]:
    return {p.instance_id: p.proofs_per_hour for p in view.rates if p.proofs_per_hour is not None}


def _price(instance: InstanceStatus, records: RecordSet, prices: Mapping[str, float]) -> float | None:
    if instance.instance_id in prices:
        return prices[instance.instance_id]
    record = records.machines.get(instance.machine_id or "")
    if record is None:
        return None
    for entry in reversed(record.benchmarks):
        if entry.instance_id == instance.instance_id and entry.price_usd_per_hour is not None:
            return entry.price_usd_per_hour
    return next((e.price_usd_per_hour for e in reversed(record.benchmarks) if e.price_usd_per_hour is not None),
                None)


def pool_economics(spec: FleetSpec, records: RecordSet, view: FleetStatus,
                   prices: Mapping[str, float] | None = None) -> tuple[PoolEconomics, ...]:
    prices = prices or {}
    rates = _instance_rates(view)
    out = []
    for pool in spec.pools:
        alive = [i for i in view.instances if i.pool == pool.name and i.state in ALIVE_STATES]
        producing = [i for i in alive if i.state in PRODUCING_STATES]
        known = [(i, _price(i, records, prices)) for i in alive]
        out.append(PoolEconomics(
            pool=pool.name, desired=pool.count,
            proofs_per_hour=round(sum(rates.get(i.instance_id, 0.0) for i in producing), 3),
            slo_proofs_per_hour=pool.count * pool.min_rate_proofs_per_hour,
            usd_per_hour=round(sum(p for _, p in known if p is not None), 4),
            cap_usd_per_hour=round(pool.count * pool.max_price_usd_per_hour, 4),
            producing=len(producing), unpriced=sum(1 for _, p in known if p is None),
            serving=sum(1 for i in alive if getattr(i, "serving", None) is not None or i.state == "serving")))
    return tuple(out)


def triage_economics(spec: FleetSpec, summaries: Sequence[InstanceSummary],
                     recorded: Mapping[str, RecordedVerdict], triaged: Triage,
                     prices: Mapping[str, float] | None, last_prices: Mapping[str, float | None]
                     ) -> tuple[PoolEconomics, ...]:
    """`pool_economics` over every instance of a triaged fleet (the view shows only a page of them): rates
    and prices from the recorded verdicts (index rows), the slot state's prices and the machines' last
    recorded price, never from full reports."""
    prices = prices or {}
    sums: dict[str, list[float]] = {p.name: [0.0, 0.0, 0, 0, 0] for p in spec.pools}
    for s in summaries:
        state = triaged.states.get(s.instance_id, "destroyed")
        row = sums.get(s.pool or "")
        if row is None or state == "destroyed":
            continue
        entry = recorded.get(s.instance_id)
        if state in _TRIAGE_PRODUCING:
            row[0] += (entry.proofs_per_hour or 0.0) if entry else 0.0
            row[2] += 1
        price = prices.get(s.instance_id)
        if price is None and entry is not None:
            price = entry.price_usd_per_hour
        if price is None and s.machine_id is not None:
            price = last_prices.get(s.machine_id)
        if price is None:
            row[3] += 1
        else:
            row[1] += price
        row[4] += state in ("serving", "silent")
    return tuple(PoolEconomics(
        pool=pool.name, desired=pool.count, proofs_per_hour=round(sums[pool.name][0], 3),
        slo_proofs_per_hour=pool.count * pool.min_rate_proofs_per_hour, usd_per_hour=round(sums[pool.name][1], 4),
        cap_usd_per_hour=round(pool.count * pool.max_price_usd_per_hour, 4), producing=int(sums[pool.name][2]),
        unpriced=int(sums[pool.name][3]), serving=int(sums[pool.name][4])) for pool in spec.pools)


#: Triage states whose instances passed their benchmark and produce (silent: until the loop judges it lost).
_TRIAGE_PRODUCING = frozenset({"ok", "serving", "silent"})


def total_usd_per_hour(economics: Sequence[PoolEconomics]) -> float:
    return round(sum(e.usd_per_hour for e in economics), 4)


@dataclass(frozen=True)
class PageExtras:
    """What the status page shows beyond the status view; all optional (the static export may have none)."""

    economics: tuple[PoolEconomics, ...] = ()
    commits: tuple[CommitLine, ...] = ()
    orphans: tuple[Orphan, ...] = ()
    spend_cap_usd_per_hour: float | None = None


@dataclass(frozen=True)
class LiveSnapshot:
    """One reading of the fleet for the live page and its fragment."""

    view: FleetStatus
    extras: PageExtras
    spec_source: str | None = None


@dataclass(frozen=True)
class MetricsState:
    """What a `/metrics` scrape reads: the status view, the pools' economics, recorded verdict counts and the
    controller store's ingest counters."""

    view: FleetStatus
    economics: tuple[PoolEconomics, ...] = ()
    recorded_verdicts: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (verdict, blame) -> n
    ingested: Mapping[str, int] = field(default_factory=dict)  # kind -> reports ever stored
    market: MarketView = field(default_factory=lambda: MarketView())
    #: (pool, state) -> instances, over the whole fleet (a triaged view lists only a page of instances).
    instance_states: Mapping[tuple[str, str], int] | None = None


def recorded_verdict_counts(records: RecordSet) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for rec in records.machines.values():
        # Per record, remembered on it: the live source keeps unchanged records from load to load.
        for key, n in rec.derived("verdict_counts", _verdict_counts).items():
            counts[key] = counts.get(key, 0) + n
    return counts


def _verdict_counts(rec: MachineRecord) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for b in rec.benchmarks:
        counts[(b.verdict, b.blame)] = counts.get((b.verdict, b.blame), 0) + 1
    return counts

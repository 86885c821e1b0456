"""Fleet status as data: pools desired vs running vs benchmarking vs bad, the guards (circuit breaker, kill
budget), every instance's lifecycle timeline and the root cause of any failure in one line.

`status_view` is pure (spec, records, reports, now -> FleetStatus); `reconciler.render` lays it out as
text, JSON and HTML.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from reconciler.domain.breaker import kill_budgets
from reconciler.domain.capacity import CapacityEntry, PoolCapacityStatus, capacity_view
from reconciler.domain.observations import InstanceReport, format_time
from reconciler.domain.planner import pool_pause
from reconciler.domain.records import BenchmarkEntry, RecordSet
from reconciler.domain.serving import judge_early, saved, serving_health
from reconciler.domain.spec import FleetSpec, PoolSpec
from reconciler.domain.verdict import judge, root_cause_text

#: phase_times() keys -> the labels of the seed's dashboard timeline, in lifecycle order.
TIMELINE_LABELS = {
    "registered": "registered",
    "params-done": "params-done",
    "params-failed": "params-failed",
    "daemon-failed": "daemon-failed",
    "benchmark-started": "bench-started",
    "benchmark-done": "bench-done",
    "benchmark-failed": "bench-failed",
    "result": "result",
    "serve-started": "serving",
    "serve-failed": "serve-failed",
    "serve-done": "serve-stopped",
    "destroyed": "destroyed",
}


@dataclass(frozen=True)
class PoolStatus:
    name: str
    gpu_name: str
    desired: int
    running: int  # instances alive (registered, not destroyed)
    benchmarking: int  # alive and not judged yet
    ok: int  # alive with a passing verdict
    bad: int  # machines of this pool recorded bad
    min_rate_proofs_per_hour: float
    kill_budget_used: int
    kill_budget_allowed: int
    state: str  # "ok", "paused: ...", "image suspect: ...", "kill budget exhausted"


@dataclass(frozen=True)
class InstanceStatus:
    instance_id: str
    pool: str | None
    slot: str | None
    machine_id: str | None
    host_id: str | None
    gpu_name: str | None
    image_digest: str | None
    state: str  # benchmarking / ok / failed / destroyed ...
    timeline: tuple[tuple[str, str], ...]  # (label, RFC 3339 time) in lifecycle order
    verdict: str | None = None
    blame: str | None = None
    marks_bad: bool = False
    held_by: str | None = None
    root_cause: str | None = None
    recorded: bool = False
    serving: ServingStatus | None = None  # after admission: rolling rate vs the pool minimum, heartbeats
    standing: str | None = None  # the machine's record at `now`: ok, bad, probation, permanent, banned, ...


@dataclass(frozen=True)
class ServingStatus:
    """A serving instance: its rolling rate vs the pool minimum, its last heartbeat, its GPUs."""

    proofs_per_hour: float | None  # None while too little busy time was seen to judge
    min_rate_proofs_per_hour: float
    last_heartbeat: str | None
    heartbeat_age_s: int | None
    below_since: str | None
    gpus: tuple[Mapping[str, Any], ...] = ()
    summary: str = ""


@dataclass(frozen=True)
class SuspectStatus:
    image_digest: str
    signature: str
    pools: tuple[str, ...]
    machines: tuple[str, ...]
    tripped_at: str
    reason: str


@dataclass(frozen=True)
class RatePoint:
    """One judged benchmark of a machine in a pool; `proofs_per_hour` is None when it measured no rate."""

    pool: str
    machine_id: str
    instance_id: str
    at: str
    verdict: str
    blame: str
    proofs_per_hour: float | None
    recorded: bool


@dataclass(frozen=True)
class BadMachineStatus:
    """A machine recorded bad, with the verdict that made it bad (the newest one that marked it)."""

    machine_id: str
    host_id: str | None
    gpu_name: str | None
    pool: str | None
    verdict: str | None  # None: set bad by a human edit, no verdict marked it
    blame: str | None
    reason: str
    at: str | None
    standing: str = "bad"  # bad | permanent | probation | banned (at the status time)
    standing_detail: str = ""
    expires_at: str | None = None


@dataclass(frozen=True)
class MarketStatus:
    """The marketplace as the last `fleet apply` saw it: spend against the cap, orphans with their $/h."""

    fleet: str
    label_prefix: str
    at: str
    slots_usd_per_hour: float
    orphans_usd_per_hour: float
    max_total_dph: float | None
    orphans: tuple[Mapping[str, Any], ...] = ()
    #: The market asked the last apply to wait (a 429 with a long Retry-After): {"until": time, "why": text}.
    wait: Mapping[str, Any] | None = None

    @property
    def spend_usd_per_hour(self) -> float:
        return self.slots_usd_per_hour + self.orphans_usd_per_hour

    def cap_line(self) -> str:
        spend = f"${self.spend_usd_per_hour:.2f}/h (slots ${self.slots_usd_per_hour:.2f}/h + orphans " \
                f"${self.orphans_usd_per_hour:.2f}/h)"
        if self.max_total_dph is None:
            return f"spend {spend}; no fleet spend cap (max_total_dph)"
        room = self.max_total_dph - self.spend_usd_per_hour
        state = (f"${room:.2f}/h left" if room > 0 else "AT THE CAP: new slots are held until spend drops")
        return f"spend {spend} of the fleet spend cap ${self.max_total_dph:.2f}/h: {state}"

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> MarketStatus:
        cap = doc.get("max_total_dph")
        return cls(fleet=str(doc.get("fleet", "?")), label_prefix=str(doc.get("label_prefix", "?")),
                   at=str(doc.get("at", "?")), slots_usd_per_hour=float(doc.get("slots_usd_per_hour") or 0.0),
                   orphans_usd_per_hour=float(doc.get("orphans_usd_per_hour") or 0.0),
                   max_total_dph=float(cap) if isinstance(cap, int | float) else None,
                   orphans=tuple(o for o in doc.get("orphans") or () if isinstance(o, Mapping)),
                   wait=doc.get("market_wait") if isinstance(doc.get("market_wait"), Mapping) else None)


@dataclass(frozen=True)
class FleetStatus:
    at: str
    pools: tuple[PoolStatus, ...]
    instances: tuple[InstanceStatus, ...]
    suspects: tuple[SuspectStatus, ...]
    record_problems: tuple[str, ...] = ()
    last_pass: Mapping[str, Any] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)  # problems met while observing (spec, store)
    rates: tuple[RatePoint, ...] = ()
    bad_machines: tuple[BadMachineStatus, ...] = ()
    desired_image_digest: str | None = None
    early_saved_minutes: float = 0.0  # benchmark time early verdicts saved (all records)
    early_saved_usd_at_most: float = 0.0
    market: MarketStatus | None = None  # with `fleet status --state-dir`: the last apply's view of the market
    capacity: tuple[PoolCapacityStatus, ...] = ()  # autoscaled pools (count: {min, max})

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        # The root cause first (issue 14): a reader of the JSON sees why before what.
        out["instances"] = [{"root_cause": i.root_cause, **asdict(i), "timeline": dict(i.timeline)}
                            for i in self.instances]
        return out


def _recorded_entries(records: RecordSet, reports: Sequence[InstanceReport]) -> dict[str, tuple[str, BenchmarkEntry]]:
    """The recorded entry of each reported instance. A verdict is recorded in the record of the report's own
    machine (decide writes it there), so only those records are read, not the whole fleet's."""
    wanted = {r.instance_id for r in reports}
    out: dict[str, tuple[str, BenchmarkEntry]] = {}
    for rec in records.records_of(sorted({r.machine_id for r in reports if r.machine_id is not None})):
        for entry in rec.benchmarks:
            if entry.instance_id in wanted:
                out[entry.instance_id] = (rec.machine_id, entry)
    return out


def _root_cause(entry: BenchmarkEntry) -> str:
    setting = entry.evidence.get("setting") if isinstance(entry.evidence, Mapping) else None
    return root_cause_text(entry.reason, entry.blame, entry.held_by, setting if isinstance(setting, str) else None)


def _recorded_rates(records: RecordSet) -> list[RatePoint]:
    return [RatePoint(entry.pool, rec.machine_id, entry.instance_id, entry.at, entry.verdict, entry.blame,
                      entry.proofs_per_hour, True)
            for rec in records.machines.values() for entry in rec.benchmarks if entry.pool is not None]


def _bad_machines(records: RecordSet, now: datetime) -> tuple[BadMachineStatus, ...]:
    """Machines recorded bad or banned, with where they stand now (an expired bad record: probation)."""
    out = []
    for bad, standing in records.standings(now):
        if standing.state == "ok":
            continue  # recorded bad once, past its probation now: nothing to show
        marking = bad.marking
        if marking is None:
            out.append(BadMachineStatus(bad.machine_id, bad.host_id, bad.gpu_name, None, None, None,
                                        bad.note or f"marked {bad.status} by hand (no verdict marked it)", None,
                                        standing.state, standing.detail))
        else:
            out.append(BadMachineStatus(bad.machine_id, bad.host_id, bad.gpu_name, marking.pool, marking.verdict,
                                        marking.blame, marking.reason, marking.at, standing.state,
                                        standing.detail, marking.expires_at))
    return tuple(out)


def _serving_status(report: InstanceReport, pool: PoolSpec, spec: FleetSpec, now: datetime) -> ServingStatus | None:
    if report.first("serve", "started") is None:
        return None
    health = serving_health(report, pool, spec.serving)
    last = health.last_heartbeat
    return ServingStatus(
        proofs_per_hour=None if health.proofs_per_hour is None else round(health.proofs_per_hour, 2),
        min_rate_proofs_per_hour=pool.min_rate_proofs_per_hour,
        last_heartbeat=format_time(last) if last else None,
        heartbeat_age_s=int((now - last).total_seconds()) if last else None,
        below_since=format_time(health.below_since) if health.below_since else None,
        gpus=tuple(dict(g) for g in health.gpus), summary=health.describe(now))


def status_view(spec: FleetSpec, records: RecordSet, reports: Iterable[InstanceReport], now: datetime, *,
                desired_image_digest: str | None = None, last_pass: Mapping[str, Any] | None = None,
                notes: Sequence[str] = (), include_rates: bool = True,
                market: MarketStatus | None = None,
                capacity_entries: Mapping[str, CapacityEntry] | None = None) -> FleetStatus:
    """`include_rates=False`: leave out the recorded rate points (every stored result: the charts of the
    HTML page and the JSON need them, the text view does not; at 100,000 results they are most of the work)."""
    reports = sorted(reports, key=lambda r: (r.registered_at, r.instance_id))
    recorded = _recorded_entries(records, reports)
    pools_by_name = {p.name: p for p in spec.pools}
    instances: list[InstanceStatus] = []
    rates = _recorded_rates(records) if include_rates else []
    for report in reports:
        times = report.phase_times()
        # Lifecycle order, not time order: registration is stamped by the controller's clock, phases by
        # the worker's, and a skewed worker clock must not make "registered" look like the last step.
        timeline = tuple((label, format_time(times[key])) for key, label in TIMELINE_LABELS.items() if key in times)
        verdict = blame = held_by = cause = None
        marks_bad = is_recorded = False
        if report.instance_id in recorded:
            _, entry = recorded[report.instance_id]
            verdict, blame, held_by, marks_bad, is_recorded = (entry.verdict, entry.blame, entry.held_by,
                                                               entry.marks_bad, True)
            cause = _root_cause(entry)
        elif report.pool in pools_by_name:
            judged = judge(report, pools_by_name[report.pool], now, desired_image_digest=desired_image_digest)
            if judged is not None:
                verdict, blame, marks_bad = judged.verdict, judged.blame, judged.marks_bad
                cause = judged.root_cause() + " [not yet recorded]"
                if report.machine_id is not None and include_rates:
                    rates.append(RatePoint(report.pool, report.machine_id, report.instance_id,
                                           format_time(judged.at), judged.verdict, judged.blame,
                                           judged.proofs_per_hour, False))
        if verdict is None and report.pool in pools_by_name:
            early = judge_early(report, pools_by_name[report.pool], spec.early_verdict, now)
            if early is not None:
                verdict, blame, marks_bad = early.verdict, early.blame, early.marks_bad
                cause = early.root_cause() + " [not yet recorded]"
        serving = (_serving_status(report, pools_by_name[report.pool], spec, now)
                   if report.pool in pools_by_name and report.destroyed_at is None else None)
        machine = records.machines.get(report.machine_id) if report.machine_id else None
        if report.destroyed_at is not None:
            state = "destroyed"
        elif verdict is None:
            state = "benchmarking"
        else:
            state = "ok" if verdict == "ok" else "failed"
        instances.append(InstanceStatus(
            instance_id=report.instance_id, pool=report.pool, slot=report.slot, machine_id=report.machine_id,
            host_id=report.host_id, gpu_name=report.gpu_name, image_digest=report.image_digest, state=state,
            timeline=timeline, verdict=verdict, blame=blame, marks_bad=marks_bad, held_by=held_by,
            root_cause=cause if verdict != "ok" else None, recorded=is_recorded, serving=serving,
            standing=machine.standing(now).state if machine else None))

    budgets = kill_budgets(spec, records, now)
    suspects = records.suspect_images()
    pools = []
    # A machine the offer queries exclude counts for the pool of its last benchmark (probation: rentable, not bad).
    bad_by_pool: dict[str | None, set[str]] = {}
    for bad, standing in records.standings(now):
        if bad.last is not None and standing.excluded:
            bad_by_pool.setdefault(bad.last.pool, set()).add(bad.machine_id)
    for pool in spec.pools:
        alive = [i for i in instances if i.pool == pool.name and i.state != "destroyed"]
        bad_machines = bad_by_pool.get(pool.name, set())
        budget = budgets[pool.name]
        pause = pool_pause(pool.name, records, desired_image_digest)
        naming = [s for s in suspects.values() if pool.name in s.pools or not s.pools]
        if pause is not None:
            state = f"paused: image {pause.image_digest[:19]} suspect ({pause.signature})"
        elif naming:
            state = "image suspect: " + ", ".join(f"{s.image_digest[:19]} ({s.signature})" for s in naming)
        elif budget.exhausted:
            state = f"kill budget exhausted ({len(budget.used)}/{budget.allowed})"
        else:
            state = "ok"
        pools.append(PoolStatus(
            name=pool.name, gpu_name=pool.gpu_name, desired=pool.count, running=len(alive),
            benchmarking=sum(1 for i in alive if i.state == "benchmarking"),
            ok=sum(1 for i in alive if i.state == "ok"), bad=len(bad_machines),
            min_rate_proofs_per_hour=pool.min_rate_proofs_per_hour, kill_budget_used=len(budget.used),
            kill_budget_allowed=budget.allowed, state=state))
    # From the machines still recorded bad (their marking verdict): no need to build every record.
    saved_minutes, saved_usd = saved(b.marking for b in records.bad_machines() if b.marking is not None)
    suspect_rows = tuple(SuspectStatus(s.image_digest, s.signature, s.pools, s.machines, s.tripped_at, s.reason)
                         for s in sorted(suspects.values(), key=lambda s: s.tripped_at))
    return FleetStatus(at=format_time(now), pools=tuple(pools), instances=tuple(instances), suspects=suspect_rows,
                       record_problems=records.problems, last_pass=last_pass, notes=tuple(notes),
                       rates=tuple(sorted(rates, key=lambda r: (r.pool, r.at, r.instance_id))),
                       bad_machines=_bad_machines(records, now), desired_image_digest=desired_image_digest,
                       early_saved_minutes=round(saved_minutes, 1), early_saved_usd_at_most=round(saved_usd, 2),
                       market=market, capacity=capacity_view(spec, reports, now, capacity_entries or {}, last_pass))

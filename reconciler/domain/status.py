"""Fleet status as data: pools desired vs running vs benchmarking vs bad, the guards (circuit breaker, kill
budget), the instances that need the operator with their lifecycle timeline and the root cause of any
failure in one line.

At fleet size (10,000 instances) the views lead with what needs the operator: `triage` (pure) sorts every
instance from its summary (a few store columns, no events) and its recorded verdict (index rows, no record
parsed) into a state, counts them per pool, and picks the page of instances to show: failing, judging,
benchmarking, silent while serving, on probation (`--all`: every one, destroyed included). Only those are
loaded in full and laid out by `status_view`.

`status_view` is pure (spec, records, reports, now -> FleetStatus); `reconciler.render` lays it out as
text, JSON and HTML.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from datetime import datetime, timedelta
from typing import Any

from reconciler.domain.breaker import kill_budgets
from reconciler.domain.capacity import CapacityEntry, PoolCapacityStatus, capacity_view
from reconciler.domain.observations import InstanceReport, InstanceSummary, format_time
from reconciler.domain.planner import pool_pause
from reconciler.domain.records import BenchmarkEntry, RecordedVerdict, RecordSet
from reconciler.domain.retests import HELD_FOR_RETEST, retests_pending
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
    #: Pools whose desired image or alive instances run this digest. Empty: no pool runs it any more, so it
    #: is history (listed until cleared), not any pool's state.
    in_use_by: tuple[str, ...] = ()


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
    #: With a triage: the instances not shown because they need nothing, by state (--all shows them), how many
    #: match the query, and which page of them `instances` is.
    left_out: tuple[tuple[str, int], ...] = ()
    matching: int | None = None
    page: int = 1
    pages: int = 1
    query: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        # Field by field: `asdict` of the whole view deep-copied every bad machine and rate point (thousands
        # of flat rows at fleet size) and every instance twice. Flat rows are plain copies of their fields.
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("bad_machines", "rates"):
                out[f.name] = tuple(dict(vars(row)) for row in value)
            elif f.name == "instances":  # the root cause first (issue 14): a reader sees why before what
                out[f.name] = [{"root_cause": i.root_cause, **asdict(i), "timeline": dict(i.timeline)}
                               for i in value]
            else:
                out[f.name] = _plain(value)
        return out


def _plain(value: Any) -> Any:
    """What `asdict` makes of a field's value: nested dataclasses as dicts, tuples as tuples of those."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def _recorded_entries(records: RecordSet, reports: Sequence[InstanceReport]) -> dict[str, tuple[str, BenchmarkEntry]]:
    """The recorded entry of each reported instance. A verdict is recorded in the record of the report's own
    machine (decide writes it there), so only those records are read, not the whole fleet's."""
    wanted: dict[str, set[str]] = {}
    for r in reports:
        if r.machine_id is not None:
            wanted.setdefault(r.machine_id, set()).add(r.instance_id)
    return records.instance_entries(wanted)


def _retested(records: RecordSet, machine_id: str, entry: BenchmarkEntry) -> bool:
    """Whether the machine has an attempt judged after `entry` (its retest, or a later rental)."""
    found = records.records_of([machine_id])
    return bool(found) and any(e.at > entry.at for e in found[0].benchmarks if e.instance_id != entry.instance_id)


def _root_cause(entry: BenchmarkEntry) -> str:
    setting = entry.evidence.get("setting") if isinstance(entry.evidence, Mapping) else None
    return root_cause_text(entry.reason, entry.blame, entry.held_by, setting if isinstance(setting, str) else None)


def _recorded_rates(records: RecordSet, machine_ids: Iterable[str] | None = None) -> list[RatePoint]:
    """Every recorded rate point, or those of `machine_ids` only (a triaged view charts what it shows)."""
    recs = records.machines.values() if machine_ids is None else records.records_of(sorted(set(machine_ids)))
    return [RatePoint(entry.pool, rec.machine_id, entry.instance_id, entry.at, entry.verdict, entry.blame,
                      entry.proofs_per_hour, True)
            for rec in recs for entry in rec.benchmarks if entry.pool is not None]


def _bad_machines(records: RecordSet, now: datetime) -> tuple[BadMachineStatus, ...]:
    """Machines recorded bad or banned, with where they stand now (an expired bad record: probation)."""
    out = []
    for bad, standing in records.standings(now, passed_on_probation=True):
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


#: Instances per page of the views (`fleet status`, the live page) unless asked otherwise.
PAGE_SIZE = 50
#: Triage states (see `triage_state`); those in NEEDS_OPERATOR are shown by default.
NEEDS_OPERATOR = ("failed", "silent", "judging", "benchmarking")
#: Shown without --all as well: instances on machines that are on probation (a failure now is permanent).
PROBATION = "probation"
#: Order of the shown instances: what needs the operator most first.
_SEVERITY = {"failed": 0, "silent": 1, "judging": 2, "benchmarking": 3, PROBATION: 4, "serving": 5, "ok": 6,
             "destroyed": 7}


@dataclass(frozen=True)
class StatusQuery:
    """Which instances a view shows: by default only those that need the operator; `everything` (--all) adds
    the rest (serving, ok, destroyed). `pools`/`machines` narrow it (empty: any), `since` keeps instances
    heard from at or after that time; `per_page` instances per page (None: all on one page)."""

    everything: bool = False
    pools: frozenset[str] = frozenset()
    machines: frozenset[str] = frozenset()
    since: datetime | None = None
    page: int = 1
    per_page: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"all": self.everything, "pools": sorted(self.pools), "machines": sorted(self.machines),
                "since": None if self.since is None else format_time(self.since), "page": self.page,
                "per_page": self.per_page}


@dataclass(frozen=True)
class Triage:
    """Every instance sorted into a state; the page of instance ids to show; counts for the pools and for
    what was left out."""

    shown: tuple[str, ...]
    matching: int
    page: int
    pages: int
    left_out: tuple[tuple[str, int], ...]  # (state, count) not shown because they need nothing
    pool_counts: Mapping[str, tuple[int, int, int]]  # pool -> (running, benchmarking, ok)
    images_in_use: Mapping[str, frozenset[str]]  # pool -> digests its alive instances run
    state_counts: Mapping[tuple[str, str], int]  # (pool, state) -> instances (metrics)
    query: StatusQuery
    states: Mapping[str, str] = field(default_factory=dict)  # instance id -> triage state (every instance)


def triage_state(summary: InstanceSummary, verdict: str | None, now: datetime, lost_after: timedelta) -> str:
    """destroyed | failed (a recorded failing verdict: admission or serving) | judging (finished or failed,
    verdict not recorded yet) | benchmarking | silent (serving, no signal for longer than the lost deadline;
    the loop's next pass judges it) | serving | ok."""
    if summary.destroyed_at is not None:
        return "destroyed"
    if verdict is None:
        return "judging" if summary.has_result or summary.failed else "benchmarking"
    if verdict != "ok":
        return "failed"
    if summary.serving:
        return "silent" if now - summary.last_signal > lost_after else "serving"
    return "ok"


def triage(spec: FleetSpec, summaries: Sequence[InstanceSummary], recorded: Mapping[str, RecordedVerdict],
           standings: Mapping[str, str], now: datetime, query: StatusQuery | None = None) -> Triage:
    """Pure: every instance's state from its summary and recorded verdict (`recorded`: instance id -> its
    newest recorded verdict); `standings`: machine id -> standing for the machines not simply ok."""
    query = query or StatusQuery()
    lost_after = timedelta(minutes=spec.serving.lost_after_minutes)
    counts: dict[str, list[int]] = {p.name: [0, 0, 0] for p in spec.pools}
    in_use: dict[str, set[str]] = {}
    state_counts: dict[tuple[str, str], int] = {}
    chosen: list[tuple[int, int, str]] = []
    left_out: dict[str, int] = {}
    states: dict[str, str] = {}
    for n, summary in enumerate(summaries):
        found = recorded.get(summary.instance_id)
        state = states[summary.instance_id] = triage_state(summary, found.verdict if found else None, now,
                                                           lost_after)
        pool = summary.pool or "?"
        state_counts[(pool, state)] = state_counts.get((pool, state), 0) + 1
        if state != "destroyed":
            row = counts.get(pool)
            if row is not None:
                row[0] += 1
                row[1] += state in ("benchmarking", "judging")
                row[2] += state in ("ok", "serving", "silent")
            if summary.image_digest:
                in_use.setdefault(pool, set()).add(summary.image_digest)
        if query.pools and pool not in query.pools:
            continue
        if query.machines and summary.machine_id not in query.machines:
            continue
        if query.since is not None and summary.last_signal < query.since:
            continue
        probation = state != "destroyed" and standings.get(summary.machine_id or "") == PROBATION
        rank = min(_SEVERITY[state], _SEVERITY[PROBATION]) if probation else _SEVERITY[state]
        if state in NEEDS_OPERATOR or probation or query.everything:
            chosen.append((rank, n, summary.instance_id))
        else:
            left_out[state] = left_out.get(state, 0) + 1
    chosen.sort()
    per_page = query.per_page or max(1, len(chosen))
    pages = max(1, -(-len(chosen) // per_page))
    page = min(max(1, query.page), pages)
    shown = tuple(iid for _, _, iid in chosen[(page - 1) * per_page:page * per_page])
    return Triage(shown=shown, matching=len(chosen), page=page, pages=pages,
                  left_out=tuple(sorted(left_out.items(), key=lambda kv: _SEVERITY[kv[0]])),
                  pool_counts={k: (v[0], v[1], v[2]) for k, v in counts.items()},
                  images_in_use={k: frozenset(v) for k, v in in_use.items()}, state_counts=state_counts, query=query,
                  states=states)


def recorded_for(records: RecordSet, summaries: Iterable[InstanceSummary]) -> dict[str, RecordedVerdict]:
    """The recorded verdict of each summarised instance that is not destroyed (a destroyed one is triaged as
    destroyed whatever its verdict), from the record index's rows: no record built."""
    wanted: dict[str, set[str]] = {}
    for s in summaries:
        if s.machine_id is not None and s.destroyed_at is None:
            wanted.setdefault(s.machine_id, set()).add(s.instance_id)
    return records.instance_verdicts(wanted)


def autoscaled_instances(spec: FleetSpec, summaries: Iterable[InstanceSummary]) -> list[str]:
    """The alive instances of the autoscaled pools: their full reports feed the capacity view."""
    autoscaled = {p.name for p in spec.pools if p.min_count is not None}
    return [s.instance_id for s in summaries if s.pool in autoscaled and s.destroyed_at is None]


def machine_standings(records: RecordSet, now: datetime) -> dict[str, str]:
    """machine id -> standing at `now` of every machine recorded bad or banned (bad, permanent, probation,
    banned); the bad-machine view is indexed, so no record is built."""
    return {b.machine_id: standing.state for b, standing in records.standings(now)}


def _suspects_in_use(suspects: Collection[SuspectStatus], spec: FleetSpec, desired: str | None,
                     in_use: Mapping[str, Collection[str]]) -> tuple[SuspectStatus, ...]:
    """Each suspect with the pools that run its image: the desired image of every pool, or an image an alive
    instance of the pool reports."""
    out = []
    for s in suspects:
        pools = tuple(p.name for p in spec.pools
                      if (not s.pools or p.name in s.pools)
                      and (s.image_digest == desired or s.image_digest in in_use.get(p.name, ())))
        out.append(SuspectStatus(s.image_digest, s.signature, s.pools, s.machines, s.tripped_at, s.reason, pools))
    return tuple(out)


def status_view(spec: FleetSpec, records: RecordSet, reports: Iterable[InstanceReport], now: datetime, *,
                desired_image_digest: str | None = None, last_pass: Mapping[str, Any] | None = None,
                notes: Sequence[str] = (), include_rates: bool = True,
                market: MarketStatus | None = None,
                capacity_entries: Mapping[str, CapacityEntry] | None = None, triaged: Triage | None = None,
                standings: Mapping[str, str] | None = None,
                capacity_reports: Sequence[InstanceReport] | None = None) -> FleetStatus:
    """`include_rates=False`: leave out the recorded rate points (every stored result: the charts of the
    HTML page and the JSON need them, the text view does not; at 100,000 results they are most of the work).
    `triaged`: `reports` are the shown page of a triage, whose counts give the pools' figures (without it,
    `reports` are every instance). `standings`: `machine_standings` if already computed. `capacity_reports`:
    the reports of the autoscaled pools' instances, when `reports` are not all of them (a triaged page)."""
    if triaged is not None:  # the triage's order: what needs the operator most first
        order = {iid: n for n, iid in enumerate(triaged.shown)}
        reports = sorted(reports, key=lambda r: order.get(r.instance_id, len(order)))
    else:
        reports = sorted(reports, key=lambda r: (r.registered_at, r.instance_id))
    recorded = _recorded_entries(records, reports)
    if standings is None:
        standings = machine_standings(records, now)
    pools_by_name = {p.name: p for p in spec.pools}
    instances: list[InstanceStatus] = []
    shown_machines = None if triaged is None else [r.machine_id for r in reports if r.machine_id is not None]
    rates = _recorded_rates(records, shown_machines) if include_rates else []
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
            cause = _root_cause(entry) if entry.verdict != "ok" else None  # evidence read only for failures
            if held_by == HELD_FOR_RETEST and report.machine_id is not None:
                # Pending while the machine's newest attempt is this one and the window is open (correlation.py).
                due = retests_pending(records, spec, now, [report.machine_id]).get(report.machine_id)
                if due is None or due.instance_id != report.instance_id:
                    held_by = "retest done" if due is None and _retested(records, report.machine_id, entry) \
                        else "retest not done (the machine was not rented again in time)"
                    cause = (cause or "").replace(", retest pending)", f", {held_by})")
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
            standing=None if report.machine_id is None else standings.get(report.machine_id, "ok")))

    budgets = kill_budgets(spec, records, now)
    suspects = records.suspect_images()
    pools = []
    # A machine the offer queries exclude counts for the pool of its last benchmark (probation: rentable, not bad).
    bad_by_pool: dict[str | None, set[str]] = {}
    for bad, standing in records.standings(now):
        if bad.last is not None and standing.excluded:
            bad_by_pool.setdefault(bad.last.pool, set()).add(bad.machine_id)
    running_images: dict[str, set[str]] = {}
    for i in instances:
        if i.state != "destroyed" and i.pool and i.image_digest:
            running_images.setdefault(i.pool, set()).add(i.image_digest)
    in_use: Mapping[str, Collection[str]] = triaged.images_in_use if triaged is not None else running_images
    suspect_rows = _suspects_in_use(
        [SuspectStatus(s.image_digest, s.signature, s.pools, s.machines, s.tripped_at, s.reason)
         for s in sorted(suspects.values(), key=lambda s: s.tripped_at)], spec, desired_image_digest, in_use)
    for pool in spec.pools:
        alive = [i for i in instances if i.pool == pool.name and i.state != "destroyed"]
        bad_machines = bad_by_pool.get(pool.name, set())
        budget = budgets[pool.name]
        pause = pool_pause(pool.name, records, desired_image_digest)
        # A pool's state is about what it runs: a suspect image no instance of the pool runs (and that is not
        # its desired image) is history, listed with the suspects, not the pool's state.
        naming = [s for s in suspect_rows if pool.name in s.in_use_by]
        running, benchmarking, ok = (triaged.pool_counts.get(pool.name, (0, 0, 0)) if triaged is not None else
                                     (len(alive), sum(1 for i in alive if i.state == "benchmarking"),
                                      sum(1 for i in alive if i.state == "ok")))
        if pause is not None:
            state = f"paused: image {pause.image_digest[:19]} suspect ({pause.signature})"
        elif naming:
            state = "image suspect: " + ", ".join(f"{s.image_digest[:19]} ({s.signature})" for s in naming)
        elif budget.exhausted:
            state = f"kill budget exhausted ({len(budget.used)}/{budget.allowed})"
        else:
            state = "ok"
        pools.append(PoolStatus(
            name=pool.name, gpu_name=pool.gpu_name, desired=pool.count, running=running,
            benchmarking=benchmarking, ok=ok, bad=len(bad_machines),
            min_rate_proofs_per_hour=pool.min_rate_proofs_per_hour, kill_budget_used=len(budget.used),
            kill_budget_allowed=budget.allowed, state=state))
    # From the machines still recorded bad (their marking verdict): no need to build every record.
    saved_minutes, saved_usd = saved(b.marking for b in records.bad_machines() if b.marking is not None)
    return FleetStatus(at=format_time(now), pools=tuple(pools), instances=tuple(instances), suspects=suspect_rows,
                       record_problems=records.problems, last_pass=last_pass, notes=tuple(notes),
                       rates=tuple(sorted(rates, key=lambda r: (r.pool, r.at, r.instance_id))),
                       bad_machines=_bad_machines(records, now), desired_image_digest=desired_image_digest,
                       early_saved_minutes=round(saved_minutes, 1), early_saved_usd_at_most=round(saved_usd, 2),
                       market=market,
                       capacity=capacity_view(spec, reports if capacity_reports is None else capacity_reports, now,
                                              capacity_entries or {}, last_pass),
                       left_out=triaged.left_out if triaged else (),
                       matching=triaged.matching if triaged else None, page=triaged.page if triaged else 1,
                       pages=triaged.pages if triaged else 1, query=triaged.query.to_json() if triaged else None)

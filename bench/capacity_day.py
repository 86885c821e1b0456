"""A bursty day of proving demand through the real capacity decision and commit path, against fixed counts; the
same day with a fleet-wide outage, and with curio's Snark Market work at a price that changes.

Deterministic (seeded arrivals, an injected clock: simulated minutes, no sleeps). Every 5 minutes a pass runs
what the leader runs: `flows.judge.capacity_step` (signals from the workers' heartbeats and curio's queue ->
`domain.capacity.decide_all` -> capacity.yaml, with the demand samples of the previous passes) and, when the
file changed, `GitStore.publish` of `flows.judge.commit_request` to a real bare origin (one commit with a
`Fleet-Capacity` trailer per change). The simulated fleet obeys the result like the real one: a new slot
rents a machine that spends COLD_START minutes in params/benchmark before it serves; a draining machine
finishes the proof in progress, takes no new one, then says `serve done`, and the next pass releases its slot.

Demand: PoRep C2 tasks (one proof each, PROOF_MINUTES on one GPU) arriving as sealing pipelines fill and drain:
a low base rate and three waves that ramp up over an hour, hold, and ramp down (PoRep follows SDR and trees by
hours, so it arrives as pipelines fill, not as a step). Figures: idle GPU-hours (rented, not proving; cold
start counts as idle) and the 95th percentile of proof wait (arrival to start), for the autoscaled pool and for
fixed counts at max and at the autoscaled run's average (machines warm all day).

The outage (OUTAGE): for 40 minutes the controller hears no worker (a partition); the workers keep proving and
queue their heartbeats, which arrive together when it ends (the store stamps arrival time). No count may
shrink while the controller hears too little.

The market day: curio's Snark Market (tasks/proofshare/task_request.go: the cluster asks for work while its own
queue is idle, up to RequestQueueHighWaterMark = 8 waiting requests) always has work; what it pays per proof
follows MARKET_PAY_FIL through the day (twice the pool's $/proof at night, below it by day, 1.6x in the
evening). Machines prove the operator's own tasks first. Market-driven GPU-hours are the market day's rented
hours beyond the same day without the market; they must earn at least their cost less the pool's margin.
"""

from __future__ import annotations

import math
import random
import statistics
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from reconciler.adapters.capacity_files import load_capacity
from reconciler.adapters.git import CommitRequest, GitStore
from reconciler.adapters.spec_files import check_spec_text
from reconciler.domain.capacity import (
    HEARTBEAT_GRACE,
    SEED_LEAD_MINUTES,
    CapacityDecision,
    QueueSnapshot,
    apply_entries,
)
from reconciler.domain.judging import PassDecision
from reconciler.domain.observations import BenchmarkResult, InstanceReport, PhaseEvent
from reconciler.domain.records import RecordSet
from reconciler.domain.snark_market import ATTO_PER_FIL, MarketSnapshot
from reconciler.domain.spec import FleetSpec, QueueSource
from reconciler.flows.judge import DemandHistory, capacity_step, commit_request, read_queues

START = datetime(2026, 12, 1, 0, 0, tzinfo=UTC)
DAY_MINUTES = 24 * 60
PASS_MINUTES = 5  # the leader's pass interval and the workers' heartbeat interval
PROOF_MINUTES = 1.5  # 40 proofs/h: the pool's minimum rate
COLD_START = 15  # params + benchmark before a new machine serves
POOL = "rtx4090"

SPEC = """\
version: 1
image: {repository: ghcr.io/example/cuzk-worker}
controller: {url: http://127.0.0.1:8080}
max_total_dph: 4.0
serving: {heartbeat_minutes: 5, window_minutes: 60, lost_after_minutes: 20}
pools:
  - name: rtx4090
    gpu_name: RTX 4090
    count: {min: 1, max: 8}
    min_rate_proofs_per_hour: 40
    max_price_usd_per_hour: 0.5
    scaling: {target_utilization: 0.8, scale_up_after_minutes: 10, scale_down_after_minutes: 30,
              cooldown_minutes: 15}
    queue: {url_env: CURIO_DB_URL, task_types: [PoRep]}
"""
#: The same pool taking Snark Market work by its price: $0.50/h over 40 proofs/h = $0.0125/proof; with the 20%
#: margin a market proof must pay more than $0.015 (0.003 FIL at $5/FIL). Pay is averaged over the last hour.
MARKET_SPEC = SPEC.replace("task_types: [PoRep]}", "task_types: [PoRep],\n            market: {task_types: [PSProve], "
                           "min_margin: 0.2, usd_per_fil: 5.0, window_hours: 1}}")
USD_PER_FIL = 5.0
MARKET_HIGH_WATER = 8  # curio tasks/proofshare/task_request.go RequestQueueHighWaterMark
#: The controller hears no worker from 13:30 to 14:10 (between the second and third waves: the pool is idle then,
#: so a shrink would be due; it must wait until the fleet is heard again).
OUTAGE = (810.0, 850.0)


def market_pay_fil(minute: float) -> float:
    """What one market proof pays (FIL) at `minute`: 2x the pool's $/proof at night, 0.8x by day, 1.6x after."""
    if minute < 480:
        return 0.005
    if minute < 960:
        return 0.002
    return 0.004


def arrivals_per_hour(minute: float) -> float:
    """A low base and three waves (03:00, 10:00, 17:00): 1 h ramp up, 2 h at the peak, 1 h ramp down."""
    rate = 12.0
    for start in (180, 600, 1020):
        t = minute - start
        if 0 <= t < 60:
            rate += 200.0 * t / 60
        elif 60 <= t < 180:
            rate += 200.0
        elif 180 <= t < 240:
            rate += 200.0 * (240 - t) / 60
    return rate


def arrivals(seed: int = 7) -> list[float]:
    """Task arrival minutes over the day: a Poisson process with the rate above (thinning)."""
    rng = random.Random(seed)
    peak = 212.0 / 60.0
    out: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= DAY_MINUTES:
            return out
        if rng.random() < arrivals_per_hour(t) / 60.0 / peak:
            out.append(t)


@dataclass
class Machine:
    slot: int
    instance_id: str
    rented_at: float
    ready_at: float
    events: list[PhaseEvent] = field(default_factory=list)
    task_done_at: float | None = None  # minute the proof in progress ends (None: idle)
    market_task: bool = False  # the proof in progress is Snark Market work
    unheard: list[dict[str, object]] = field(default_factory=list)  # heartbeats queued during the outage
    draining: bool = False
    done_at: float | None = None  # stopped (drained)
    released_at: float | None = None  # the slot was released: no longer rented
    busy_minutes: float = 0.0
    completed_since_beat: int = 0
    seq: int = 0

    def report(self) -> InstanceReport:
        result = BenchmarkResult("completed", at(self.ready_at - 1), 10, 10, 0, proofs_per_hour=40.0,
                                 seconds_per_proof=90.0)
        return InstanceReport(self.instance_id, at(self.rented_at), pool=POOL, slot=f"{POOL}-{self.slot}",
                              machine_id=f"m-{self.instance_id}", gpu_name="RTX 4090", events=tuple(self.events),
                              result=result if self.ready_at <= self.now_hint else None)

    now_hint: float = 0.0


def at(minute: float) -> datetime:
    return START + timedelta(minutes=minute)


@dataclass
class DayResult:
    label: str
    rented_gpu_hours: float
    busy_gpu_hours: float
    waits: list[float]
    proofs: int
    decisions: list[tuple[float, str, str]] = field(default_factory=list)  # minute, direction, trailer
    commits: int = 0
    counts: list[int] = field(default_factory=list)  # machines rented at each pass
    drained: int = 0  # machines that finished their proofs and stopped before their slot was released
    mid_proof_stops: int = 0  # machines whose slot was released with a proof in progress (must be 0)
    market_proofs: int = 0
    market_revenue_usd: float = 0.0
    outage_changes: list[tuple[float, str, str]] = field(default_factory=list)  # changes while unheard (none)
    outage_holds: int = 0  # passes that held a count because the controller heard too little

    @property
    def idle_gpu_hours(self) -> float:
        return self.rented_gpu_hours - self.busy_gpu_hours

    @property
    def p95_wait_minutes(self) -> float:
        return statistics.quantiles(self.waits, n=100, method="inclusive")[94] if len(self.waits) > 1 else 0.0

    @property
    def average_count(self) -> float:
        return statistics.fmean(self.counts) if self.counts else 0.0

    def flaps(self, cooldown_minutes: float) -> int:
        """Direction changes that came within a cooldown of the change before (none allowed)."""
        n = 0
        for (t0, d0, _), (t1, d1, _) in zip(self.decisions, self.decisions[1:], strict=False):
            if d0 != d1 and t1 - t0 < cooldown_minutes:
                n += 1
        return n


class Fleet:
    """The simulated machines, curio's queue and (on the market day) its Snark Market, stepped minute by minute."""

    def __init__(self, tasks: list[float], *, market: bool = False, outage: tuple[float, float] | None = None):
        self.pending = deque(tasks)  # not arrived yet
        self.queue: deque[float] = deque()  # arrived, waiting (arrival minutes)
        self.machines: dict[int, Machine] = {}
        self.gone: list[Machine] = []
        self.waits: list[float] = []
        self.serial = 0
        self.market = market
        self.market_queue: deque[float] = deque()  # PSProve tasks waiting (posting minutes)
        self.payments: deque[tuple[float, float]] = deque()  # (minute, FIL) of the last hour's paid market proofs
        self.all_payments: list[tuple[float, float]] = []
        self.outage = outage

    def rent(self, slot: int, now: float, warm: bool = False) -> None:
        self.serial += 1
        iid = f"{POOL}-{slot}-{self.serial:06x}"
        ready = now if warm else now + COLD_START
        m = Machine(slot, iid, now, ready)
        m.events.append(PhaseEvent("params", "started", at(now)))
        m.events.append(PhaseEvent("benchmark", "started", at(now if warm else now + 5)))
        self.machines[slot] = m

    def release(self, slot: int, now: float) -> None:
        m = self.machines.pop(slot)
        m.released_at = now
        self.gone.append(m)

    def step(self, now: float) -> None:
        """One minute of demand and proving, [now, now + 1)."""
        while self.pending and self.pending[0] < now + 1:
            self.queue.append(self.pending.popleft())
        if self.market and not self.queue:  # ShouldHoldProofShare: ask only while the own queue is idle
            while len(self.market_queue) < MARKET_HIGH_WATER:
                self.market_queue.append(now)
        for m in sorted(self.machines.values(), key=lambda m: m.slot):
            if m.ready_at > now or m.done_at is not None:
                continue
            if m.ready_at <= now and not any(e.phase == "serve" and e.status == "started" for e in m.events):
                m.events.append(PhaseEvent("serve", "started", at(m.ready_at)))
            t = now
            while t < now + 1:
                if m.task_done_at is not None:
                    end = min(m.task_done_at, now + 1)
                    m.busy_minutes += end - t
                    t = end
                    if m.task_done_at <= now + 1:
                        m.task_done_at = None
                        m.completed_since_beat += 1
                        if m.market_task:
                            self.payments.append((t, market_pay_fil(t)))
                            self.all_payments.append((t, market_pay_fil(t)))
                        m.market_task = False
                    continue
                if m.draining:
                    m.done_at = t  # drained: nothing in progress, takes no new work
                    m.events.append(PhaseEvent("serve", "done", at(t), message="drained: no proofs left"))
                    break
                if self.queue and self.queue[0] <= t:
                    arrived = self.queue.popleft()
                    self.waits.append(t - arrived)
                    m.task_done_at = t + PROOF_MINUTES
                    continue
                if self.queue:  # the next task arrives within this minute
                    t = self.queue[0]
                    continue
                if self.market_queue:  # idle: curio's scheduler hands it a PSProve task
                    self.market_queue.popleft()
                    m.task_done_at, m.market_task = t + PROOF_MINUTES, True
                    continue
                break

    def unheard(self, now: float) -> bool:
        return self.outage is not None and self.outage[0] <= now < self.outage[1]

    def heartbeat(self, now: float) -> None:
        for m in self.machines.values():
            if m.ready_at > now or m.done_at is not None:
                continue
            m.seq += 1
            m.unheard.append({"seq": m.seq, "interval_s": PASS_MINUTES * 60.0 if m.seq > 1 else None,
                              "completed": m.completed_since_beat, "failed": 0, "busy": m.task_done_at is not None})
            m.completed_since_beat = 0
            if self.unheard(now):
                continue  # the worker queues it; the controller hears nothing
            # Arrived now (queued ones too: the store stamps events with their arrival).
            m.events += [PhaseEvent("serve", "progress", at(now), details={"heartbeat": hb}) for hb in m.unheard]
            m.unheard.clear()
            # The store keeps the recent heartbeats; the decision looks back at most the scale-down window.
            if len(m.events) > 40:
                m.events = m.events[:3] + m.events[-37:]

    def snapshot(self, now: float) -> QueueSnapshot:
        """curio's queue: waiting PoRep tasks, and the sectors past precommit (each a PoRep task once its seed
        comes, SEED_LEAD_MINUTES after its precommit landed)."""
        oldest = at(self.queue[0]) if self.queue else None
        upcoming = sum(1 for a in self.pending if a < now + SEED_LEAD_MINUTES) if self.pending else 0
        market = None
        if self.market:
            while self.payments and self.payments[0][0] < now - 60:
                self.payments.popleft()  # the pay of the last hour (window_hours: 1)
            market = MarketSnapshot(
                len(self.market_queue), sum(1 for m in self.machines.values() if m.market_task),
                at(self.market_queue[0]) if self.market_queue else None, len(self.payments),
                round(sum(fil for _, fil in self.payments) * ATTO_PER_FIL), round(0.001 * ATTO_PER_FIL))
        return QueueSnapshot({"PoRep": len(self.queue)}, {"PoRep": 0}, oldest, upcoming=upcoming, market=market)

    def reports(self, now: float) -> list[InstanceReport]:
        out = []
        for m in self.machines.values():
            m.now_hint = now
            out.append(m.report())
        return out

    def totals(self, end: float) -> tuple[float, float]:
        rented = busy = 0.0
        for m in [*self.gone, *self.machines.values()]:
            rented += max(0.0, (m.released_at if m.released_at is not None else end) - m.rented_at)
            busy += m.busy_minutes
        return rented / 60, busy / 60


class FixedQueue:
    def __init__(self) -> None:
        self.snapshot = QueueSnapshot()

    def read(self, source: QueueSource) -> QueueSnapshot:
        return self.snapshot


def fixed_day(count: int, tasks: list[float], label: str) -> DayResult:
    fleet = Fleet(tasks)
    for slot in range(count):
        fleet.rent(slot, 0.0, warm=True)
    for minute in range(DAY_MINUTES):
        fleet.step(float(minute))
    rented, busy = fleet.totals(DAY_MINUTES)
    waits = fleet.waits + [DAY_MINUTES - a for a in fleet.queue]  # never started: waited until the day's end
    return DayResult(label, rented, busy, waits, len(fleet.waits), counts=[count])


def autoscaled_day(tasks: list[float], workdir: Path, publish: Callable[[Callable[[Path], Any]], Any],
                   base: FleetSpec, label: str = "autoscaled", *, market: bool = False,
                   outage: tuple[float, float] | None = None) -> DayResult:
    """The day with the leader deciding every PASS_MINUTES through capacity_step and committing changes."""
    fleet = Fleet(tasks, market=market, outage=outage)
    queue = FixedQueue()
    demand = DemandHistory()
    spec_path = workdir / "fleet-spec" / "fleet.yaml"
    result = DayResult(label, 0, 0, [], 0)
    lost_after = base.serving.lost_after_minutes
    entries = load_capacity(spec_path)[0]
    for slot in apply_entries(base, entries).pool(POOL).slot_indices or ():
        fleet.rent(slot, 0.0, warm=True)
    for minute in range(DAY_MINUTES):
        now = float(minute)
        fleet.step(now)
        if minute % PASS_MINUTES:
            continue
        fleet.heartbeat(now)
        queue.snapshot = fleet.snapshot(now)
        entries = load_capacity(spec_path)[0]
        spec = apply_entries(base, entries)
        plan = capacity_step(spec, entries, "fleet-spec/capacity.yaml", fleet.reports(now), RecordSet(machines={}),
                             {}, None, at(now), read_queues(spec, queue), history=demand.samples())
        decisions, change = list(plan.decisions), plan.file
        demand.record(spec, decisions)
        if change is not None:
            request = commit_request(PassDecision(), decisions, change)

            def build(_workdir: Path, request: CommitRequest | None = request) -> CommitRequest | None:
                return request

            publish(build)
            result.commits += 1
        _obey(fleet, decisions, now, result)
        if outage is not None and outage[0] + HEARTBEAT_GRACE * PASS_MINUTES < now < outage[1] + lost_after:
            # From the first heartbeat overdue (a pass cannot know of a silence younger than that) until the fleet
            # has been heard again for lost_after: every count holds.
            result.outage_changes += [(now, d.entry.direction or "", d.trailer()) for d in decisions if d.scaled]
            result.outage_holds += sum(1 for d in decisions if d.held_by == "fleet-unheard")
        result.counts.append(len(fleet.machines))
    rented, busy = fleet.totals(DAY_MINUTES)
    waits = fleet.waits + [DAY_MINUTES - a for a in fleet.queue]
    drained = sum(1 for m in fleet.gone if m.done_at is not None)
    paid = [fil for _, fil in fleet.all_payments]
    return replace(result, rented_gpu_hours=rented, busy_gpu_hours=busy, waits=waits, proofs=len(fleet.waits),
                   drained=drained, mid_proof_stops=sum(1 for m in fleet.gone if m.task_done_at is not None),
                   market_proofs=len(paid), market_revenue_usd=sum(paid) * USD_PER_FIL)


def _obey(fleet: Fleet, decisions: list[CapacityDecision], now: float, result: DayResult) -> None:
    """What `fleet apply`/Pulumi and the workers do with the committed file: rent new slots, drain, release."""
    for d in decisions:
        if d.scaled and d.entry.direction is not None:
            result.decisions.append((now, d.entry.direction, d.trailer()))
        slots = set(d.entry.slots)
        for slot in list(fleet.machines):
            if slot not in slots:
                fleet.release(slot, now)
        for slot in sorted(slots - set(fleet.machines)):
            fleet.rent(slot, now)
        for slot, m in fleet.machines.items():
            m.draining = slot in d.entry.draining


@dataclass(frozen=True)
class DayReport:
    autoscaled: DayResult  # the day with the outage, own demand only
    fixed_max: DayResult
    fixed_average: DayResult
    cooldown_minutes: float
    market: DayResult  # the same day (outage included) with the Snark Market
    min_margin: float
    usd_per_hour: float  # the price every simulated machine costs

    @property
    def market_driven_gpu_hours(self) -> float:
        """The market day's rented hours beyond the same day without the market."""
        return self.market.rented_gpu_hours - self.autoscaled.rented_gpu_hours

    @property
    def market_return(self) -> float:
        """Market revenue over the cost of the market-driven GPU-hours (inf: none were rented for it)."""
        cost = self.market_driven_gpu_hours * self.usd_per_hour
        return self.market.market_revenue_usd / cost if cost > 0 else float("inf")

    def lines(self) -> list[str]:
        out = []
        for r in (self.autoscaled, self.fixed_max, self.fixed_average, self.market):
            out.append(f"{r.label:>22}: rented {r.rented_gpu_hours:6.1f} GPU-h, idle {r.idle_gpu_hours:6.1f} GPU-h, "
                       f"p95 wait {r.p95_wait_minutes:5.1f} min, {r.proofs} proofs, average "
                       f"{r.average_count:.1f} machines")
        for r in (self.autoscaled, self.market):
            out.append(f"{r.label}: {len(r.decisions)} decisions in {r.commits} commits, "
                       f"{r.flaps(self.cooldown_minutes)} flaps, {r.drained} machines drained, "
                       f"{r.mid_proof_stops} stopped mid-proof; outage: {r.outage_holds} passes held, "
                       f"{len(r.outage_changes)} changes")
        m = self.market
        out.append(f"market: {m.market_proofs} market proofs, ${m.market_revenue_usd:.2f} revenue; "
                   f"{self.market_driven_gpu_hours:.1f} market-driven GPU-h cost "
                   f"${self.market_driven_gpu_hours * self.usd_per_hour:.2f}: return {self.market_return:.2f}x "
                   f"(at least {1 - self.min_margin:.2f}x: never at a loss beyond the {self.min_margin:.0%} margin)")
        return out


def _fleet_repo(root: Path, spec: str) -> Path:
    """A real bare origin under `root` holding `spec`, and the bot's clone of it (returned)."""
    import subprocess

    root.mkdir(parents=True, exist_ok=True)
    origin, seed_clone = root / "origin.git", root / "seed"
    env_git = ["git", "-c", "user.name=Ada Operator", "-c", "user.email=ada@example.invalid"]
    subprocess.run(["git", "init", "-q", "--bare", "--initial-branch=main", str(origin)], check=True)
    subprocess.run(["git", "clone", "-q", str(origin), str(seed_clone)], check=True, capture_output=True)
    (seed_clone / "fleet-spec").mkdir(parents=True)
    (seed_clone / "fleet-spec" / "fleet.yaml").write_text(spec)
    subprocess.run([*env_git, "-C", str(seed_clone), "checkout", "-q", "-B", "main"], check=True)
    subprocess.run([*env_git, "-C", str(seed_clone), "add", "-A"], check=True)
    subprocess.run([*env_git, "-C", str(seed_clone), "commit", "-q", "-m", "seed"], check=True)
    subprocess.run([*env_git, "-C", str(seed_clone), "push", "-q", "origin", "main"], check=True, capture_output=True)
    bot = root / "bot"
    subprocess.run(["git", "clone", "-q", str(origin), str(bot)], check=True, capture_output=True)
    return bot


def run_day(tmp: Path | None = None, seed: int = 7) -> DayReport:
    """The whole comparison, with a real bare origin and bot clone under `tmp` (a temp dir by default)."""
    root = Path(tempfile.mkdtemp(prefix="capacity-day-")) if tmp is None else tmp
    bot = _fleet_repo(root, SPEC)
    store = GitStore(bot, sleep=lambda _s: None, rng=random.Random(3), max_attempts=2)
    base, problems = check_spec_text(SPEC, "fleet.yaml")
    market_base, problems = check_spec_text(MARKET_SPEC, "fleet.yaml")
    assert base is not None and market_base is not None, problems
    tasks = arrivals(seed)
    autoscaled = autoscaled_day(tasks, bot, store.publish, base, outage=OUTAGE)
    fixed_max = fixed_day(base.pool(POOL).bounds[1], tasks, "fixed at max")
    average = max(1, math.ceil(autoscaled.average_count - 1e-9))
    fixed_average = fixed_day(average, tasks, f"fixed at average ({average})")
    # The market day in a fleet repo of its own (its spec takes market work).
    market_bot = _fleet_repo(root / "market", MARKET_SPEC)
    market_store = GitStore(market_bot, sleep=lambda _s: None, rng=random.Random(3), max_attempts=2)
    market = autoscaled_day(tasks, market_bot, market_store.publish, market_base, "autoscaled + market",
                            market=True, outage=OUTAGE)
    scaling = base.pool(POOL).scaling
    settings = market_base.pool(POOL).queue.market  # type: ignore[union-attr]
    return DayReport(autoscaled, fixed_max, fixed_average, scaling.cooldown_minutes if scaling else 0.0, market,
                     settings.min_margin if settings else 0.0, base.pool(POOL).max_price_usd_per_hour)


if __name__ == "__main__":
    for line in run_day().lines():
        print(line)

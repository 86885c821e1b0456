"""Capacity that follows demand, pure: measured utilization, curio's queue and its Snark Market -> each
autoscaled pool's count.

Place in the flow: the leader's pass (`flows.judge.run_pass`) reads the worker reports (heartbeats) and, for
pools with a queue source, curio's tables (`adapters.curio_queue`), then calls `decide_all` with the entries of
the bot-owned `fleet-spec/capacity.yaml` and the demand samples of its previous passes. What changed is written
back to that file and committed with a `Fleet-Capacity:` trailer; `fleet apply` and `pulumi up` read the file
through the spec loader (the pool's slots), and workers on draining slots get the directive `drain`. No I/O, no
clock: every input is an argument, so a recorded pass replays to the same decision (`fleet plan --what-if`).

The rules (Vast Serverless: target utilization and cold start; KEDA: queue length; Karpenter: consolidate the
worst machines first, and never twice for one shortfall), checked in the order a human would:
- Bounds first: [min, max] from fleet.yaml (min == max pins). A human's new bounds move the count at once, and
  a lower count drains like any shrink.
- Heard: while the controller hears the fleet too little (silence everywhere, or the fleet coming back after
  it: `serving.FleetHearing`, the same signal as the serving verdicts), every count holds. Silence is never
  evidence of idleness.
- Up needs demand that lasted (hysteresis in time): the oldest unclaimed task of the pool's types waited
  `scale_up_after` (curio's `harmony_task.posted_time`), or utilization above target over that whole window,
  or waiting work (and curio's leading indicator, sectors past precommit) above target in every sample of the
  window. How many: the machine-equivalents at work (with a rising trend sized for the cold start) plus those
  that would clear the waiting tasks within the window at the pool's minimum rate, over the target. Slots
  already there count, including machines still in params/benchmark: one shortfall is answered once.
- Down needs positive evidence of idleness: utilization over the `scale_down_after` window (heartbeats
  covering it, after any fleet-wide silence) so low that the remaining machines would be at most
  target - DOWN_MARGIN busy, a queue that was read and had nothing waiting, no machine on its way.
- Guards: the circuit breaker (a paused pool neither grows nor shrinks), the kill budget (an exhausted pool
  does not grow), the cooldown (no change for `cooldown` after a change; a reversal, up after down or down
  after up, also waits the window of its own evidence after the cooldown), the fleet spend cap.
- Every shrink drains: slots without a live instance go first, then the worst $/proof machines are drained
  (finish the current proofs, take no new work, then stop); a draining slot is released once its worker
  stopped (or its instance is gone), never mid-proof.
- Snark Market work (`queue.market`) counts as demand only while what it pays per proof exceeds the pool's
  measured $/proof by the margin (`domain.snark_market`); never as the operator's own demand. Unpaid market
  work a machine is busy with does not count as utilization.

The bound on flapping that follows: changes at least `cooldown` apart; up -> down at least cooldown +
scale_down_after apart, down -> up at least cooldown + scale_up_after apart; so an up-down-up spans at least
2 x cooldown + scale_up_after + scale_down_after (four windows when all four are equal).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cached_property, lru_cache
from itertools import pairwise
from operator import attrgetter
from typing import Any

from reconciler.domain.json_numbers import json_number
from reconciler.domain.observations import InstanceReport, format_time, parse_time
from reconciler.domain.quick_init import quick_init
from reconciler.domain.serving import (
    SILENT_LOST,
    FleetHearing,
    fleet_hearing,
    heartbeats,
    is_serving,
    last_signal,
    serving_health,
)
from reconciler.domain.snark_market import (
    MachineCost,
    MarketEconomics,
    MarketSnapshot,
    economics_from_json,
    market_economics,
    pool_cost_per_proof,
)
from reconciler.domain.spec import FleetSpec, PoolSpec, ScalingSettings, ServingSettings

#: Scale down only to a count at which the remaining machines would be at most this much below target
#: busy (hysteresis in rate: up above target, down only well below it).
DOWN_MARGIN = 0.15
#: Heartbeats must cover this share of the window's machine-time before utilization is trusted.
MIN_COVERAGE = 0.75
#: A shrink needs every serving machine heard within this many heartbeat intervals: a heartbeat overdue is not
#: evidence of anything (the first minutes of an outage look like this before silence is everywhere).
HEARTBEAT_GRACE = 1.5
#: A sector's PoRep task is posted once its seed is on chain: PreCommitChallengeDelay (150 epochs of 30 s on
#: mainnet) after its precommit landed (curio tasks/seal/poller_precommit_msg.go: `randHeight :=
#: pci.PreCommitEpoch + policy.GetPreCommitChallengeDelay()`). Sectors past precommit are PoRep demand that
#: arrives within this many minutes: more than a cold start ahead.
SEED_LEAD_MINUTES = 75.0

UP = "up"
DOWN = "down"

# Why a pool did not change (constants: they appear in status, JSON, /metrics and tests).
HELD_COOLDOWN = "cooldown"
HELD_SPEND_CAP = "spend-cap"
HELD_BREAKER = "circuit-breaker"
HELD_KILL_BUDGET = "kill-budget"
HELD_MISSING_DATA = "missing-data"
HELD_ON_THE_WAY = "capacity-on-the-way"
HELD_AT_BOUND = "at-bound"
HELD_UNHEARD = "fleet-unheard"

#: Slot states with nothing proving on them: released first when a pool shrinks.
GONE = ("empty", "stopped")


# --- signals -------------------------------------------------------------------------------------------


@quick_init
@dataclass(frozen=True)
class QueueSnapshot:
    """Proof tasks of the pool's types in curio's harmony_task: unclaimed rows (no owner_id) and claimed ones."""

    waiting: Mapping[str, int] = field(default_factory=dict)
    running: Mapping[str, int] = field(default_factory=dict)
    oldest_waiting_at: datetime | None = None
    #: The queue could not be read (unreachable, refused the role, no URL): the pool runs on utilization only.
    error: str | None = None
    #: Sealing sectors whose precommit landed and that wait for their seed: each becomes a PoRep task within
    #: about SEED_LEAD_MINUTES (None: not read; a leading indicator, never needed).
    upcoming: int | None = None
    #: The cluster's Snark Market work and pay, for a pool with `queue.market` (None: not configured).
    market: MarketSnapshot | None = None

    @property
    def total_waiting(self) -> int:
        return sum(self.waiting.values())


@quick_init
@dataclass(frozen=True)
class Utilization:
    """Busy time over wall time of the serving machines' heartbeat intervals ending in a window."""

    busy_s: float
    wall_s: float
    machines: int
    window_s: float

    @property
    def value(self) -> float | None:
        return self.busy_s / self.wall_s if self.wall_s > 0 else None

    @property
    def covered(self) -> bool:
        """Enough of the window's machine-time is seen to trust the value."""
        return self.machines > 0 and self.wall_s >= MIN_COVERAGE * self.machines * self.window_s

    @property
    def coverage(self) -> float:
        return self.wall_s / (self.machines * self.window_s) if self.machines and self.window_s else 0.0

    @property
    def busy_machines(self) -> float:
        """Machine-equivalents at work."""
        return (self.value or 0.0) * self.machines


def utilization(reports: Iterable[InstanceReport], end: datetime, window: timedelta) -> Utilization:
    busy = wall = 0.0
    machines = 0
    for report in reports:
        beats = heartbeats(report, reach=window + timedelta(hours=1))
        machines += 1
        previous = None
        for hb in beats:
            if hb.at > end:
                break
            if previous is not None and end - hb.at < window and hb.interval_s:
                # The interval may begin before the window: count only its part inside.
                inside = min(hb.interval_s, (hb.at - (end - window)).total_seconds())
                wall += inside
                busy += inside * (int(previous.busy) + int(hb.busy)) / 2
            previous = hb
    return Utilization(busy, wall, machines, window.total_seconds())


@dataclass(frozen=True)
class SlotState:
    """The newest instance on one of a pool's slots, as capacity sees it."""

    slot: str
    index: int
    instance_id: str | None
    state: str  # empty | on-the-way | serving | stopped
    usd_per_hour: float | None = None  # the instance's price (its slot state or the market), else the pool's max
    proofs_per_hour: float | None = None  # measured: rolling rate while serving, else its benchmark
    heard_at: datetime | None = None  # the controller last heard this instance

    @property
    def usd_per_proof(self) -> float | None:
        if self.usd_per_hour is None or not self.proofs_per_hour:
            return None
        return self.usd_per_hour / self.proofs_per_hour


def slot_states(pool: PoolSpec, reports: Sequence[InstanceReport], serving: ServingSettings,
                prices: Mapping[str, float], hearing: FleetHearing) -> list[SlotState]:
    """Each slot's newest instance: `stopped` only on positive evidence (it failed, said it stopped, is destroyed,
    or went silent while the controller heard the rest of the fleet: the serving verdicts' own rule)."""
    newest: dict[str, InstanceReport] = {}
    for r in reports:
        if r.pool != pool.name or r.quarantine is not None or r.slot is None:
            continue
        if r.slot not in newest or r.registered_at > newest[r.slot].registered_at:
            newest[r.slot] = r
    out = []
    indices = pool.slot_indices if pool.slot_indices is not None else tuple(range(pool.count))
    for index in indices:
        slot = f"{pool.name}-{index}"
        found = newest.get(slot)
        if found is None or found.destroyed_at is not None:
            out.append(SlotState(slot, index, found.instance_id if found else None, "empty"))
            continue
        r = found
        silent = hearing.silent_state(r.instance_id, last_signal(r))
        lost = silent is not None and silent[0] == SILENT_LOST
        if r.failure() is not None or r.first("serve", "done") is not None or lost:
            out.append(SlotState(slot, index, r.instance_id, "stopped"))
        elif is_serving(r):
            rate = serving_health(r, pool, serving).proofs_per_hour
            if rate is None and r.result is not None:
                rate = r.result.proofs_per_hour
            price = prices.get(r.instance_id, pool.max_price_usd_per_hour)
            out.append(SlotState(slot, index, r.instance_id, "serving", price, rate, last_signal(r)))
        else:
            out.append(SlotState(slot, index, r.instance_id, "on-the-way"))
    return out


@quick_init
@dataclass(frozen=True)
class DemandSample:
    """One pass's demand for one pool, in machine-equivalents at the pool's minimum rate over the scale-up window
    (kept by the leader between passes: `waiting work above target for the whole window` is read from them)."""

    at: datetime
    active: int  # slots not draining
    queued: float | None  # the pool's own waiting tasks (None: the queue could not be read)
    market: float = 0.0  # waiting Snark Market tasks while the market pays by the margin (else 0)
    coming: float = 0.0  # sectors past precommit (the PoRep rate of the next SEED_LEAD_MINUTES)
    unpaid: float = 0.0  # machines on Snark Market work that does not pay by the margin (their busy is no demand)

    @property
    def waiting(self) -> float:
        return (self.queued or 0.0) + self.market

    def to_json(self) -> dict[str, Any]:
        return {"at": format_time(self.at), "active": self.active, "queued": _r3(self.queued),
                "market": _r3(self.market), "coming": _r3(self.coming), "unpaid": _r3(self.unpaid)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> DemandSample:
        def num(key: str) -> float | None:
            return json_number(doc.get(key))

        active = doc.get("active")
        if not isinstance(active, int) or isinstance(active, bool) or not isinstance(doc.get("at"), str):
            raise ValueError(f"not a demand sample: {dict(doc)!r:.120}")
        return cls(parse_time(doc["at"]), active, num("queued"), num("market") or 0.0, num("coming") or 0.0,
                   num("unpaid") or 0.0)


def _r3(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def lasted(samples: Sequence[DemandSample], now: datetime, window: timedelta) -> list[DemandSample] | None:
    """The samples that cover the whole `window` before `now` (from the last one at or before its start), or
    None when they do not: none that old, or a gap longer than half the window (unobserved time is never
    evidence)."""
    ordered = sorted([s for s in samples if s.at <= now], key=attrgetter("at"))
    begin = now - window  # (once, not per sample)
    start = [i for i, s in enumerate(ordered) if s.at <= begin]
    if not start:
        return None
    run = ordered[start[-1]:]
    gap = window / 2
    if now - run[-1].at > gap or any(b.at - a.at > gap for a, b in pairwise(run)):
        return None
    return run


@quick_init
@dataclass(frozen=True)
class PoolSignals:
    """What the leader measured for one pool in one pass."""

    utilization_up: Utilization
    utilization_down: Utilization
    queue: QueueSnapshot | None  # None: no queue source configured
    slots: tuple[SlotState, ...]
    hearing: FleetHearing | None = None  # None: not assessed (treated as heard)
    market: MarketEconomics | None = None  # a pool with `queue.market`
    history: tuple[DemandSample, ...] = ()  # the previous passes' samples (oldest first)
    heartbeat_s: float = 300.0  # how often serving workers report (serving.heartbeat_minutes)
    #: The slots' states counted by the caller that made the slots (None: counted here). `domain.replay` makes
    #: them from counts, so it knows them.
    counts: Mapping[str, int] | None = field(default=None, compare=False, repr=False)
    #: The slots that carry `heard_at`, in slot order, handed in by a caller that made the slots and so knows them
    #: (None: looked for here). `domain.replay` sets at most one (the machine heard longest ago), so a shrink need
    #: not look at the ~250 slots for them.
    heard: tuple[SlotState, ...] | None = field(default=None, compare=False, repr=False)

    def count(self, state: str) -> int:
        # The caller's counts read as they are: a cached_property costs a lock on every read (a replay asks ~100,000
        # times).
        return (self.counts if self.counts is not None else self._counts).get(state, 0)

    @cached_property
    def by_index(self) -> dict[int, SlotState]:
        """The slot states by slot index."""
        return dict(zip(map(attrgetter("index"), self.slots), self.slots, strict=True))

    @cached_property
    def _counts(self) -> Mapping[str, int]:
        # Asked for several states per decision: counted once.
        return dict(Counter(map(attrgetter("state"), self.slots)))

    def to_json(self, now: datetime) -> dict[str, Any]:
        up, down = self.utilization_up, self.utilization_down
        out: dict[str, Any] = {
            "utilization": None if up.value is None else round(up.value, 3),
            "utilization_window_min": round(up.window_s / 60, 1),
            "utilization_down": None if down.value is None else round(down.value, 3),
            "utilization_down_window_min": round(down.window_s / 60, 1),
            "serving": self.count("serving"), "on_the_way": self.count("on-the-way"),
            "empty": self.count("empty"),
        }
        if self.queue is not None:
            q = self.queue
            out["queue"] = {"waiting": dict(q.waiting), "running": dict(q.running), "error": q.error,
                            "upcoming": q.upcoming,
                            "oldest_wait_min": None if q.oldest_waiting_at is None
                            else round((now - q.oldest_waiting_at).total_seconds() / 60, 1)}
        if self.market is not None:
            out["market"] = self.market.to_json(now)
        unheard = self.hearing.too_little() if self.hearing is not None else None
        if unheard is not None:
            out["unheard"] = unheard
        return out


def signals_for(pool: PoolSpec, reports: Sequence[InstanceReport], queue: QueueSnapshot | None,
                serving: ServingSettings, prices: Mapping[str, float], now: datetime, *,
                hearing: FleetHearing | None = None, history: Sequence[DemandSample] = ()) -> PoolSignals:
    scaling = pool.scaling or ScalingSettings()
    heard = hearing if hearing is not None else FleetHearing(now, timedelta(minutes=serving.lost_after_minutes))
    states = slot_states(pool, reports, serving, prices, heard)
    # A draining machine takes no new work: its busy tail is not demand.
    live = {s.instance_id for s in states if s.state == "serving" and s.slot not in pool.draining}
    serving_reports = [r for r in reports if r.instance_id in live]
    market = None
    if pool.queue is not None and pool.queue.market is not None:
        settings = pool.queue.market
        snapshot = queue.market if queue is not None and queue.market is not None else MarketSnapshot(
            error=queue.error if queue is not None and queue.error else "not read")
        cost, basis = pool_cost_per_proof(
            [MachineCost(s.usd_per_hour, s.proofs_per_hour) for s in states
             if s.state == "serving" and s.usd_per_hour is not None and s.proofs_per_hour],
            pool.max_price_usd_per_hour, pool.min_rate_proofs_per_hour)
        market = market_economics(snapshot, usd_per_fil=settings.usd_per_fil, min_margin=settings.min_margin,
                                  window_hours=settings.window_hours, cost_usd_per_proof=cost, cost_basis=basis)
    return PoolSignals(
        utilization(serving_reports, now, timedelta(minutes=scaling.scale_up_after_minutes)),
        utilization(serving_reports, now, timedelta(minutes=scaling.scale_down_after_minutes)),
        queue, tuple(states), hearing, market, tuple(history), serving.heartbeat_minutes * 60.0)


# --- the bot-owned file's entries ----------------------------------------------------------------------


@quick_init
@dataclass(frozen=True)
class CapacityEntry:
    """One line of fleet-spec/capacity.yaml: the pool's slots and its last change of count (the leader's decision
    or a human's new bounds): when, which way, and why, in one sentence."""

    pool: str
    desired: int
    slots: tuple[int, ...]
    draining: tuple[int, ...] = ()
    changed_at: datetime | None = None  # the last change of `desired` (cooldown counts from it)
    direction: str | None = None  # up | down of that change
    reason: str = ""
    signals: Mapping[str, Any] = field(default_factory=dict)


def initial_entry(pool: PoolSpec) -> CapacityEntry:
    low, _ = pool.bounds
    return CapacityEntry(pool.name, low, tuple(range(low)), reason=f"starts at min {low} (no decision yet)")


def within_bounds(pool: PoolSpec, entry: CapacityEntry | None) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(slots, draining, desired) of a pool once a human's bounds are applied to the bot's entry: the desired count
    moves into [min, max] at once (a human decision). A higher count gets its slots now (un-draining first); a
    lower one keeps every slot until the leader has drained the surplus: nothing goes mid-proof."""
    low, high = pool.bounds
    if entry is None:
        return tuple(range(low)), (), low
    return _bounded(low, high, entry.desired, entry.slots, entry.draining)


@lru_cache(maxsize=4096)
def _bounded(low: int, high: int, desired: int, entry_slots: tuple[int, ...],
             entry_draining: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """`within_bounds` of an entry, cached on what it reads (ints and tuples of ints, which hash fast): a pass asks
    it a few times per pool, and `fleet plan --what-if` hundreds of thousands of times of the same few entries."""
    taken = set(entry_slots)
    slots = tuple(sorted(taken))
    draining = tuple(i for i in sorted(set(entry_draining)) if i in taken)
    desired = min(max(desired, low), high)
    active = len(slots) - len(draining)
    if active < desired:  # grow: un-drain first, then the lowest free indices
        undrain = set(draining[:desired - active])
        draining = tuple(i for i in draining if i not in undrain)
        active += len(undrain)
        free = (i for i in range(len(slots) + desired + 1) if i not in taken)
        while active < desired:
            slots = (*slots, next(free))
            active += 1
    return tuple(sorted(slots)), draining, desired


def apply_entries(spec: FleetSpec, entries: Mapping[str, CapacityEntry]) -> FleetSpec:
    """The spec with every autoscaled (or ranged) pool's slots taken from its capacity entry."""
    pools = []
    for pool in spec.pools:
        if pool.min_count is None:
            pools.append(pool)
            continue
        slots, draining, desired = within_bounds(pool, entries.get(pool.name))
        pools.append(replace(pool, count=len(slots), slot_indices=slots,
                             draining=tuple(f"{pool.name}-{i}" for i in draining), desired_count=desired))
    return replace(spec, pools=tuple(pools))


# --- the decision --------------------------------------------------------------------------------------


@quick_init
@dataclass(frozen=True)
class CapacityDecision:
    """One pool after one pass: the entry to keep, and whether it changed (a commit) and why."""

    pool: str
    before: int
    entry: CapacityEntry
    changed: bool  # desired, slots or draining differ from the stored entry (the file changes)
    signals: PoolSignals
    held_by: str | None = None
    note: str = ""  # this pass's sentence when the count did not move (a hold, or why it is steady)
    released: tuple[str, ...] = ()
    drain: tuple[str, ...] = ()  # instance ids told to drain
    entry_bounds: tuple[int, int] = (0, 0)  # the pool's [min, max] when decided
    sample: DemandSample | None = None  # this pass's demand (the next passes read it)

    @property
    def after(self) -> int:
        return self.entry.desired

    @property
    def scaled(self) -> bool:
        return self.after != self.before

    def trailer(self) -> str:
        """`rtx4090 4 -> 6 (the oldest of 31 waiting PoRep tasks has waited 25 min ...)`; a release alone:
        `rtx4090 released rtx4090-1 (drained: its worker stopped)`."""
        if self.scaled or not self.released:
            return f"{self.pool} {self.before} -> {self.after} ({self.entry.reason})"
        return f"{self.pool} released {', '.join(self.released)} (drained: nothing proves there any more)"


def _span(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


@lru_cache(maxsize=64)
def _window(minutes: float) -> tuple[timedelta, str]:
    """A scaling window of `minutes`, and its words (`_span`): a pool's windows are a few values, asked at every
    decision."""
    window = timedelta(minutes=minutes)
    return window, _span(window.total_seconds())


def _ago(delta: timedelta) -> str:
    return _span(max(0.0, delta.total_seconds()))


def _machines(n: int) -> str:
    return f"{n} machine" if n == 1 else f"{n} machines"


# (_Demand and _Ruling are not frozen: each is made at every decision, a replay's ~100,000 of them, and a frozen
# dataclass sets each field through object.__setattr__, about four times as slow; neither leaves decide_pool.)
@dataclass(slots=True)
class _Demand:
    """One pass's demand for one pool, measured (the numbers the sentences name)."""

    per_machine_tasks: float  # tasks one machine at the minimum rate clears in the scale-up window
    waiting: int  # the pool's own waiting tasks (0 when the queue could not be read)
    kinds: str  # their task types, `PoRep/UpdateProve`
    oldest: timedelta | None  # age of the oldest of them
    market_waiting: int  # waiting market tasks that pay by the margin (0 otherwise)
    market_oldest: timedelta | None
    unpaid_running: float  # machines on market work that does not pay, over the down window: no demand
    coming: int  # sectors past precommit
    busy_up: float  # machine-equivalents at work over the up window (unpaid market work taken out)
    busy_down: float  # the same over the down window
    forecast: float  # busy_up, sized for the cold start while rising
    sample: DemandSample


def _measure(pool: PoolSpec, signals: PoolSignals, now: datetime, active: int) -> _Demand:
    scaling = pool.scaling or ScalingSettings()
    up, down, queue, market = signals.utilization_up, signals.utilization_down, signals.queue, signals.market
    per_machine = pool.min_rate_proofs_per_hour * scaling.scale_up_after_minutes / 60.0
    readable = queue is not None and queue.error is None
    waiting = queue.total_waiting if queue is not None and readable else 0
    # (read only with tasks waiting)
    kinds = "/".join(sorted(k for k, n in queue.waiting.items() if n)) if queue is not None and waiting else ""
    oldest = now - queue.oldest_waiting_at if readable and waiting and queue is not None and \
        queue.oldest_waiting_at is not None else None
    paying = market is not None and market.paying
    market_waiting = market.waiting if market is not None and paying else 0
    market_oldest = now - market.oldest_waiting_at if paying and market is not None and market_waiting and \
        market.oldest_waiting_at is not None else None
    # Machines on unpaid market work now, and on average over each window (from the samples: a pass catches
    # a machine between two tasks as often as on one, and utilization is a window's average too).
    unpaid = float(market.running) if market is not None and not paying else 0.0

    def unpaid_over(window_s: float) -> float:
        span = timedelta(seconds=window_s)  # (made once, not per sample)
        seen = [s.unpaid for s in signals.history if now - s.at < span]
        return (sum(seen) + unpaid) / (len(seen) + 1)

    # (no samples before: the average is `unpaid` itself)
    unpaid_up, unpaid_down = (unpaid_over(up.window_s), unpaid_over(down.window_s)) if signals.history else \
        (unpaid, unpaid)
    busy_up = max(0.0, up.busy_machines - unpaid_up)
    busy_down = max(0.0, down.busy_machines - unpaid_down)
    # Cold start: a machine rented now serves in ~cold_start minutes, so size for the demand then. The trend is
    # the change of busy machine-equivalents between the long (down) window and the short (up) one, whose
    # centres lie (down - up) / 2 apart; only a rising trend counts (a falling one is the down rule's). With
    # curio's sectors past precommit (the leading indicator) the trend is not needed: it only adds noise.
    coming = queue.upcoming if queue is not None and readable and queue.upcoming else 0
    trend = 0.0
    leading = queue is not None and readable and queue.upcoming is not None
    if not leading and up.covered and down.covered and down.window_s > up.window_s:
        trend = max(0.0, (busy_up - busy_down) / ((down.window_s - up.window_s) / 120.0))
    forecast = busy_up + trend * scaling.cold_start_minutes
    coming_machines = coming * 60.0 / SEED_LEAD_MINUTES / pool.min_rate_proofs_per_hour \
        if pool.min_rate_proofs_per_hour > 0 else 0.0
    sample = DemandSample(now, active, waiting / per_machine if readable and per_machine > 0 else None,
                          market_waiting / per_machine if per_machine > 0 else 0.0, coming_machines, unpaid)
    return _Demand(per_machine, waiting, kinds, oldest, market_waiting, market_oldest, unpaid_down, coming, busy_up,
                   busy_down, forecast, sample)


@dataclass(slots=True)
class _Ruling:
    new: int
    direction: str | None = None  # set when the count moves
    sentence: str = ""
    held_by: str | None = None


def _growth(pool: PoolSpec, signals: PoolSignals, demand: _Demand, now: datetime) -> tuple[int, str] | None:
    """(count wanted, the rule that lasted with its numbers) when demand that lasted wants more than the
    pool has; None when no up rule holds."""
    scaling = pool.scaling or ScalingSettings()
    target = scaling.target_utilization
    window, w = _window(scaling.scale_up_after_minutes)
    up = signals.utilization_up
    rule = None
    queue_now = 0.0
    if demand.oldest is not None and demand.oldest >= window:
        rule = (f"the oldest of {demand.waiting} waiting {demand.kinds} tasks has waited {_ago(demand.oldest)} "
                f"(scale_up_after {w})")
        queue_now = demand.sample.waiting
    elif demand.market_oldest is not None and demand.market_oldest >= window and signals.market is not None:
        rule = (f"the oldest of {demand.market_waiting} waiting Snark Market tasks has waited "
                f"{_ago(demand.market_oldest)} (scale_up_after {w}) and {signals.market.sentence()}")
        queue_now = demand.sample.waiting
    run = lasted([*signals.history, demand.sample], now, window)
    wait_lasted = min((s.waiting for s in run), default=0.0) if run else 0.0
    coming_lasted = min((s.coming for s in run), default=0.0) if run else 0.0
    if run and all((s.waiting + s.coming) / max(1, s.active) > target for s in run):
        if rule is None:
            what = "waiting work" + (" and sectors past precommit" if coming_lasted else "")
            rule = (f"{what} stayed above target {target:.2f} of the pool for the whole {w} (at least "
                    f"{wait_lasted + coming_lasted:.1f} machine-equivalents)")
    else:
        wait_lasted = coming_lasted = 0.0
    if rule is None and up.covered and up.value is not None and demand.busy_up / up.machines > target:
        rule = f"utilization {demand.busy_up / up.machines:.2f} over {w} (above target {target:.2f})"
    if rule is None:
        return None
    base = max(demand.forecast, coming_lasted)
    queued = max(queue_now, wait_lasted)
    needed = math.ceil((base + queued) / target - 1e-9)
    parts = [f"{base:.1f} busy" + (" (rising: sized for the cold start)" if demand.forecast > demand.busy_up
                                    and base == demand.forecast else "")]
    if queued:
        parts.append(f"{queued:.1f} to clear the waiting tasks")
    blind = " (curio's queue could not be read: utilization only)" if signals.queue is not None and \
        signals.queue.error is not None else ""
    return needed, f"{rule}{blind}: {' + '.join(parts)} need {_machines(needed)} at target {target:.2f}"


def _shrink(pool: PoolSpec, signals: PoolSignals, demand: _Demand, now: datetime,
            desired: int) -> tuple[int | None, str, str | None]:
    """(count wanted or None, the sentence, a hold constant): positive evidence of idleness, or why not."""
    scaling = pool.scaling or ScalingSettings()
    low, _ = pool.bounds
    target = scaling.target_utilization
    window, w = _window(scaling.scale_down_after_minutes)
    down, queue = signals.utilization_down, signals.queue
    serving = signals.count("serving")
    if queue is not None and queue.error is not None:
        return None, (f"held: curio's queue could not be read ({queue.error}); a pool never shrinks on missing "
                      "data"), HELD_MISSING_DATA
    if demand.waiting or demand.market_waiting:
        what = f"{demand.waiting} {demand.kinds} tasks" if demand.waiting else \
            f"{demand.market_waiting} paying Snark Market tasks"
        return None, f"steady at {desired}: {what} waiting, so not shrinking", None
    if signals.count("on-the-way"):
        return None, (f"held: {_machines(signals.count('on-the-way'))} still in params/benchmark (capacity on its "
                      "way); not shrinking before it serves"), HELD_ON_THE_WAY
    back = signals.hearing.back if signals.hearing is not None else None
    due = timedelta(seconds=HEARTBEAT_GRACE * signals.heartbeat_s)
    # Only a slot heard of can be overdue: the caller's list of them, else a look at C speed first (the what-if
    # replay's slots mostly were not).
    heard = signals.heard if signals.heard is not None else \
        signals.slots if any(map(attrgetter("heard_at"), signals.slots)) else ()
    overdue = [s for s in heard if s.state == "serving" and s.heard_at is not None and now - s.heard_at > due]
    if overdue:
        late = max(overdue, key=lambda s: now - (s.heard_at or now))
        return None, (f"held: {len(overdue)} serving machine(s) not heard for longer than a heartbeat allows ("
                      f"{late.slot}: {_ago(now - (late.heard_at or now))} > {HEARTBEAT_GRACE:g} x "
                      f"{_span(signals.heartbeat_s)}): idleness is shown by current data only"), HELD_MISSING_DATA
    if serving:
        if back is not None and back > now - window:
            return None, (f"held: the {w} window reaches back into the fleet-wide silence that ended at "
                          f"{format_time(back)}: not enough heard since to show idleness"), HELD_MISSING_DATA
        if not down.covered:
            return None, (f"held: heartbeats cover {down.coverage:.0%} of the {w} window of the serving machines "
                          f"(< {MIN_COVERAGE:.0%}): not enough to show idleness"), HELD_MISSING_DATA
        evidence = f"utilization {demand.busy_down / down.machines:.2f} over {w}"
    else:
        run = lasted([*signals.history, demand.sample], now, window) if queue is not None else None
        if queue is None:
            return None, (f"held: no machine serving and no queue source: nothing shows idleness, so the count "
                          f"stays {desired}"), HELD_MISSING_DATA
        if run is None or any(s.queued is None or s.waiting for s in run):
            return None, (f"held: no machine serving and the queue has not been read empty for the whole {w}: "
                          "nothing shows idleness yet"), HELD_MISSING_DATA
        evidence = f"no machine serving and the queue empty for the whole {w}"
    if target <= DOWN_MARGIN:
        return None, f"steady at {desired}: target {target:.2f} leaves no room below it to shrink", None
    coming = demand.sample.coming
    busy = max(demand.busy_down, coming)
    wanted = max(low, math.ceil(busy / (target - DOWN_MARGIN) - 1e-9))
    unpaid = (f" (not counting {demand.unpaid_running:.1f} machines on unpaid Snark Market work)"
              if demand.unpaid_running else "")
    keep = f"{_machines(wanted)} keep{'s' if wanted == 1 else ''}"
    line = (f"{evidence}{unpaid} with no task waiting: {keep} it at most {target - DOWN_MARGIN:.2f} busy "
            f"(target {target:.2f} - margin {DOWN_MARGIN:.2f})")
    if coming and busy == coming:
        line += f"; {demand.coming} sectors past precommit need that many"
    if wanted >= desired:
        return None, f"steady at {desired}: {line}", None
    return wanted, line, None


def _rule(pool: PoolSpec, stored: CapacityEntry | None, signals: PoolSignals, demand: _Demand, now: datetime,
          desired: int, *, spend_room_usd: float | None, paused: bool, exhausted: bool) -> _Ruling:
    """The count and its one sentence, checked in the order a human would: bounds, hearing, guards, cooldown."""
    scaling = pool.scaling or ScalingSettings()
    low, high = pool.bounds
    if stored is not None and stored.desired != desired:
        how = f"min == max = {low} (a pin)" if low == high else f"bounds {low}..{high}"
        which = "raised" if desired > stored.desired else "lowered"
        return _Ruling(desired, UP if desired > stored.desired else DOWN,
                       f"{how} in fleet.yaml {which} the count: a human's decision")
    if low == high:
        return _Ruling(desired, sentence=f"pinned at {low} (min == max in fleet.yaml)")
    unheard = signals.hearing.too_little() if signals.hearing is not None else None
    if unheard is not None:
        return _Ruling(desired, sentence=f"held at {desired}: {unheard}; every count holds", held_by=HELD_UNHEARD)

    def blocked(direction: str) -> str | None:
        """Why a change in `direction` must wait: the cooldown, and for a reversal its evidence window after it."""
        if stored is None or stored.changed_at is None:
            return None
        wait = timedelta(minutes=scaling.cooldown_minutes)
        extra = ""
        if stored.direction is not None and stored.direction != direction:
            evidence = scaling.scale_up_after_minutes if direction == UP else scaling.scale_down_after_minutes
            wait += timedelta(minutes=evidence)
            extra = f" + the {_span(evidence * 60)} window of a reversal"
        since = now - stored.changed_at
        if since >= wait:
            return None
        return (f"the last change ({stored.direction or 'of count'} at {format_time(stored.changed_at)}) was "
                f"{_ago(since)} ago (< cooldown {_span(scaling.cooldown_minutes * 60)}{extra})")

    grow = _growth(pool, signals, demand, now)
    if grow is not None and grow[0] > desired:
        needed, why = grow
        if desired >= high:
            return _Ruling(desired, sentence=f"held at max {high} (count.max in fleet.yaml): {why}",
                           held_by=HELD_AT_BOUND)
        if paused:
            return _Ruling(desired, sentence=f"held by the circuit breaker: the pool's image is suspect, renting "
                           f"more would not help ({why})", held_by=HELD_BREAKER)
        if exhausted:
            return _Ruling(desired, sentence=f"held by the kill budget: machines are being marked bad as fast as "
                           f"allowed, renting more would not help ({why})", held_by=HELD_KILL_BUDGET)
        wait = blocked(UP)
        if wait is not None:
            return _Ruling(desired, sentence=f"held by the cooldown: {why}; {wait}", held_by=HELD_COOLDOWN)
        new = min(needed, high)
        capped = f" (max {high})" if needed > high else ""
        if spend_room_usd is not None:
            affordable = desired + max(0, math.floor((spend_room_usd + 1e-9) / pool.max_price_usd_per_hour))
            if affordable < new:
                if affordable <= desired:
                    return _Ruling(desired, sentence=f"held by the fleet spend cap: {why}, and the cap allows "
                                   f"{affordable}", held_by=HELD_SPEND_CAP)
                return _Ruling(affordable, UP, f"{why}; the fleet spend cap allows {affordable}",
                               held_by=HELD_SPEND_CAP)
        return _Ruling(new, UP, why + capped)
    if desired <= low:
        why = grow[1] if grow is not None else "no demand that lasted above target"
        return _Ruling(desired, sentence=f"steady at min {low}: {why}")
    wanted, line, hold = _shrink(pool, signals, demand, now, desired)
    if wanted is None:
        return _Ruling(desired, sentence=line, held_by=hold)
    if paused:
        return _Ruling(desired, sentence=f"held by the circuit breaker: the pool's image is suspect ({line})",
                       held_by=HELD_BREAKER)
    wait = blocked(DOWN)
    if wait is not None:
        return _Ruling(desired, sentence=f"held by the cooldown: {line}; {wait}", held_by=HELD_COOLDOWN)
    return _Ruling(wanted, DOWN, line)


def _same_in_order(stored: tuple[int, ...], ordered: tuple[int, ...]) -> bool:
    """Whether `stored` sorted is `ordered` (a stored entry is usually in order already)."""
    return stored is ordered or stored == ordered or tuple(sorted(stored)) == ordered  # (usually the very tuple)


def _drain_order(state: SlotState) -> tuple[float, int]:
    """Worst first: a machine with no measured $/proof (on its way, or unmeasured), then the highest $/proof."""
    cost = state.usd_per_proof
    return (-(cost if cost is not None else math.inf), -state.index)


def decide_pool(pool: PoolSpec, entry: CapacityEntry | None, signals: PoolSignals, now: datetime, *,
                spend_room_usd: float | None = None, paused: bool = False,
                kill_budget_exhausted: bool = False) -> CapacityDecision:
    """The capacity decision for one autoscaled pool.

    `spend_room_usd`: $/h the fleet spend cap leaves for this pool (None: no cap); `paused`: the circuit breaker
    holds the pool; `kill_budget_exhausted`: its machines are being marked bad as fast as allowed."""
    low, high = pool.bounds
    stored = entry
    slots, draining, desired = within_bounds(pool, entry)
    before = entry.desired if entry is not None else desired
    # A draining slot whose worker stopped (drained, failed, gone) is released: nothing is proving there now.
    released = [i for i in draining if (s := signals.by_index.get(i)) is None or s.state in GONE] if draining else []
    if released:
        gone = set(released)
        draining = tuple(i for i in draining if i not in gone)
        slots = tuple(i for i in slots if i not in gone)
    demand = _measure(pool, signals, now, len(slots) - len(draining))
    ruling = _rule(pool, stored, signals, demand, now, desired, spend_room_usd=spend_room_usd, paused=paused,
                   exhausted=kill_budget_exhausted)
    new = ruling.new

    drain_ids: list[str] = []
    drained: list[SlotState] = []
    active_count = len(slots) - len(draining)  # draining is a part of slots (within_bounds)
    if new > active_count:  # grow: cancel drains first (cheapest), then new slots at the lowest free indices
        cancel = set(sorted(draining)[:new - active_count])
        draining = tuple(i for i in draining if i not in cancel)
        taken = set(slots)
        free = (i for i in range(len(slots) + new + 1) if i not in taken)
        added = [next(free) for _ in range(new - active_count - len(cancel))]
        slots = tuple(sorted((*slots, *added)))
    elif new < active_count:  # every shrink: slots with nothing proving go now, then drain the worst $/proof
        surplus = active_count - new
        by_index = signals.by_index
        drains = set(draining)
        active = [i for i in slots if i not in drains] if drains else list(slots)
        # The `surplus` highest empty slots, looked for from the top down (a replay's empty slots are its highest:
        # found in as many steps as it lets go).
        let_go: list[int] = []
        for i in sorted(active, reverse=True):
            if (s := by_index.get(i)) is None or s.state in GONE:
                let_go.append(i)
                if len(let_go) == surplus:
                    break
        if let_go:
            released += let_go
            gone = set(let_go)
            slots = tuple(sorted(set(slots).difference(gone)))  # (slots are in order: see below)
            surplus -= len(let_go)
            if surplus:
                active = [i for i in active if i not in gone]
        # (no sort when the released slots were the whole surplus)
        worst = sorted((by_index[i] for i in active if i in by_index), key=_drain_order) if surplus else []
        for state in worst[:surplus]:
            drained.append(state)
            if state.instance_id:
                drain_ids.append(state.instance_id)
        if drained:
            draining = tuple(sorted((*draining, *(s.index for s in drained))))
    reason = ruling.sentence
    if drained:
        reason += "; draining " + ", ".join(
            f"{s.slot} (" + (f"${s.usd_per_proof:.4f}/proof" if s.usd_per_proof is not None else
                             "no measured $/proof" if s.state == "serving" else "still on its way") + ")"
            for s in drained)
    changed_here = ruling.direction is not None
    # slots and draining stay in order: within_bounds sorts them, and every change above keeps or restores it.
    entry_out = CapacityEntry(
        pool.name, new, slots, draining,
        now if changed_here else (stored.changed_at if stored else None),
        ruling.direction if changed_here else (stored.direction if stored else None),
        reason if changed_here else (stored.reason if stored else initial_entry(pool).reason),
        signals.to_json(now) if changed_here or stored is None else stored.signals)
    file_changed = stored is None or entry_out.desired != stored.desired or \
        not _same_in_order(stored.slots, slots) or not _same_in_order(stored.draining, draining)
    return CapacityDecision(pool.name, before, entry_out, file_changed, signals, ruling.held_by,
                            "" if changed_here and not ruling.held_by else ruling.sentence,
                            tuple(f"{pool.name}-{i}" for i in sorted(released)) if released else (),
                            tuple(drain_ids), (low, high),
                            demand.sample)


def decide_all(spec: FleetSpec, entries: Mapping[str, CapacityEntry], reports: Sequence[InstanceReport],
               queues: Mapping[str, QueueSnapshot], now: datetime, *, prices: Mapping[str, float] | None = None,
               paused_pools: Iterable[str] = (), exhausted_pools: Iterable[str] = (),
               history: Mapping[str, Sequence[DemandSample]] | None = None,
               hearing: FleetHearing | None = None) -> list[CapacityDecision]:
    """Every ranged pool's decision, in spec order; the spend cap is shared out in that order.

    `history`: each pool's demand samples of the previous passes; `hearing`: the fleet's hearing at `now`
    (computed from `reports` when not given)."""
    ranged = [p for p in spec.pools if p.min_count is not None]
    if not ranged:
        return []
    if hearing is None:
        hearing = hearing_for(spec, reports, now)
    signals = {pool.name: signals_for(pool, reports, queues.get(pool.name) if pool.queue else None, spec.serving,
                                      prices or {}, now, hearing=hearing, history=(history or {}).get(pool.name, ()))
               for pool in ranged}
    return decide_signals(spec, entries, signals, now, paused_pools=paused_pools, exhausted_pools=exhausted_pools)


def decide_signals(spec: FleetSpec, entries: Mapping[str, CapacityEntry], signals: Mapping[str, PoolSignals],
                   now: datetime, *, paused_pools: Iterable[str] = (),
                   exhausted_pools: Iterable[str] = ()) -> list[CapacityDecision]:
    """`decide_all` on signals already measured (one per ranged pool), in spec order; the spend cap is shared out
    in that order. `domain.replay` decides recorded signals through it (`fleet plan --what-if`)."""
    paused, exhausted = set(paused_pools), set(exhausted_pools)
    # Only the spend cap reads the other pools' counts.
    desired = {} if spec.max_total_dph is None else {
        p.name: p.count if p.min_count is None else within_bounds(p, entries.get(p.name))[2] for p in spec.pools}
    out = []
    for pool in spec.pools:
        if pool.min_count is None:
            continue
        room = None
        if spec.max_total_dph is not None:
            others = sum(desired[p.name] * p.max_price_usd_per_hour for p in spec.pools if p.name != pool.name)
            room = spec.max_total_dph - others - desired[pool.name] * pool.max_price_usd_per_hour
        decision = decide_pool(pool, entries.get(pool.name), signals[pool.name], now, spend_room_usd=room,
                               paused=pool.name in paused, kill_budget_exhausted=pool.name in exhausted)
        desired[pool.name] = decision.after
        out.append(decision)
    return out


def hearing_for(spec: FleetSpec, reports: Sequence[InstanceReport], now: datetime,
                last_heard: Mapping[str, datetime] | None = None) -> FleetHearing:
    """The fleet's hearing for capacity: silences looked for back over the longest window of any pool.
    `last_heard`: each worker's last signal, when the caller keeps them (the pass's `FleetSignals`)."""
    lost_after = timedelta(minutes=spec.serving.lost_after_minutes)
    windows = [max(s.scale_up_after_minutes, s.scale_down_after_minutes) for p in spec.pools
               if (s := p.scaling) is not None]
    return fleet_hearing(reports, now, lost_after, max([lost_after, *(timedelta(minutes=w) for w in windows)]),
                         last_heard)


def capacity_summary(decisions: Sequence[CapacityDecision]) -> str:
    changed = [d for d in decisions if d.changed]
    return "fleet capacity: " + "; ".join(d.trailer() for d in (changed or decisions))


def capacity_trailers(decisions: Sequence[CapacityDecision]) -> tuple[tuple[str, str], ...]:
    return tuple(("Fleet-Capacity", d.trailer()) for d in decisions if d.changed)


def capacity_json(d: CapacityDecision, now: datetime) -> dict[str, Any]:
    """One pool's capacity for status, the page and /metrics (the pass writes it to its last-pass file)."""
    pool_min, pool_max = d.entry_bounds
    return {"pool": d.pool, "desired": d.after, "before": d.before, "min": pool_min, "max": pool_max,
            "slots": len(d.entry.slots), "draining": [f"{d.pool}-{i}" for i in d.entry.draining],
            "changed": d.changed, "scaled": d.scaled, "held_by": d.held_by, "note": d.note,
            "reason": d.entry.reason, "changed_at": format_time(d.entry.changed_at) if d.entry.changed_at else None,
            "direction": d.entry.direction, "drain": list(d.drain), "released": list(d.released),
            "signals": d.signals.to_json(now), "sample": d.sample.to_json() if d.sample else None}


# --- the view ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolMarketStatus:
    """A pool's Snark Market economics as the last pass priced them."""

    revenue_usd_per_proof: float | None
    usd_per_proof: float | None
    break_even_usd_per_proof: float | None
    threshold_usd_per_proof: float | None
    served: int | None
    window_hours: float | None
    paying: bool
    error: str | None

    def summary(self) -> str:
        if self.error is not None:
            return f"Snark Market: tables unreadable ({self.error}): market work does not count"

        def usd(value: float | None) -> str:
            return "?" if value is None else f"${value:.3f}"

        served = "?" if self.served is None else str(self.served)
        window = f" in {self.window_hours:g} h" if self.window_hours else ""
        state = "pays: counted as demand" if self.paying else "does not pay: not counted"
        return (f"Snark Market: revenue {usd(self.revenue_usd_per_proof)}/proof, cost {usd(self.usd_per_proof)}/"
                f"proof (break-even {usd(self.break_even_usd_per_proof)}, with margin "
                f"{usd(self.threshold_usd_per_proof)}); {served} market proofs served{window}; {state}")


@dataclass(frozen=True)
class PoolCapacityStatus:
    """What status, the page and /metrics show for one autoscaled pool."""

    pool: str
    min: int
    max: int
    desired: int
    slots: int
    draining: tuple[str, ...]
    utilization: float | None  # over the scale-up window, now
    utilization_window_min: float
    serving: int
    on_the_way: int
    queue_configured: bool
    waiting: Mapping[str, int]  # from the last pass (None when the queue could not be read)
    queue_error: str | None
    last_reason: str
    last_change_at: str | None
    last_direction: str | None
    held_by: str | None
    note: str
    usd_per_hour_at_min: float
    usd_per_hour_at_max: float
    market: PoolMarketStatus | None = None

    def summary(self) -> str:
        util = "utilization ?" if self.utilization is None else f"utilization {self.utilization:.2f}"
        util += f" over {self.utilization_window_min:g} min"
        if not self.queue_configured:
            queue = "no queue source: utilization only"
        elif self.queue_error is not None:
            queue = f"queue unavailable ({self.queue_error}): utilization only, never scaled down on it"
        else:
            queue = f"{sum(self.waiting.values())} waiting" + (
                f" ({', '.join(f'{k} {n}' for k, n in sorted(self.waiting.items()))})" if self.waiting else "")
        draining = f", draining {', '.join(self.draining)}" if self.draining else ""
        return (f"desired {self.desired} of {self.min}..{self.max} ({self.slots} slot(s){draining}; "
                f"{self.serving} serving, {self.on_the_way} on the way); {util}; {queue}")

    def last(self) -> str:
        """The last change of count, with its own time, direction and reason."""
        if self.last_change_at is None:
            return self.last_reason
        return f"last change {self.last_direction or ''} at {self.last_change_at}: {self.last_reason}"


def capacity_view(spec: FleetSpec, reports: Sequence[InstanceReport], now: datetime,
                  entries: Mapping[str, CapacityEntry], last_pass: Mapping[str, Any] | None) -> tuple[
                      PoolCapacityStatus, ...]:
    """Per autoscaled pool: bounds, desired, slots, utilization now, the last pass's queue, market and hold, the
    last change (from the bot's entry), and what the pool costs at its bounds (max price)."""
    passed: dict[str, Mapping[str, Any]] = {}
    for doc in (last_pass or {}).get("capacity") or ():
        if isinstance(doc, Mapping) and isinstance(doc.get("pool"), str):
            passed[doc["pool"]] = doc
    ranged = [p for p in spec.pools if p.min_count is not None]
    if not ranged:
        return ()
    hearing = hearing_for(spec, reports, now)
    out = []
    for pool in ranged:
        low, high = pool.bounds
        sig = signals_for(pool, reports, None, spec.serving, {}, now, hearing=hearing)
        entry = entries.get(pool.name)
        last = passed.get(pool.name, {})
        signals: Mapping[str, Any] = last["signals"] if isinstance(last.get("signals"), Mapping) else {}
        queue: Mapping[str, Any] = signals["queue"] if isinstance(signals.get("queue"), Mapping) else {}
        waiting: Mapping[str, Any] = queue["waiting"] if isinstance(queue.get("waiting"), Mapping) else {}
        error = queue.get("error") if isinstance(queue.get("error"), str) else (
            None if queue or pool.queue is None else "not read yet (no pass of the leader seen)")
        market = None
        if pool.queue is not None and pool.queue.market is not None:
            doc = signals.get("market")
            if not isinstance(doc, Mapping) and entry is not None and isinstance(entry.signals.get("market"), Mapping):
                doc = entry.signals["market"]  # the last decision's figures until a pass of the leader is seen
            figures = economics_from_json(doc) if isinstance(doc, Mapping) else economics_from_json(
                {"error": "not read yet (no pass of the leader seen)"})
            market = PoolMarketStatus(**figures)
        out.append(PoolCapacityStatus(
            pool.name, low, high, pool.desired_count if pool.desired_count is not None else pool.count, pool.count,
            pool.draining, sig.utilization_up.value, sig.utilization_up.window_s / 60, sig.count("serving"),
            sig.count("on-the-way"), pool.queue is not None, {str(k): int(v) for k, v in waiting.items()}, error,
            entry.reason if entry else "no decision yet (starts at min)",
            format_time(entry.changed_at) if entry and entry.changed_at else None,
            entry.direction if entry else None,
            last.get("held_by") if isinstance(last.get("held_by"), str) else None,
            str(last.get("note") or ""),
            round(low * pool.max_price_usd_per_hour, 2), round(high * pool.max_price_usd_per_hour, 2), market))
    return tuple(out)


def demand_history(samples: Iterable[DemandSample], now: datetime, keep: timedelta) -> tuple[DemandSample, ...]:
    """The samples worth keeping at `now` (the longest window back, plus one older sample that starts it),
    oldest first, one per time."""
    by_time = {s.at: s for s in samples if s.at <= now}
    times = sorted(by_time)
    first = max(0, bisect.bisect_right(times, now - keep) - 1)  # the newest at or before the start, if any
    return tuple(by_time[t] for t in times[first:])


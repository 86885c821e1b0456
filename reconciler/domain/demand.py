"""Demand samples: each pool's demand, capacity, work and spend, pass by pass, in a few numbers (pure).

Place in the flow: the leader's pass (`flows.judge.run_pass`, its capacity step) hands the pool signals it has
just measured to `flows.demand.DemandRecorder`, which takes a sample per pool per change: at every pass whose
capacity decision changed fleet-spec/capacity.yaml, when something a decision turns on moved (`differs_from`,
at most once per resolution), and at least once per longest spacing; it commits them, compacted, to one file per
pool per day (`adapters.demand_files`). `fleet plan --what-if` (`domain.whatif`) replays them: the demand
the fleet saw, fed to the same capacity decision under another spec. No I/O, no clock.

A sample covers the *tile* since the pool's previous sample (`span_s`): the busy and heartbeat-covered
machine-seconds of its serving machines in that tile (summed over tiles, utilization over any window, to the
resolution of the tiles), the proofs they completed, and, as of the pass, the slot counts, the queue (waiting
tasks by type, the oldest one's age), the spend rate and the signals the capacity decision itself read
(utilization over the spec's up and down windows), so replaying the unchanged spec feeds the decision exactly
what it saw.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from reconciler.domain.capacity import HEARTBEAT_GRACE, PoolSignals, QueueSnapshot, Utilization, slot_states
from reconciler.domain.observations import InstanceReport
from reconciler.domain.quick_init import quick_init
from reconciler.domain.serving import FleetHearing, heartbeats
from reconciler.domain.snark_market import MarketEconomics
from reconciler.domain.spec import PoolSpec, ServingSettings

#: A tile longer than this (a leader that was down, a new leader that knows no earlier sample) is cut to it:
#: the replay counts the rest as time without samples.
MAX_TILE_S = 3600.0
#: A pool is sampled again before its longest spacing only when one of these moved (`differs_from`): the replay
#: decides at samples, so between two of them nothing a decision turns on changed by more than this.
UTILIZATION_CHANGE = 0.02
QUEUE_CHANGE = 0.1


@quick_init
@dataclass(frozen=True)
class PoolSample:
    """One pool at one pass, and its tile: the time since the pool's previous sample."""

    pool: str
    at: datetime
    span_s: float
    desired: int  # the count the pool should have after this pass (capacity's desired, or the spec's count)
    slots: int  # slots it has (draining ones included)
    draining: int  # slots draining
    serving: int  # slots whose newest instance serves (draining ones included)
    on_the_way: int  # ... is in params/benchmark
    stopped: int  # ... stopped (failed, drained, lost) but not destroyed yet: still billed
    draining_serving: int  # draining slots whose worker still serves
    busy_s: float  # busy machine-seconds of the serving (not draining) machines in the tile (`tile`)
    wall_s: float  # machine-seconds their heartbeats covered in the tile
    proofs: int  # proofs the pool's serving machines completed in the tile (heartbeat deltas)
    usd_per_hour: float  # what the pool's rented instances cost per hour at `at`
    unpriced: int  # rented instances without a known price (counted at the pool's max price)
    #: curio's queue for a pool with a queue source (None: no queue source; `queue_error`: it could not be read).
    waiting: Mapping[str, int] | None = None
    running: Mapping[str, int] | None = None
    oldest_wait_s: float | None = None
    queue_error: bool = False
    upcoming: int | None = None
    #: The signals the capacity decision read (autoscaled pools; None for a fixed count).
    up: Utilization | None = None
    down: Utilization | None = None
    paused: bool = False  # the circuit breaker paused the pool at this pass
    exhausted: bool = False  # its kill budget was exhausted
    image: str = ""  # the desired image digest's first 12 hex digits ("" unknown)
    changed: bool = False  # this pass's capacity decision changed capacity.yaml
    #: The fleet's hearing at the pass (`serving.FleetHearing`): seconds since the newest live worker was heard,
    #: since the fleet was heard again after its newest fleet-wide silence, and that silence's length (None: none).
    heard_s: float | None = None
    back_s: float | None = None
    silent_s: float | None = None
    unheard: bool = False  # the hearing was too little to move a count on (`FleetHearing.too_little`)
    #: The longest any serving machine had not been heard (None: none serving), and whether that was longer than
    #: a heartbeat allows (capacity then holds: idleness is shown by current data only).
    quiet_s: float | None = None
    overdue: bool = False
    #: How far back the leader's own demand memory of this pool reached (None: empty, e.g. a new leader).
    memory_s: float | None = None
    #: The Snark Market as the decision priced it (a pool with `queue.market`): `market_fields`.
    market: Mapping[str, Any] | None = None
    extra: Mapping[str, str] = field(default_factory=dict)  # columns a newer writer added (kept, not read)

    @property
    def rented(self) -> int:
        """Instances billed at `at`."""
        return self.serving + self.on_the_way + self.stopped

    @property
    def total_waiting(self) -> int:
        return sum(self.waiting.values()) if self.waiting else 0

    def queue(self, now: datetime | None = None) -> QueueSnapshot | None:
        """The queue as the pass read it (None: the pool has no queue source)."""
        if self.waiting is None and not self.queue_error:
            return None
        if self.queue_error:
            return QueueSnapshot(error="recorded as unavailable")
        at = now or self.at
        oldest = at - timedelta(seconds=self.oldest_wait_s) if self.oldest_wait_s is not None else None
        return QueueSnapshot(dict(self.waiting or {}), dict(self.running or {}), oldest, upcoming=self.upcoming)

    def steady_with(self, later: PoolSample) -> bool:
        """Whether `later` says nothing this sample does not (the same counts, queue, spend, signals and busy
        share, no decision): the two are merged into one line of a longer tile."""
        if self.changed or later.changed:
            return False
        same = (self.desired, self.slots, self.draining, self.serving, self.on_the_way, self.stopped,
                self.draining_serving, self.usd_per_hour, self.unpriced, self.waiting, self.running,
                self.oldest_wait_s, self.queue_error, self.upcoming, self.paused, self.exhausted, self.image,
                self.back_s, self.market, self.extra)
        if same != (later.desired, later.slots, later.draining, later.serving, later.on_the_way, later.stopped,
                    later.draining_serving, later.usd_per_hour, later.unpriced, later.waiting, later.running,
                    later.oldest_wait_s, later.queue_error, later.upcoming, later.paused, later.exhausted,
                    later.image, later.back_s, later.market, later.extra):
            return False
        return _share(self.busy_s, self.wall_s) == _share(later.busy_s, later.wall_s) and \
            _value(self.up) == _value(later.up) and _value(self.down) == _value(later.down)

    def differs_from(self, earlier: PoolSample) -> str | None:
        """What changed materially since `earlier` (None: nothing a capacity decision could turn on): a count, a
        decision, a guard, the queue (from or to empty, an error, the waiting tasks or the oldest one's age by
        more than QUEUE_CHANGE), or utilization over either window by more than UTILIZATION_CHANGE."""
        if self.changed:
            return "a capacity decision"
        if self.total_waiting or (self.market or {}).get("waiting"):
            return "work waiting"  # the decision reads every sample while work waits ("demand that lasted")
        counts = ("desired", "slots", "draining", "serving", "on_the_way", "stopped", "draining_serving", "unpriced",
                  "paused", "exhausted", "image", "queue_error", "upcoming", "unheard", "overdue")
        for name in counts:
            if getattr(self, name) != getattr(earlier, name):
                return name
        if (self.waiting is None) != (earlier.waiting is None) or \
                _moved(self.total_waiting, earlier.total_waiting) or \
                (self.oldest_wait_s is None) != (earlier.oldest_wait_s is None) or \
                _moved(self.oldest_wait_s or 0.0, earlier.oldest_wait_s or 0.0):
            return "queue"
        if _priced(self.market) != _priced(earlier.market):
            return "market"
        for name in ("up", "down"):
            now, then = getattr(self, name), getattr(earlier, name)
            if (now is None) != (then is None) or (now is not None and then is not None and (
                    now.covered != then.covered or abs((now.value or 0.0) - (then.value or 0.0)) > UTILIZATION_CHANGE)):
                return f"utilization ({name})"
        return None

    def merged(self, later: PoolSample) -> PoolSample:
        return replace(later, span_s=self.span_s + later.span_s, busy_s=self.busy_s + later.busy_s,
                       wall_s=self.wall_s + later.wall_s, proofs=self.proofs + later.proofs)


def _priced(market: Mapping[str, Any] | None) -> tuple[Any, ...] | None:
    """What decides whether the market pays: its pay, the pool's cost, whether it could be read."""
    return None if market is None else (market.get("fil_per_proof"), market.get("usd_per_proof"), market.get("error"))


def _moved(now: float, then: float) -> bool:
    """From or to zero, or by more than QUEUE_CHANGE of the larger."""
    if (now == 0) != (then == 0):
        return True
    return abs(now - then) > QUEUE_CHANGE * max(abs(now), abs(then))


def _share(busy: float, wall: float) -> float | None:
    return round(busy / wall, 6) if wall > 0 else None


def _value(u: Utilization | None) -> tuple[float | None, int, float] | None:
    return None if u is None else (_share(u.busy_s, u.wall_s), u.machines, u.window_s)


def compact(samples: Iterable[PoolSample]) -> list[PoolSample]:
    """Samples in time order, each run of steady ones (`steady_with`) merged into one."""
    out: list[PoolSample] = []
    for s in sorted(samples, key=lambda s: s.at):
        if out and out[-1].at == s.at:
            out[-1] = s  # the same pass sampled twice (a retried publish): the later word
        elif out and out[-1].steady_with(s):
            out[-1] = out[-1].merged(s)
        else:
            out.append(s)
    return out


@dataclass(frozen=True)
class Tile:
    """What serving workers' heartbeats say about one tile: busy and covered machine-seconds, proofs done."""

    busy_s: float = 0.0
    wall_s: float = 0.0
    proofs: int = 0


def tile(reports: Iterable[InstanceReport], end: datetime, span: timedelta) -> Tile:
    """The heartbeat intervals that end in (end - span, end], each counted whole in the tile where it ends (so
    tiles add up to the covered time exactly, whatever the heartbeat interval), busy by the trapezoid of its two
    ends as `capacity.utilization` counts it; and the proofs those heartbeats report."""
    busy = wall = 0.0
    proofs = 0
    for report in reports:
        beats = heartbeats(report, reach=span + timedelta(hours=1))
        previous = None
        for hb in beats:
            if hb.at > end:
                break
            if end - hb.at < span:
                proofs += hb.completed or 0
                if previous is not None and hb.interval_s:
                    wall += hb.interval_s
                    busy += hb.interval_s * (int(previous.busy) + int(hb.busy)) / 2
            previous = hb
    return Tile(busy, wall, proofs)


def pool_sample(pool: PoolSpec, reports: Sequence[InstanceReport], serving: ServingSettings,
                prices: Mapping[str, float], now: datetime, span: timedelta, *,
                signals: PoolSignals | None = None, queue: QueueSnapshot | None = None, desired: int | None = None,
                changed: bool = False, paused: bool = False, exhausted: bool = False,
                image_digest: str | None = None, hearing: FleetHearing | None = None,
                usd_per_fil: float | None = None) -> PoolSample:
    """The sample of `pool` at `now` over the tile `span`.

    `signals`: what the capacity decision measured this pass (autoscaled pools): its slot states, up/down
    utilization, the fleet's hearing, the leader's demand memory and the market are recorded as they were;
    without it (a fixed count) the slot states are measured here, with `hearing` (the pass's)."""
    heard = signals.hearing if signals is not None and signals.hearing is not None else \
        hearing or FleetHearing(now, timedelta(minutes=serving.lost_after_minutes))
    states = signals.slots if signals is not None else tuple(slot_states(pool, reports, serving, prices, heard))
    if signals is not None and queue is None:
        queue = signals.queue
    draining = set(pool.draining)
    by_instance = {s.instance_id: s for s in states if s.instance_id}
    live = [r for r in reports if r.instance_id in by_instance and by_instance[r.instance_id].state == "serving"]
    demand = tile([r for r in live if by_instance[r.instance_id].slot not in draining], now, span)
    rented = [s for s in states if s.state in ("serving", "on-the-way", "stopped") and s.instance_id]
    heard_at = [s.heard_at for s in states if s.state == "serving" and s.heard_at is not None]
    quiet = round(max(0.0, (now - min(heard_at)).total_seconds()), 3) if heard_at else None
    usd = sum(prices.get(s.instance_id or "", pool.max_price_usd_per_hour) for s in rented)
    unpriced = sum(1 for s in rented if (s.instance_id or "") not in prices)
    waiting = running = None
    oldest = None
    error = False
    upcoming = None
    if queue is not None:
        error = queue.error is not None
        if not error:
            waiting, running = dict(queue.waiting), dict(queue.running)
            upcoming = queue.upcoming
            if queue.oldest_waiting_at is not None:
                oldest = round(max(0.0, (now - queue.oldest_waiting_at).total_seconds()), 3)
    return PoolSample(
        pool=pool.name, at=now, span_s=round(span.total_seconds(), 3),
        desired=desired if desired is not None else (pool.desired_count if pool.desired_count is not None
                                                     else pool.count),
        slots=len(states), draining=len(draining),
        serving=sum(1 for s in states if s.state == "serving"),
        on_the_way=sum(1 for s in states if s.state == "on-the-way"),
        stopped=sum(1 for s in states if s.state == "stopped"),
        draining_serving=sum(1 for s in states if s.state == "serving" and s.slot in draining),
        busy_s=round(demand.busy_s, 3), wall_s=round(demand.wall_s, 3),
        proofs=tile([r for r in live if by_instance[r.instance_id].slot in draining], now, span).proofs + demand.proofs,
        usd_per_hour=round(usd, 4), unpriced=unpriced, waiting=waiting, running=running, oldest_wait_s=oldest,
        queue_error=error, upcoming=upcoming,
        up=signals.utilization_up if signals is not None else None,
        down=signals.utilization_down if signals is not None else None,
        paused=paused, exhausted=exhausted, image=short_image(image_digest), changed=changed,
        heard_s=_ago(now, heard.newest[0][0]) if heard.newest else None, back_s=_ago(now, heard.back),
        silent_s=round(heard.silent_for.total_seconds(), 3) if heard.silent_for is not None else None,
        unheard=heard.too_little() is not None, quiet_s=quiet,
        overdue=quiet is not None and quiet > HEARTBEAT_GRACE * serving.heartbeat_minutes * 60.0,
        memory_s=_ago(now, signals.history[0].at) if signals is not None and signals.history else None,
        market=market_fields(signals.market, now, usd_per_fil) if signals is not None and signals.market else None)


def _ago(now: datetime, then: datetime | None) -> float | None:
    """Seconds from `then` to `now` (a signal stamped after `now`, another clock's: 0)."""
    return None if then is None else round(max(0.0, (now - then).total_seconds()), 3)


def market_fields(market: MarketEconomics, now: datetime, usd_per_fil: float | None) -> dict[str, Any]:
    """What a replay needs of the market to price it again: the pay in FIL per proof (the operator's exchange rate
    is the spec's), the pool's cost per proof, the paid proofs and the market's queue."""
    fil = market.revenue_usd_per_proof / usd_per_fil if market.revenue_usd_per_proof is not None and usd_per_fil \
        else None
    return {"fil_per_proof": None if fil is None else round(fil, 9), "revenue_basis": market.revenue_basis,
            "usd_per_proof": round(market.cost_usd_per_proof, 6), "cost_basis": market.cost_basis,
            "served": market.served, "window_hours": market.window_hours, "waiting": market.waiting,
            "running": market.running, "error": market.error,
            "oldest_s": _ago(now, market.oldest_waiting_at)}


def market_of(fields: Mapping[str, Any], now: datetime, usd_per_fil: float, min_margin: float) -> MarketEconomics:
    """The market's economics from `market_fields`, priced at the spec's exchange rate and margin."""
    fil = fields.get("fil_per_proof")
    oldest = fields.get("oldest_s")
    return MarketEconomics(
        fil * usd_per_fil if isinstance(fil, int | float) else None, str(fields.get("revenue_basis") or ""),
        float(fields.get("usd_per_proof") or 0.0), str(fields.get("cost_basis") or ""), min_margin,
        int(fields.get("served") or 0), float(fields.get("window_hours") or 0.0), int(fields.get("waiting") or 0),
        int(fields.get("running") or 0), now - timedelta(seconds=oldest) if isinstance(oldest, int | float) else None,
        fields.get("error") if isinstance(fields.get("error"), str) else None)


def short_image(digest: str | None) -> str:
    """A digest's first 12 hex digits (what a sample records), "" when unknown."""
    return digest.removeprefix("sha256:")[:12] if digest else ""

"""The leader's demand recorder: a thin hook on the pass's capacity step that keeps compact demand samples in git.

Place in the flow: `flows.judge.run_pass` (on the leader) hands the recorder what its capacity step measured;
`take` returns this pass's samples (per pool and per change: at every pass whose capacity decision changed
capacity.yaml, when a signal moved but at most once per `resolution_s`, at least once per `spacing_s`);
`changes` renders the day files to commit with the pass (with any commit the pass makes anyway, else once the
oldest uncommitted sample is `flush_s` old); `done` is told what was published. The loop keeps one recorder
between passes (a new leader starts where the day file ends). Samples not yet committed when a leader dies are
lost: the replay counts the gap, it never fills it. The recorder also remembers the price of each instance the
provisioner's slot state showed (`known_prices`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from reconciler.adapters.demand_files import DEMAND_DIR, day_path, last_sample_at, merged_day, stale_days
from reconciler.adapters.git import FileChange
from reconciler.domain.capacity import CapacityDecision
from reconciler.domain.demand import MAX_TILE_S, PoolSample, pool_sample
from reconciler.domain.observations import InstanceReport
from reconciler.domain.planner import pool_pause
from reconciler.domain.records import RecordSet
from reconciler.domain.spec import FleetSpec

DEMAND_TRAILER = "Fleet-Demand"
#: Instances whose price the recorder remembers (far more than a fleet has instances between passes).
MAX_PRICES = 100_000


@dataclass
class DemandRecorder:
    """Samples taken and not yet committed, and each pool's newest sample time (its next tile starts there)."""

    resolution_s: float = 60.0  # samples of one pool at least this far apart (unless a decision changed it)
    spacing_s: float = 900.0  # ... and at most this far apart (spend and work are counted per tile)
    flush_s: float = 3600.0
    keep_days: int = 40

    def __post_init__(self) -> None:
        self._last: dict[str, datetime] = {}
        self._taken: dict[str, PoolSample] = {}  # each pool's newest sample (what a change is measured from)
        self._pending: list[PoolSample] = []
        self._prices: dict[str, float] = {}

    def known_prices(self, current: Mapping[str, float]) -> dict[str, float]:
        """`current` (instance -> $/h from the provisioner's slot state) with the prices of instances seen in earlier
        passes: the provisioner forgets an instance once it replaced it, often before the pass that judges it,
        and the record entry (and the replay's price-cap check) needs its price. Bounded: the oldest go first."""
        for instance_id, price in current.items():
            self._prices.pop(instance_id, None)
            self._prices[instance_id] = price
        while len(self._prices) > MAX_PRICES:
            del self._prices[next(iter(self._prices))]
        return dict(self._prices)

    @property
    def pending(self) -> tuple[PoolSample, ...]:
        return tuple(self._pending)

    def take(self, spec: FleetSpec, read: Callable[[str], str | None], reports: Sequence[InstanceReport],
             records: RecordSet, capacity: Sequence[CapacityDecision], exhausted: Sequence[str],
             prices: Mapping[str, float], desired_image_digest: str | None, now: datetime) -> tuple[PoolSample, ...]:
        """This pass's samples (the recorder itself is unchanged until `done`: a retried build takes them again).
        `read`: a file of the spec directory at the pass's tip (where a new leader finds the last sample)."""
        decided = {d.pool: d for d in capacity}
        hearing = next((d.signals.hearing for d in capacity if d.signals.hearing is not None), None)
        out = []
        for pool in spec.pools:
            decision = decided.get(pool.name)
            last = self._last.get(pool.name)
            if last is None:
                last = last_sample_at(read, pool.name, now)
                if last is not None:
                    self._last[pool.name] = last
            gap = (now - last).total_seconds() if last is not None else None
            if gap is not None and gap <= 0:
                continue  # this pass (or a later one, by another clock) is sampled already
            changed = decision is not None and decision.changed
            if gap is not None and gap < self.resolution_s and not changed:
                continue
            span = gap if gap is not None and gap <= MAX_TILE_S else self.resolution_s
            sample = pool_sample(
                pool, reports, spec.serving, prices, now, timedelta(seconds=span),
                signals=decision.signals if decision is not None else None,
                desired=decision.after if decision is not None else None, changed=changed,
                paused=pool_pause(pool.name, records, desired_image_digest) is not None,
                exhausted=pool.name in exhausted, image_digest=desired_image_digest, hearing=hearing,
                usd_per_fil=pool.queue.market.usd_per_fil if pool.queue and pool.queue.market else None)
            earlier = self._taken.get(pool.name)
            if gap is not None and gap < self.spacing_s and earlier is not None and \
                    sample.differs_from(earlier) is None:
                continue  # nothing moved: the next sample's tile covers this time too
            out.append(sample)
        return tuple(out)

    def changes(self, read: Callable[[str], str | None], names: Callable[[str], list[str]], spec_dir: str,
                taken: Sequence[PoolSample], now: datetime, *, committing: bool) -> tuple[FileChange, ...]:
        """The day files (and the deletions of files past the retention) to commit with this pass: when the pass
        commits anyway, or once the oldest uncommitted sample is `flush_s` old; else nothing. `read`/`names`: a
        file, the files of a directory, of the spec directory `spec_dir` at the pass's tip."""
        samples = [*self._pending, *taken]
        if not samples:
            return ()
        if not committing and (now - min(s.at for s in samples)).total_seconds() < self.flush_s:
            return ()
        by_file: dict[str, list[PoolSample]] = {}
        for s in samples:
            by_file.setdefault(day_path(s.pool, s.at.date()), []).append(s)
        out = [FileChange(f"{spec_dir}/{rel}", merged_day(read(rel), new[0].pool, rel, new))
               for rel, new in sorted(by_file.items())]
        keep_from = (now - timedelta(days=self.keep_days)).date()
        out += [FileChange(f"{spec_dir}/{rel}", None) for rel in stale_days(names(DEMAND_DIR), keep_from)]
        return tuple(out)

    def done(self, taken: Sequence[PoolSample], *, flushed: bool) -> None:
        """After the publish: `taken` are this pass's samples; `flushed`: the day files went out with it."""
        for s in taken:
            if s.at > self._last.get(s.pool, s.at - timedelta(seconds=1)):
                self._last[s.pool] = s.at
                self._taken[s.pool] = s
        self._pending = [] if flushed else [*self._pending, *taken]


def demand_trailers(changes: Sequence[FileChange]) -> tuple[tuple[str, str], ...]:
    """`Fleet-Demand: demand/rtx4090/2026-12-01.csv` for each day file a commit writes."""
    return tuple((DEMAND_TRAILER, c.path.split("/", 1)[1] if "/" in c.path else c.path)
                 for c in changes if c.content is not None)

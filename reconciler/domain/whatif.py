"""What would this PR have done? The base spec's and the PR's spec's replays of the same history, compared (pure).

Place in the flow: `flows.whatif` loads the window's `History` from git and calls `what_if`; the renderers
(`render.whatif`) show the result as text, JSON or the PR comment's section. `domain.replay` does the replaying;
this module says what differs, how far the replay can be trusted (`SelfCheck`: the specs as they were, replayed,
against what was recorded) and what it could not replay (`Limit`s, each counted).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from itertools import pairwise

from reconciler.domain.breaker import signatures_of
from reconciler.domain.capacity import within_bounds
from reconciler.domain.observations import format_time
from reconciler.domain.records import record_time
from reconciler.domain.replay import (
    JUDGED,
    NOT_JUDGED,
    NOT_RENTED,
    Attempt,
    CapacityChange,
    History,
    Judged,
    PoolRun,
    Run,
    Trip,
    attempts,
    replay,
)
from reconciler.domain.spec import FleetSpec

#: Mismatches and flips listed in full; the rest are counted.
LISTED = 50


@dataclass(frozen=True)
class Flip:
    """One attempt whose fate differs between the base run and the PR run."""

    instance_id: str
    machine_id: str
    pool: str | None
    at: datetime  # when history judged it
    stage: str  # admission | serving
    base: str  # the fate under the base spec (a verdict, "not rented", ...)
    pr: str
    rate: float | None  # its measured proofs/h (the benchmark's, or the serving window's)
    price: float | None  # $/h it was rented at (None: not recorded)
    base_min: float | None
    pr_min: float | None
    reason: str  # the PR side's root cause or why it has none

    @property
    def admitted_in_base(self) -> bool:
        return self.base == "ok"

    @property
    def admitted_in_pr(self) -> bool:
        return self.pr == "ok"


@dataclass(frozen=True)
class Hold:
    instance_id: str
    machine_id: str
    pool: str | None
    at: datetime
    held_by: str
    verdict: str


@dataclass(frozen=True)
class PoolTotals:
    """One pool in one run."""

    admitted: int = 0
    rejected: int = 0  # admission verdicts that did not pass
    not_rented: int = 0
    early: int = 0
    trips: int = 0
    holds: int = 0
    gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0
    average_count: float | None = None
    count_min: int | None = None
    count_max: int | None = None
    ups: int = 0
    downs: int = 0
    spend_usd: float = 0.0
    proofs: float = 0.0
    usd_per_proof: float | None = None
    p95_wait_s: float | None = None
    max_wait_s: float | None = None
    recorded_max_wait_s: float | None = None
    paused_steps: int = 0
    exhausted_steps: int = 0
    queue: bool = False


@dataclass(frozen=True)
class PoolDelta:
    pool: str
    base: PoolTotals
    pr: PoolTotals
    #: Machines the PR rejects that passed under the base (and the reverse): how many, their summed measured
    #: proofs/h, their summed $/h (of those with a recorded price) and how many had no price.
    lost: tuple[int, float, float, int] = (0, 0.0, 0.0, 0)
    gained: tuple[int, float, float, int] = (0, 0.0, 0.0, 0)


@dataclass(frozen=True)
class CapacityCheck:
    """Capacity decisions of the replayed specs-as-they-were against the recorded ones."""

    recorded: int = 0
    exact: int = 0  # same pool, counts and sample
    near: int = 0  # same pool and counts, within two samples
    max_shift_s: float = 0.0
    resolution_s: float | None = None  # the samples' median spacing


@dataclass(frozen=True)
class SelfCheck:
    """The replay of the specs as they were, against what was recorded: verdicts, guards, capacity."""

    verdicts: int = 0
    verdicts_matched: int = 0
    holds: int = 0  # recorded kill-budget and breaker holds
    holds_matched: int = 0
    trips: int = 0
    trips_matched: int = 0
    capacity: CapacityCheck = field(default_factory=CapacityCheck)
    mismatches: tuple[tuple[datetime, str], ...] = ()  # the first LISTED, oldest first
    mismatch_count: int = 0

    @property
    def ok(self) -> bool:
        return self.mismatch_count == 0

    @property
    def first(self) -> str | None:
        return f"{format_time(self.mismatches[0][0])} {self.mismatches[0][1]}" if self.mismatches else None


@dataclass(frozen=True)
class Limit:
    count: float
    what: str


@dataclass(frozen=True)
class WhatIf:
    since: datetime
    until: datetime
    attempts: int
    passes: int
    demand_samples: int
    demand_pools: int
    pools: tuple[PoolDelta, ...]
    flips: tuple[Flip, ...]
    flip_count: int
    trips_base_only: tuple[Trip, ...]
    trips_pr_only: tuple[Trip, ...]
    holds_base_only: tuple[Hold, ...]
    holds_pr_only: tuple[Hold, ...]
    self_check: SelfCheck
    limits: tuple[Limit, ...]
    spec_changed: bool  # the PR's spec differs from the base's
    history_specs: int  # spec versions in force over the window

    @property
    def days(self) -> float:
        return (self.until - self.since).total_seconds() / 86400


@dataclass(frozen=True)
class Fate:
    """An attempt's first fate at one stage of one run, as the comparison reads it."""

    word: str  # `fate`: the verdict (and its guard), "not rented", ...
    kind: str  # the verdict alone (a guard holding it is a difference of the guards), else the word
    held_by: str | None  # the guard holding its verdict (None: none, or no verdict)
    judged: bool  # it has a verdict
    reason: str  # its verdict's root cause, or why it has none


@dataclass(frozen=True)
class RunSummary:
    """What the comparison reads of one run, made where the run is: a forked child sends this back, not its run
    (a 10,000-machine run pickles to ~32 MB; this, to a few)."""

    fates: dict[tuple[str, bool], Fate]  # (instance id, serving) -> its first fate at that stage
    holds: tuple[tuple[tuple[str, bool], Hold], ...]  # every held verdict, with its attempt's key
    trips: tuple[Trip, ...]
    totals: dict[str, PoolTotals]  # every pool the comparison shows (`_pool_names`)
    limits: Counter[str]
    passes: int
    not_rented: int  # attempts it would not have rented
    by_pool: Counter[str | None]  # its fates, by the attempt's pool
    unpriced: Counter[str | None]  # its admission fates without a recorded price, by pool


@dataclass(frozen=True)
class RecordedReplay:
    """The specs as they were, replayed: the run's summary and the self-check against what was recorded."""

    summary: RunSummary
    self_check: SelfCheck


@dataclass(frozen=True)
class Runs:
    """The replays a what-if compares, summarized: the specs as they were (the self-check's), the base's and the
    PR's (the same summary where the specs are the same)."""

    self_check: SelfCheck
    base: RunSummary
    pr: RunSummary


def recorded_run(history: History, found: Sequence[Attempt]) -> Run:
    """The specs as they were, replayed (the self-check's run; the base's too where the spec did not change)."""
    return replay(history, history.spec_at, "recorded", found=found)


def recorded_replay(history: History, base: FleetSpec, pr: FleetSpec, found: Sequence[Attempt],
                    run: Run | None = None) -> RecordedReplay:
    """The recorded run (`run`, or replayed here), summarized and checked against history."""
    run = recorded_run(history, found) if run is None else run
    return RecordedReplay(summarize(run, history, base, pr), self_check(history, run, found))


def needs_policy_runs(history: History, base: FleetSpec, pr: FleetSpec) -> bool:
    """Whether any replay beside the recorded one is needed (the spec changed in the window, or the PR changes it)."""
    return not all(_same(v.spec, base) for v in history.specs) or not _same(pr, base)


def policy_runs(history: History, base: FleetSpec, pr: FleetSpec, found: Sequence[Attempt],
                recorded: Run | None) -> tuple[Run | None, Run | None]:
    """(the base's run, the PR's run); None where it is the run before it (the recorded run is the base's where the
    spec did not change in the window; the PR's is the base's where the PR does not change the spec).

    The PR's run takes over the base's candidates and capacity decisions where their inputs are exactly the same
    (`replay`'s `follow`). `recorded`: the recorded run when the caller has it; None when it is being replayed
    elsewhere at the same time (`flows.whatif`): the PR's run then decides everything itself, to the same answer."""
    unchanged = all(_same(v.spec, base) for v in history.specs)
    base_run = None if unchanged else replay(history, lambda _t: base, "base", found=found)
    if _same(pr, base):
        return base_run, None
    lead = recorded if base_run is None else base_run
    return base_run, replay(history, lambda _t: pr, "PR", found=found, follow=lead)


def replays(history: History, base: FleetSpec, pr: FleetSpec, found: Sequence[Attempt]) -> Runs:
    """Every run, one after the other, in this process."""
    recorded = recorded_run(history, found)
    base_run, pr_run = policy_runs(history, base, pr, found, recorded)
    return runs_of(recorded_replay(history, base, pr, found, recorded), *(
        None if run is None else summarize(run, history, base, pr) for run in (base_run, pr_run)))


def runs_of(recorded: RecordedReplay, base: RunSummary | None, pr: RunSummary | None) -> Runs:
    """`Runs` from the recorded replay and `policy_runs`' runs, summarized (None: the run before it)."""
    base_of = base if base is not None else recorded.summary
    return Runs(recorded.self_check, base_of, pr if pr is not None else base_of)


def what_if(history: History, base: FleetSpec, pr: FleetSpec, *, found: Sequence[Attempt] | None = None,
            runs: Runs | None = None) -> WhatIf:
    """The base spec's and the PR's replays of `history`, compared; with the self-check and the limits. `found` and
    `runs`: `attempts(history)` and its replays when the caller has them (`flows.whatif` replays on two cores)."""
    found = attempts(history) if found is None else found
    runs = replays(history, base, pr, found) if runs is None else runs
    base_run, pr_run = runs.base, runs.pr
    flips = _flips(base_run.fates, pr_run.fates, found, base, pr)
    pools = _pool_deltas(history, base_run, pr_run, base, pr, flips)
    return WhatIf(
        since=history.since, until=history.until, attempts=len(found), passes=pr_run.passes,
        demand_samples=sum(len(v) for v in history.demand.values()), demand_pools=len(history.demand),
        pools=pools, flips=tuple(flips[:LISTED]), flip_count=len(flips),
        trips_base_only=_trip_lines(base_run, pr_run), trips_pr_only=_trip_lines(pr_run, base_run),
        holds_base_only=_holds(base_run, pr_run.fates), holds_pr_only=_holds(pr_run, base_run.fates),
        self_check=runs.self_check,
        limits=_limits(history, base_run, pr_run, flips, base, pr),
        spec_changed=not _same(pr, base), history_specs=len(history.specs))


def summarize(run: Run, history: History, base: FleetSpec, pr: FleetSpec) -> RunSummary:
    """What the comparison of `base` and `pr` over `history` reads of `run`."""
    fates: dict[tuple[str, bool], Fate] = {}
    holds: list[tuple[tuple[str, bool], Hold]] = []
    by_pool: Counter[str | None] = Counter()
    unpriced: Counter[str | None] = Counter()
    grouped: dict[str | None, list[Judged]] = {}
    not_rented = 0
    for iid, judged in run.judged.items():
        for j in judged:
            a = j.attempt
            key = (iid, a.serving)
            pool = a.entry.pool
            v = j.verdict
            if key not in fates:
                fates[key] = Fate(fate(j), _kind(j), v.held_by if v is not None else None, v is not None,
                                  v.root_cause() if v is not None else j.why)
            if v is not None and v.held_by is not None:
                holds.append((key, Hold(v.instance_id, a.machine_id, v.pool, v.at, v.held_by, v.verdict)))
            grouped.setdefault(pool, []).append(j)
            by_pool[pool] += 1
            not_rented += j.outcome == NOT_RENTED
            unpriced[pool] += not a.serving and a.entry.price_usd_per_hour is None
    return RunSummary(fates, tuple(holds), tuple(run.trips),
                      {name: _totals(run, name, grouped) for name in _pool_names(history, base, pr)},
                      Counter(run.limits), run.passes, not_rented, by_pool, unpriced)


def _same(a: FleetSpec, b: FleetSpec) -> bool:
    return replace(a, source="", warnings=()) == replace(b, source="", warnings=())


def fate(j: Judged | None) -> str:
    """One word for an attempt's fate in a run."""
    if j is None:
        return "-"
    if j.outcome == JUDGED and j.verdict is not None:
        held = f" (held by {j.verdict.held_by})" if j.verdict.held_by else ""
        return f"{j.verdict.verdict}{held}"
    return {NOT_RENTED: "not rented", NOT_JUDGED: "not judged"}.get(j.outcome, j.outcome)


def _flips(in_base: Mapping[tuple[str, bool], Fate], in_pr: Mapping[tuple[str, bool], Fate],
           found: Sequence[Attempt], base_spec: FleetSpec, pr_spec: FleetSpec) -> list[Flip]:
    """`in_base`, `in_pr`: each run's first fates."""
    out = []
    seen: set[tuple[str, bool]] = set()
    for a in found:
        key = (a.instance_id, a.serving)
        if key in seen:
            continue
        seen.add(key)
        b, p = in_base.get(key), in_pr.get(key)
        if (b.kind if b is not None else "-") == (p.kind if p is not None else "-"):
            continue  # the same verdict (a guard holding it or not is a difference of the guards: `_holds`)
        e = a.entry
        out.append(Flip(
            a.instance_id, a.machine_id, e.pool, a.at, "serving" if a.serving else "admission",
            b.word if b is not None else "-", p.word if p is not None else "-", e.proofs_per_hour,
            e.price_usd_per_hour, _min(base_spec, e.pool), _min(pr_spec, e.pool), p.reason if p is not None else ""))
    return out


def _kind(j: Judged | None) -> str:
    return j.verdict.verdict if j is not None and j.outcome == JUDGED and j.verdict is not None else fate(j)


def _min(spec: FleetSpec, pool: str | None) -> float | None:
    found = spec.find_pool(pool)
    return found.min_rate_proofs_per_hour if found else None


def _totals(run: Run, pool: str, fates: Mapping[str | None, Sequence[Judged]]) -> PoolTotals:
    admitted = rejected = not_rented = early = holds = 0
    for j in fates.get(pool, ()):
        v = j.verdict
        if j.outcome == NOT_RENTED:
            not_rented += 1
        elif j.outcome == JUDGED and v is not None:
            holds += v.held_by is not None
            if not j.attempt.serving:
                admitted += v.verdict == "ok"
                rejected += v.verdict != "ok"
                early += v.verdict == "early-below-min-rate"
    p = run.pools.get(pool) or PoolRun(pool)
    return PoolTotals(
        admitted=admitted, rejected=rejected, not_rented=not_rented, early=early,
        trips=sum(1 for t in run.trips if pool in t.pools or not t.pools), holds=holds,
        gpu_hours=p.gpu_hours, idle_gpu_hours=p.idle_gpu_hours, average_count=p.average_count,
        count_min=p.count_min, count_max=p.count_max,
        ups=sum(1 for c in p.changes if c[2] > c[1]), downs=sum(1 for c in p.changes if c[2] < c[1]),
        spend_usd=p.spend_usd, proofs=p.proofs, usd_per_proof=p.usd_per_proof,
        p95_wait_s=p.wait_quantile(0.95), max_wait_s=p.max_wait_s, recorded_max_wait_s=p.recorded_max_wait_s,
        paused_steps=run.paused.get(pool, 0), exhausted_steps=run.exhausted.get(pool, 0), queue=p.queue)


def _pool_names(history: History, base_spec: FleetSpec, pr_spec: FleetSpec) -> list[str]:
    """The pools the comparison shows: the base's, the PR's new ones, then any other with demand samples."""
    names = [p.name for p in base_spec.pools] + [p.name for p in pr_spec.pools if p.name not in
                                                  {q.name for q in base_spec.pools}]
    return names + sorted({p for p in history.demand if p not in names})


def _pool_deltas(history: History, base: RunSummary, pr: RunSummary, base_spec: FleetSpec, pr_spec: FleetSpec,
                 flips: Sequence[Flip]) -> tuple[PoolDelta, ...]:
    out = []
    for name in _pool_names(history, base_spec, pr_spec):
        lost = [f for f in flips if f.pool == name and f.stage == "admission" and f.admitted_in_base
                and not f.admitted_in_pr]
        gained = [f for f in flips if f.pool == name and f.stage == "admission" and f.admitted_in_pr
                  and not f.admitted_in_base]
        out.append(PoolDelta(name, base.totals[name], pr.totals[name], _sums(lost), _sums(gained)))
    return tuple(out)


def _sums(flips: Sequence[Flip]) -> tuple[int, float, float, int]:
    return (len(flips), sum(f.rate or 0.0 for f in flips), sum(f.price or 0.0 for f in flips),
            sum(1 for f in flips if f.price is None))


def _trip_lines(run: RunSummary, other: RunSummary) -> tuple[Trip, ...]:
    theirs = {(t.image_digest, s) for t in other.trips for s in t.signature.split(", ")}
    return tuple(t for t in run.trips if any((t.image_digest, s) not in theirs for s in t.signature.split(", ")))


def _holds(run: RunSummary, theirs: Mapping[tuple[str, bool], Fate]) -> tuple[Hold, ...]:
    """The holds of `run` the other run (`theirs`: its first fates) does not have."""
    out = []
    for key, hold in run.holds:
        o = theirs.get(key)
        if o is None or not o.judged or o.held_by != hold.held_by:
            out.append(hold)
    return tuple(sorted(out, key=lambda h: h.at))


# --- the self-check ----------------------------------------------------------------------------------------


def self_check(history: History, recorded: Run, found: Sequence[Attempt]) -> SelfCheck:
    """The specs as they were, replayed, against what git recorded: every verdict (kind, blame, bad or not, which
    guard held it) exactly, every breaker trip exactly, every capacity change to the samples' resolution."""
    problems: list[tuple[datetime, str]] = []
    verdicts = matched = holds = holds_matched = 0
    seen: Counter[tuple[str, bool]] = Counter()
    for a in found:
        e = a.entry
        nth = seen[(a.instance_id, a.serving)]
        seen[(a.instance_id, a.serving)] += 1
        mine = [j for j in recorded.judged.get(a.instance_id, ()) if j.attempt.serving == a.serving]
        j = mine[nth] if nth < len(mine) else None
        verdicts += 1
        holds += e.held_by is not None
        want = (e.verdict, e.blame, e.marks_bad, e.held_by)
        got = (j.verdict.verdict, j.verdict.blame, j.verdict.marks_bad, j.verdict.held_by) \
            if j is not None and j.verdict is not None else None
        if got == want:
            matched += 1
            holds_matched += e.held_by is not None
            continue
        what = _verdict_words(*want)
        replayed = _verdict_words(*got) if got is not None else \
            fate(j) + (f" ({j.why})" if j is not None and j.why else "")
        problems.append((a.at, f"instance {a.instance_id} (machine {a.machine_id}, pool {e.pool}): recorded "
                               f"{what}; replayed {replayed}"))
    trips = trips_matched = 0
    replayed_trips = {(t.image_digest, s): t.at for t in recorded.trips for s in t.signature.split(", ")}
    for digest, img in sorted(history.images.items()):
        tripped = record_time(img.tripped_at, naive_as_utc=False)
        if tripped is None or not history.since <= tripped <= history.until:
            continue
        for sig in sorted(signatures_of(img)):
            trips += 1
            if (digest, sig) in replayed_trips:
                trips_matched += 1
            else:
                problems.append((tripped, f"breaker trip of image {digest[:19]} on {sig!r}: recorded, not replayed"))
    recorded_trips = {(d, s) for d, img in history.images.items() for s in signatures_of(img)}
    for (digest, sig), at in sorted(replayed_trips.items(), key=lambda kv: kv[1]):
        if (digest, sig) not in recorded_trips:
            problems.append((at, f"breaker trip of image {digest[:19]} on {sig!r}: replayed, never recorded"))
    capacity, cap_problems = _capacity_check(history, recorded)
    problems += cap_problems
    problems.sort(key=lambda p: p[0])
    return SelfCheck(verdicts, matched, holds, holds_matched, trips, trips_matched, capacity,
                     tuple(problems[:LISTED]), len(problems))


def _verdict_words(verdict: str, blame: str, marks_bad: bool, held_by: str | None) -> str:
    held = f", held by {held_by}" if held_by else ""
    return f"{verdict} (blame {blame}{', bad' if marks_bad else ''}{held})"


def recorded_changes(history: History) -> list[tuple[datetime, str, int, int]]:
    """The capacity changes history made: (time, pool, before, after) of each sample whose pass changed the
    desired count."""
    out = []
    first = history.spec_at(history.since)
    for pool, samples in history.demand.items():
        start = history.capacity_start.get(pool)
        spec_pool = next((p for p in first.pools if p.name == pool), None)
        before = start.desired if start is not None else \
            within_bounds(spec_pool, None)[2] if spec_pool is not None and spec_pool.min_count is not None else None
        for s in samples:
            if before is not None and s.desired != before and s.changed:
                out.append((s.at, pool, before, s.desired))
            before = s.desired
    return sorted(out)


def _capacity_check(history: History, run: Run) -> tuple[CapacityCheck, list[tuple[datetime, str]]]:
    wanted = recorded_changes(history)
    spacing = [(b.at - a.at).total_seconds() for samples in history.demand.values()
               for a, b in pairwise(samples)]
    resolution = statistics.median(spacing) if spacing else None
    reach = 2 * (resolution or 0.0)
    free: dict[tuple[str, int, int], list[CapacityChange]] = {}
    for c in run.capacity:
        free.setdefault((c.pool, c.before, c.after), []).append(c)
    exact = near = 0
    shift = 0.0
    problems = []
    for at, pool, before, after in wanted:
        candidates = free.get((pool, before, after), [])
        best = min(candidates, key=lambda c: abs((c.at - at).total_seconds()), default=None)
        if best is None or abs((best.at - at).total_seconds()) > reach:
            problems.append((at, f"capacity {pool} {before} -> {after}: recorded, not replayed"))
            continue
        candidates.remove(best)
        d = abs((best.at - at).total_seconds())
        exact += d == 0
        near += d > 0
        shift = max(shift, d)
    for left in free.values():
        for c in left:
            problems.append((c.at, f"capacity {c.pool} {c.before} -> {c.after}: replayed, never recorded "
                                   f"({c.reason})"))
    return CapacityCheck(len(wanted), exact, near, shift, resolution), problems


# --- limits ------------------------------------------------------------------------------------------------


def _limits(history: History, base: RunSummary, pr: RunSummary, flips: Sequence[Flip], base_spec: FleetSpec,
            pr_spec: FleetSpec) -> tuple[Limit, ...]:
    out: list[Limit] = []
    for what, n in sorted((pr.limits + _only(base.limits, pr.limits)).items()):
        out.append(Limit(n, what))
    for problem in history.problems:
        out.append(Limit(1, f"not read: {problem}"))
    window = (history.until - history.since).total_seconds()
    for name in sorted({p.name for p in pr_spec.pools} | set(history.demand)):
        samples = history.demand.get(name, ())
        if not samples:
            out.append(Limit(0, f"pool {name}: no demand samples in the window (capacity, work and money not "
                                "replayed)"))
            continue
        covered = sum(s.span_s for s in samples)
        if covered < 0.99 * window:
            out.append(Limit(round(100 * covered / window, 1),
                             f"% of the window is covered by pool {name}'s demand samples (the first from "
                             f"{format_time(samples[0].at - timedelta(seconds=samples[0].span_s))}; gaps are not "
                             "filled)"))
        unpriced = sum(s.unpriced * s.span_s for s in samples) / 3600
        if unpriced > 0:
            out.append(Limit(round(unpriced, 1), f"instance-hours of pool {name} without a recorded price "
                                                 "(counted at the pool's max price)"))
    unknown_price = sum(1 for f in flips if f.price is None)
    if unknown_price:
        out.append(Limit(unknown_price, "flipped machines without a recorded price ($/h shown as ?)"))
    lost = sum(1 for f in flips if f.stage == "admission" and f.admitted_in_base and not f.admitted_in_pr)
    if lost:
        out.append(Limit(lost, "machines the PR rejects: which offer would have filled their slot is not known "
                               "(the market of that time is not recorded)"))
    dropped = pr.not_rented
    if dropped:
        out.append(Limit(dropped, "attempts the PR would not have rented (machine excluded or pool paused): what "
                                  "would have been rented instead is not known"))
    for pool in pr_spec.pools:
        was = next((p for p in base_spec.pools if p.name == pool.name), None)
        if was is not None and pool.max_price_usd_per_hour < was.max_price_usd_per_hour:
            unpriced_attempts = pr.unpriced[pool.name]
            if unpriced_attempts:
                out.append(Limit(unpriced_attempts, f"machines of pool {pool.name} without a recorded price: the PR's "
                                                    "lower max price is not checked for them"))
        if pool.name not in {p.name for p in base_spec.pools}:
            out.append(Limit(0, f"pool {pool.name} is new in this PR: it has no history"))
    for pool in base_spec.pools:
        if pool.name not in {p.name for p in pr_spec.pools}:
            out.append(Limit(pr.by_pool[pool.name],
                             f"verdicts of pool {pool.name}, which this PR removes"))
    return tuple(out)


def _only(a: Counter[str], b: Counter[str]) -> Counter[str]:
    return Counter({k: v for k, v in a.items() if k not in b})


def pools_of(result: WhatIf) -> Mapping[str, PoolDelta]:
    return {p.pool: p for p in result.pools}


def flips_of(result: WhatIf, stage: str) -> Iterable[Flip]:
    return (f for f in result.flips if f.stage == stage)

"""Replay the fleet's own history under a spec, with the decide functions the reconciler runs (pure).

Place in the flow: `flows.whatif` loads the window's history from git (records, human edits, spec versions,
capacity.yaml at the start, demand samples) into a `History`; `replay` walks it in time order under a policy
(`spec_at`: the spec in force at each moment) and returns a `Run`; `domain.whatif` compares the run of the
base spec with the run of the PR's spec, and the run of the specs as they were with what was recorded.

What is re-decided, and with what (never a second implementation of a rule):
- admission: a recorded benchmark with a rate is judged again by `verdict.judge` on a report rebuilt from its
  evidence (result, rate, per-proof seconds), after `serving.judge_early` had its chance at each proof; an early
  verdict is judged again on the proofs it measured. Other verdicts (errors, params, timeouts, stale images)
  do not depend on the spec settings a PR changes: they enter as recorded, before their guards (`unguarded`).
- guards and records: each replayed pass runs `judging.guard_and_record` (circuit breaker, kill budget, expiry,
  probation) on the replay's own records; a human's edit of a record is applied when it happened.
- renting: an attempt whose machine the replay's records exclude when it registered, or whose pool the
  replay's breaker paused for its image, would not have been rented: it is dropped (and counted).
- capacity: at every demand sample, `capacity.decide_signals` decides on the recorded signals, moved by what
  the replay changed (machines the replay has more or fewer than history, work they did or left waiting).
The demand itself is history's: a replay cannot know what the market or curio would have done otherwise.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cached_property
from operator import attrgetter, itemgetter
from typing import Any

from reconciler.domain.breaker import KillBudget, kill_budgets_of_marks
from reconciler.domain.capacity import (
    CapacityEntry,
    DemandSample,
    PoolSignals,
    ScalingSettings,
    SlotState,
    Utilization,
    apply_entries,
    decide_signals,
    demand_history,
    within_bounds,
)
from reconciler.domain.demand import PoolSample, market_of
from reconciler.domain.json_numbers import json_number
from reconciler.domain.judging import guard_and_record
from reconciler.domain.observations import BenchmarkResult, InstanceReport, PhaseEvent, ProofResult, format_time
from reconciler.domain.planner import pool_pause
from reconciler.domain.quick_init import quick_init
from reconciler.domain.records import BenchmarkEntry, ImageSuspectRecord, MachineRecord, RecordSet, record_time
from reconciler.domain.serving import EARLY, SERVING_VERDICTS, FleetHearing, judge_early
from reconciler.domain.spec import FleetSpec, PoolSpec, ServingSettings
from reconciler.domain.verdict import HELD_BY_KILL_BUDGET, Verdict, judge
from reconciler.domain.verdicts import blame_class

#: What happened to one recorded attempt in a replay.
JUDGED = "judged"
NOT_RENTED = "not-rented"  # the replay's records excluded the machine, or its breaker paused the pool
NOT_JUDGED = "not-judged"  # the pool is not in the replayed spec
UNKNOWN = "unknown"  # history cannot say (the benchmark was ended early and the replay would have let it run)
NEVER_SERVED = "never-served"  # a serving verdict on an instance the replay did not admit


# --- history (what flows.whatif loads) -------------------------------------------------------------------


@dataclass(frozen=True)
class RecordEdit:
    """A human's change of a machine or image record within the window (a pardon, a ban, a cleared suspect)."""

    at: datetime
    machine_id: str | None  # one of machine_id / image_digest
    image_digest: str | None
    before: MachineRecord | ImageSuspectRecord | None
    after: MachineRecord | ImageSuspectRecord | None  # None: the file was deleted


@dataclass(frozen=True)
class SpecVersion:
    since: datetime
    spec: FleetSpec


@dataclass(frozen=True)
class History:
    """The window [since, until] of one fleet's history, as git holds it."""

    since: datetime
    until: datetime
    #: Every machine record with an entry in the window (its newest version; a deleted record: its last one).
    machines: Mapping[str, MachineRecord]
    #: Image records as of `until`.
    images: Mapping[str, ImageSuspectRecord]
    edits: tuple[RecordEdit, ...] = ()
    #: The spec in force from each time on (oldest first; the first is in force at `since`).
    specs: tuple[SpecVersion, ...] = ()
    capacity_start: Mapping[str, CapacityEntry] = field(default_factory=dict)
    demand: Mapping[str, tuple[PoolSample, ...]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    def spec_at(self, at: datetime) -> FleetSpec:
        """The spec in force at `at` (the specs as they were: the self-check's policy)."""
        times = [v.since for v in self.specs]
        i = bisect.bisect_right(times, at) - 1
        return self.specs[max(i, 0)].spec


@dataclass(frozen=True)
class Attempt:
    """One recorded verdict in the window, with its machine's identity and its times (read once)."""

    machine_id: str
    host_id: str | None
    gpu_name: str | None
    entry: BenchmarkEntry
    at: datetime  # when it was judged
    registered_at: datetime  # when its instance registered (the judged time if not recorded)

    @property
    def instance_id(self) -> str:
        return self.entry.instance_id

    @cached_property
    def serving(self) -> bool:
        # (asked of every attempt again and again: by each run's passes and fates, and by the comparison)
        return self.entry.stage == "serving" or self.entry.verdict in SERVING_VERDICTS


def attempts(history: History) -> list[Attempt]:
    """The window's recorded verdicts, oldest first (each instance's admission before its serving verdicts)."""
    out = []
    for rec in history.machines.values():
        for e in rec.benchmarks:
            at = _time(e.at)
            if at is not None and history.since <= at <= history.until:
                out.append(Attempt(rec.machine_id, rec.host_id, rec.gpu_name, e, at, _phase(e, "registered") or at))
    out.sort(key=lambda a: (a.at, a.serving, a.instance_id))
    return out


# --- candidates: an attempt's verdict under a spec, before guards ---------------------------------------


@quick_init
@dataclass(frozen=True)
class Candidate:
    """What the judge says of one attempt under one spec: a verdict at a time, or why there is none."""

    attempt: Attempt
    verdict: Verdict | None
    at: datetime
    outcome: str = JUDGED
    why: str = ""
    #: Why the verdict is the recorded one rather than judged again (a limit the output counts), if it is.
    as_recorded: str | None = None


def unguarded(entry: BenchmarkEntry) -> tuple[str, bool, bool]:
    """(blame, marks_bad, derived) of a recorded verdict before the breaker or kill budget held it. `derived`:
    an older record without the judge's own word (`evidence.unguarded`), read back from what the guard did."""
    if entry.held_by is None:
        return entry.blame, entry.marks_bad, False
    kept = entry.evidence.get("unguarded")
    if isinstance(kept, Mapping) and isinstance(kept.get("blame"), str) and isinstance(kept.get("marks_bad"), bool):
        return kept["blame"], kept["marks_bad"], False
    if entry.held_by == HELD_BY_KILL_BUDGET:  # only a verdict that marks bad is held by it; the blame is kept
        return entry.blame, True, True
    sig = entry.evidence.get("signature")
    named = sig.get("blame") if isinstance(sig, Mapping) else None
    blame = named if isinstance(named, str) else entry.blame
    marks = blame_class(blame).marks_machine == "yes" if blame in _BLAMES else False
    return blame, marks, True


def recorded_verdict(attempt: Attempt) -> Verdict:
    """The recorded verdict as the judge gave it, before the fleet's correlation and the guards (which the replay
    runs again): a verdict the correlation decided, held for a retest or left was `unknown` (the correlation
    decides only those); one the breaker or kill budget held has its judge's word kept (`unguarded`)."""
    e = attempt.entry
    blame, marks_bad, _ = unguarded(e)
    ev = e.evidence
    correlation = ev.get("correlation")
    if isinstance(correlation, Mapping) and correlation.get("rule") != "image":
        blame, marks_bad = "unknown", False
    ev = {k: v for k, v in ev.items() if k not in ("correlation", "retest")}
    exit_code = ev.get("exit_code")
    return Verdict(
        instance_id=e.instance_id, verdict=e.verdict, blame=blame, marks_bad=marks_bad, reason=e.reason,
        at=attempt.at, pool=e.pool, machine_id=attempt.machine_id, host_id=attempt.host_id,
        gpu_name=attempt.gpu_name, contract_id=e.contract_id, image_digest=e.image_digest, signature=e.signature,
        phase=ev.get("phase") if isinstance(ev.get("phase"), str) else None,
        exit_code=exit_code if isinstance(exit_code, int) else None, proofs_per_hour=e.proofs_per_hour,
        seconds_per_proof=e.seconds_per_proof, min_rate_proofs_per_hour=e.min_rate_proofs_per_hour,
        setting=ev.get("setting") if isinstance(ev.get("setting"), str) else None,
        evidence={k: v for k, v in ev.items() if k != "unguarded"})  # Verdict.held writes it again


def rated_report(attempt: Attempt) -> InstanceReport | None:
    """The report `verdict.judge` read for a completed benchmark, rebuilt from the entry's evidence (None: the
    entry does not carry its rate)."""
    e = attempt.entry
    ev = e.evidence
    rate = e.proofs_per_hour if e.proofs_per_hour is not None else json_number(ev.get("proofs_per_hour"))
    spp = e.seconds_per_proof if e.seconds_per_proof is not None else json_number(ev.get("seconds_per_proof"))
    if rate is None and not spp:
        return None
    proofs = _mapping(ev.get("proofs"))
    seconds = [json_number(s) for s in proofs.get("seconds") or ()] if isinstance(proofs.get("seconds"), list) else []
    requested = _int(proofs.get("requested")) or len(seconds)
    completed = _int(proofs.get("completed")) or requested
    if not completed:
        return None
    started = _phase(e, "benchmark-started")
    result = BenchmarkResult(
        "completed", _phase(e, "result") or attempt.at, requested, completed, 0, started_at=started,
        exit_code=_int(ev.get("exit_code")), proofs_per_hour=rate, seconds_per_proof=spp,
        concurrency=_int(proofs.get("concurrency")), image_digest=e.image_digest,
        proofs=tuple(ProofResult(i + 1, "COMPLETED", s) for i, s in enumerate(seconds)),
        log_tail=tuple(str(x) for x in ev.get("log_tail") or ()))
    return _report(attempt, result=result, started=started, requested=requested,
                   concurrency=_int(proofs.get("concurrency")))


def _report(attempt: Attempt, *, result: BenchmarkResult | None, started: datetime | None, requested: int,
            concurrency: int | None, proofs: Sequence[tuple[int, bool, float | None, datetime]] = ()) -> InstanceReport:
    e = attempt.entry
    events: list[PhaseEvent] = []
    if started is not None:
        details: dict[str, Any] = {"requested": requested}
        if concurrency:
            details["concurrency"] = concurrency
        events.append(PhaseEvent("benchmark", "started", started, details=details))
    for index, ok, seconds, at in proofs:
        events.append(PhaseEvent("benchmark", "progress", at, details={"proof": {
            "index": index, "label": "COMPLETED" if ok else "FAILED", "seconds": seconds}}))
    return InstanceReport(
        e.instance_id, attempt.registered_at, pool=e.pool, machine_id=attempt.machine_id, host_id=attempt.host_id,
        contract_id=e.contract_id, gpu_name=attempt.gpu_name, image_digest=e.image_digest, events=tuple(events),
        result=result)


def first_early(attempt: Attempt, pool: PoolSpec, spec: FleetSpec,
                samples: Sequence[tuple[int, bool, float | None]], started: datetime, requested: int,
                concurrency: int | None) -> Verdict | None:
    """`serving.judge_early` after each proof of a benchmark (as a pass would have seen them): the first early
    verdict, at the time that proof ended (the proofs' seconds over the concurrency, from the start)."""
    if not spec.early_verdict.enabled:
        return None
    j = concurrency or pool.benchmark.concurrency or 1
    elapsed = 0.0
    seen: list[tuple[int, bool, float | None, datetime]] = []
    for index, ok, seconds in samples:
        elapsed += (seconds or 0.0) / j
        at = started + timedelta(seconds=elapsed)
        seen.append((index, ok, seconds, at))
        report = _report(attempt, result=None, started=started, requested=requested, concurrency=concurrency,
                         proofs=seen)
        verdict = judge_early(report, pool, spec.early_verdict, at)
        if verdict is not None:
            return verdict
    return None


def candidate(attempt: Attempt, spec: FleetSpec, recorded: FleetSpec) -> Candidate:
    """The verdict `attempt` gets under `spec`, before the guards. `recorded`: the spec in force when it was judged
    (a verdict taken as recorded is a limit only where `spec` differs from it in what that verdict depends on)."""
    e = attempt.entry
    pool = spec.find_pool(e.pool)
    if pool is None:
        return Candidate(attempt, None, attempt.at, NOT_JUDGED, f"pool {e.pool!r} is not in the spec")
    then = recorded.find_pool(e.pool)
    if attempt.serving:
        changed = then is None or spec.serving != recorded.serving or \
            pool.min_rate_proofs_per_hour != then.min_rate_proofs_per_hour
        return Candidate(attempt, recorded_verdict(attempt), attempt.at,
                         as_recorded="a serving verdict under other serving settings or another minimum: the "
                                     "heartbeats behind it are not in git" if changed else None)
    if e.verdict in ("ok", "below-min-rate"):
        report = rated_report(attempt)
        if report is None:
            return Candidate(attempt, recorded_verdict(attempt), attempt.at, as_recorded="no rate recorded")
        result = report.result
        assert result is not None
        started = result.started_at  # (rated_report's _phase(e, "benchmark-started"), not parsed again)
        # Under the early-verdict settings and minimum of its time, the early verdict did not come (the loop saw
        # every proof): judged again only where they differ.
        early_may_differ = then is None or spec.early_verdict != recorded.early_verdict or \
            pool.min_rate_proofs_per_hour != then.min_rate_proofs_per_hour
        if early_may_differ and started is not None and result.proofs:
            early = first_early(attempt, pool, spec, [(p.index, True, p.seconds) for p in result.proofs], started,
                                result.requested, result.concurrency)
            if early is not None:
                return Candidate(attempt, early, early.at)
        verdict = judge(report, pool, attempt.at)
        if verdict is None:
            return Candidate(attempt, recorded_verdict(attempt), attempt.at, as_recorded="the judge found no result")
        return Candidate(attempt, verdict, attempt.at)
    if e.verdict == EARLY:
        early_ev = _mapping(e.evidence.get("early"))
        started = _phase(e, "benchmark-started")
        measured = early_ev.get("samples") if isinstance(early_ev.get("samples"), list) else None
        if started is not None and measured:
            samples = [(int(s[0]), bool(s[1]), json_number(s[2])) for s in measured
                       if isinstance(s, list) and len(s) == 3 and isinstance(s[0], int)]
            early = first_early(attempt, pool, spec, samples, started, _int(early_ev.get("requested")) or
                                pool.benchmark.proofs, _int(early_ev.get("concurrency")))
            if early is not None:
                return Candidate(attempt, early, early.at)
            return Candidate(attempt, None, attempt.at, UNKNOWN,
                             "ended early under the spec of its time; its full result was never measured")
        return Candidate(attempt, recorded_verdict(attempt), attempt.at,
                         as_recorded="an early verdict without its proof samples (recorded before they were kept)")
    why = None
    if e.verdict == "timeout" and (then is None or pool.min_rate_proofs_per_hour != then.min_rate_proofs_per_hour
                                   or pool.benchmark.timeout_minutes != then.benchmark.timeout_minutes):
        why = "a timeout under another minimum or deadline: its proofs' times are not all recorded"
    return Candidate(attempt, recorded_verdict(attempt), attempt.at, as_recorded=why)


# --- the replay's records (incremental views for the guards) --------------------------------------------


class ReplayRecords:
    """Machine and image records as the replay goes, with what the guards read kept up to date: when each machine
    was judged (the correlation's and the breaker's windows) and the marks that made machines bad (the kill
    budget's). `view` is a RecordSet holding exactly what `guard_and_record` reads for one pass."""

    def __init__(self, machines: Mapping[str, MachineRecord], images: Mapping[str, ImageSuspectRecord]) -> None:
        self.machines: dict[str, MachineRecord] = dict(machines)
        self.images: dict[str, ImageSuspectRecord] = dict(images)
        self._judged: list[tuple[datetime, str]] = []  # (time, machine) of every recorded verdict
        #: pool -> (machine, pool, at) of its bad marks, by `at` (`RecordSet.bad_marks`' shape: the kill budget's
        #: input)
        self._marks: dict[str | None, list[tuple[str, str | None, str]]] = {}
        self.marks_version = 0  # counts every change of the bad marks (what the kill budget reads)
        self._pool_versions: dict[str | None, int] = {}  # ... of each pool's
        self.version = 0  # counts every change of the machine records (a view is read before the next)
        for rec in self.machines.values():
            self._index(rec, rec.benchmarks)
        self._judged.sort()

    def _index(self, rec: MachineRecord, entries: Iterable[BenchmarkEntry]) -> None:
        for e in entries:
            at = _time(e.at)
            if at is not None:
                bisect.insort(self._judged, (at, rec.machine_id))
            if e.marks_bad:
                bisect.insort(self._marks.setdefault(e.pool, []), (rec.machine_id, e.pool, e.at), key=_mark_at)
                self._marked(e.pool)

    def _marked(self, pool: str | None) -> None:
        self.marks_version += 1
        self._pool_versions[pool] = self._pool_versions.get(pool, 0) + 1

    def pool_marks_version(self, pool: str | None) -> int:
        """Counts every change of the pool's bad marks."""
        return self._pool_versions.get(pool, 0)

    def put(self, rec: MachineRecord) -> None:
        self.version += 1
        old = self.machines.get(rec.machine_id)
        known = len(old.benchmarks) if old is not None else 0
        if old is not None and old.benchmarks != rec.benchmarks[:known]:
            self._reindex(rec)
            return
        self.machines[rec.machine_id] = rec
        self._index(rec, rec.benchmarks[known:])

    def remove(self, machine_id: str) -> None:
        self.marks_version += 1
        self.version += 1
        if self.machines.pop(machine_id, None) is not None:
            self._judged = [f for f in self._judged if f[1] != machine_id]
            for pool, marks in self._marks.items():
                kept = [m for m in marks if m[0] != machine_id]
                if len(kept) != len(marks):
                    self._marks[pool] = kept
                    self._marked(pool)

    def _reindex(self, rec: MachineRecord) -> None:
        self.remove(rec.machine_id)
        self.machines[rec.machine_id] = rec
        self._index(rec, rec.benchmarks)

    def marks_since(self, since: datetime,
                    pools: Iterable[str | None] | None = None) -> list[tuple[str, str | None, str]]:
        """(machine, pool, at) of the bad marks of `pools` (None: every pool) whose time reads at or after two days
        before `since` (every one at or after `since` whatever its offset: `breaker.kill_budgets_of_marks`), each
        pool's oldest first."""
        older = format_time(since - timedelta(days=2))
        out: list[tuple[str, str | None, str]] = []
        for pool in self._marks if pools is None else pools:
            marks = self._marks.get(pool)
            if marks:
                out += marks[bisect.bisect_left(marks, older, key=_mark_at):]
        return out

    def view(self, now: datetime, machine_ids: Iterable[str], judged_hours: float) -> RecordSet:
        """What the guards read at `now` for verdicts on `machine_ids` (the kill budgets aside: `_Guards`): the
        records of those machines and of every machine judged within `judged_hours` (the breaker's and the
        correlation's windows: failures that count against an image, machines that passed it, retests; 0: none);
        the others cannot change what `guard_and_record` decides. And the image records.

        The window's records are gathered when the guards first read beyond the pass's own machines (`_Window`):
        a failing pass mostly reads only its own (no failure that counts against its image, none undecided). The
        view is to be read before the records change again (the pass's guards read it)."""
        own = {m: self.machines[m] for m in sorted(set(machine_ids)) if m in self.machines}
        if not judged_hours:
            return RecordSet(own, dict(self.images))
        return RecordSet(_Window(self, own, now - timedelta(hours=judged_hours)), dict(self.images))

    def within(self, since: datetime, own: Iterable[str]) -> dict[str, MachineRecord]:
        """The records of `own` and of every machine judged at or after `since`, by machine id."""
        wanted = set(own)
        wanted.update(m for _, m in self._judged[bisect.bisect_left(self._judged, (since, "")):])
        return {m: self.machines[m] for m in sorted(wanted) if m in self.machines}

    def excluded(self, machine_id: str, now: datetime) -> bool:
        rec = self.machines.get(machine_id)
        return rec is not None and rec.is_bad_at(now)


class _Window(Mapping[str, MachineRecord]):
    """`ReplayRecords.within(since, own)` as a mapping, gathered on first need: a look-up of one of `own` (the pass's
    own machines) or of a machine without a record does not gather it."""

    __slots__ = ("_all", "_own", "_records", "_since", "_version")

    def __init__(self, records: ReplayRecords, own: dict[str, MachineRecord], since: datetime) -> None:
        self._records, self._own, self._since = records, own, since
        self._version = records.version
        self._all: dict[str, MachineRecord] | None = None

    def _whole(self) -> dict[str, MachineRecord]:
        if self._all is None:
            self._current()
            self._all = self._records.within(self._since, self._own)
        return self._all

    def _current(self) -> None:
        if self._records.version != self._version:
            raise RuntimeError("the replay's records changed after this view was taken")

    def __getitem__(self, machine_id: str) -> MachineRecord:
        found = self._own.get(machine_id)
        if found is not None:
            return found
        if self._all is None:
            self._current()
            if machine_id not in self._records.machines:
                raise KeyError(machine_id)
        return self._whole()[machine_id]

    def __contains__(self, machine_id: object) -> bool:
        if machine_id in self._own:
            return True
        if self._all is None:
            self._current()
            if machine_id not in self._records.machines:
                return False
        return machine_id in self._whole()

    def __iter__(self) -> Iterator[str]:
        return iter(self._whole())

    def __len__(self) -> int:
        return len(self._whole())


def records_at_start(history: History, found: Sequence[Attempt]) -> tuple[dict[str, MachineRecord],
                                                                         dict[str, ImageSuspectRecord]]:
    """The records as they stood at `since`: each record's entries before it (the first in-window human edit's
    version for a record a human changed in the window), its status as those entries and an operator's word left
    it; image records that tripped before it, without the instances added in the window."""
    edited = {e.machine_id: e for e in reversed(history.edits) if e.machine_id is not None}
    machines: dict[str, MachineRecord] = {}
    for machine_id, rec in history.machines.items():
        edit = edited.get(machine_id)
        base = edit.before if edit is not None and isinstance(edit.before, MachineRecord) else rec
        if edit is not None and edit.before is None:
            continue  # created by a human within the window: it did not exist at the start
        before = tuple(e for e in base.benchmarks if (_time(e.at) or history.since) < history.since)
        status = base.status if base.status in ("banned", "pardoned") and edit is None else "ok"
        start = MachineRecord(machine_id, status, base.host_id, base.gpu_name, base.note)
        for e in before:
            start = start.with_entry(e, host_id=None, gpu_name=None)
        if edit is not None and isinstance(edit.before, MachineRecord) and edit.before.status in ("banned",
                                                                                               "pardoned"):
            start = replace(start, status=edit.before.status)
        if start.benchmarks or start.status != "ok":
            machines[machine_id] = start
    window = {a.instance_id for a in found}
    images_edited = {e.image_digest: e for e in reversed(history.edits) if e.image_digest is not None}
    images: dict[str, ImageSuspectRecord] = {}
    for digest, img in history.images.items():
        edit = images_edited.get(digest)
        base_img = edit.before if edit is not None and isinstance(edit.before, ImageSuspectRecord) else img
        tripped = _time(base_img.tripped_at)
        if tripped is None or tripped >= history.since:
            continue
        images[digest] = replace(base_img, instances=tuple(i for i in base_img.instances if i not in window))
    return machines, images


# --- capacity: the recorded demand, moved by what the replay changed ------------------------------------


@dataclass
class PoolRun:
    """One pool through one replay: capacity, work, money."""

    pool: str
    samples: int = 0
    seconds: float = 0.0  # time the samples cover
    gpu_hours: float = 0.0  # rented GPU-hours
    busy_gpu_hours: float = 0.0
    spend_usd: float = 0.0
    proofs: float = 0.0
    unpriced_hours: float = 0.0  # instance-hours priced at the pool's max price (no price recorded)
    rented_seconds: float = 0.0  # instance-seconds rented (the average count)
    count_min: int | None = None
    count_max: int | None = None
    changes: list[tuple[datetime, int, int, str]] = field(default_factory=list)  # (at, before, after, direction)
    waits: list[tuple[float, float]] = field(default_factory=list)  # (wait seconds, tasks)
    max_wait_s: float | None = None
    recorded_max_wait_s: float | None = None  # the oldest waiting task any sample saw (history's own word)
    backlog_end: float = 0.0  # tasks the replay left waiting beyond history's at the end (negative: fewer)
    unserved_busy_s: float = 0.0  # busy machine-seconds a pool without a queue had no machine for
    queue: bool = False  # the samples carry a queue

    @property
    def idle_gpu_hours(self) -> float:
        return max(0.0, self.gpu_hours - self.busy_gpu_hours)

    @property
    def usd_per_proof(self) -> float | None:
        return self.spend_usd / self.proofs if self.proofs > 0 else None

    @property
    def average_count(self) -> float | None:
        return self.rented_seconds / self.seconds if self.seconds > 0 else None

    def wait_quantile(self, q: float) -> float | None:
        """The wait of the task at quantile `q` of all tasks (FIFO; None without a queue or tasks)."""
        total = sum(map(itemgetter(1), self.waits))
        if total <= 0:
            return None
        need = q * total
        run = 0.0
        # By wait alone: tasks with the same wait give the same answer in any order (a pool's ~14,000 shares).
        for wait, weight in sorted(self.waits, key=itemgetter(0)):
            run += weight
            if run >= need - 1e-9:
                return wait
        return max(w for w, _ in self.waits)


@dataclass
class _PoolState:
    """What one pool's replay carries from sample to sample."""

    gaps: list[tuple[datetime, int]] = field(default_factory=list)  # (time, replay desired - history's desired)
    backlog: float = 0.0  # tasks waiting in the replay beyond history's (negative: fewer)
    ends: list[datetime] = field(default_factory=list)  # tile ends
    cum: list[tuple[float, float]] = field(default_factory=list)  # running (busy, wall) over the tiles
    arrival_at: list[datetime] = field(default_factory=list)  # cumulative task arrivals: times ...
    arrived: list[float] = field(default_factory=list)  # ... and counts
    departed: float = 0.0  # tasks the replay has started, in arrival order
    waiting: int | None = None  # history's waiting tasks at the previous sample
    rate: float | None = None  # proofs per busy machine-second, as recently measured
    history: tuple[DemandSample, ...] = ()  # the replay's own decisions' demand samples (the leader's memory)


def _gap_now(state: _PoolState) -> int:
    return state.gaps[-1][1] if state.gaps else 0


def _serving_gap(state: _PoolState, now: datetime, cold: timedelta) -> int:
    """Machines serving in the replay beyond history's (negative: fewer): the smallest gap of desired counts over
    the last cold start (a machine rented serves once its cold start has passed; one given up is gone at once)."""
    low = None
    since = now - cold
    for at, gap in reversed(state.gaps):
        if low is None or gap < low:  # (min without a call: ~7 gaps a sample, 100,000 samples a replay)
            low = gap
        if at <= since:
            break
    return low or 0


class _SlotValues:
    """One pool's slot states by state and slot index, each made once: a slot in a state is the same value every
    time, so a replay's slot states are picked from lists instead of made again."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self._made: dict[str, list[SlotState]] = {}

    def take(self, state: str, indices: Sequence[int]) -> list[SlotState]:
        """The states of the slots `indices` (distinct, in ascending order) in `state`."""
        made = self._made.setdefault(state, [])
        for i in range(len(made), indices[-1] + 1 if indices else 0):
            made.append(SlotState(f"{self.pool}-{i}", i, None if state == "empty" else f"{self.pool}-{i}", state))
        if indices and indices[-1] - indices[0] == len(indices) - 1:  # a run of indices (the usual): a slice
            return made[indices[0]:indices[-1] + 1]
        return list(map(made.__getitem__, indices))


def _synth_slots(pool: PoolSpec, entry: CapacityEntry | None, serving: int, on_the_way: int,
                 draining_serving: int, values: _SlotValues | None = None,
                 bounds: tuple[tuple[int, ...], tuple[int, ...], int] | None = None) -> tuple[tuple[SlotState, ...],
                                                                                           dict[str, int]]:
    """Slot states for the replay's entry from counts: serving first, then on the way, then empty; draining slots
    serving as many as history had, the rest stopped. Samples keep counts, not which index was which. With them,
    how many slots are in each state (`PoolSignals.counts`: only states that have slots, as a Counter has them).
    `values`: the pool's slot states to reuse; `bounds`: `within_bounds(pool, entry)` when the caller has it."""
    slots, draining, _ = within_bounds(pool, entry) if bounds is None else bounds
    made = _SlotValues(pool.name) if values is None else values
    # within_bounds gives both in index order, draining a part of slots.
    drained = set(draining)
    active = [i for i in slots if i not in drained] if draining else slots
    # In index order, the k-th active slot serves while k < serving, is on its way while k < serving + on_the_way.
    up = max(0, serving)
    way = max(up, serving + on_the_way)
    picked = [("serving", active[:up]), ("on-the-way", active[up:way]), ("empty", active[way:])]
    if draining:  # the k-th draining slot serves while k < draining_serving, the others stopped
        kept = max(0, draining_serving)
        picked += [("serving", draining[:kept]), ("stopped", draining[kept:])]
    out: list[SlotState] = []
    counts: dict[str, int] = {}
    for state, indices in picked:
        if indices:
            out += made.take(state, indices)
            counts[state] = counts.get(state, 0) + len(indices)
    if draining:
        out.sort(key=attrgetter("index"))  # back in slot order
    return tuple(out), counts


class _Memo:
    """What a replay computes again and again from the same few inputs (a pool's bounds applied to its entry, the
    slot states of the same counts): computed once per distinct input. Entries change only at decisions."""

    def __init__(self) -> None:
        #: Per pool: the pool and entry last asked of, and their bounds.
        self._last: dict[str, tuple[PoolSpec, CapacityEntry | None, tuple[tuple[int, ...], tuple[int, ...], int]]] = {}
        #: (pool, id of its bounds, counts) -> (those bounds, the slot states, their counts)
        self._slots: dict[tuple[object, ...], tuple[tuple[tuple[int, ...], tuple[int, ...], int],
                                                    tuple[SlotState, ...], dict[str, int]]] = {}
        self._values: dict[str, _SlotValues] = {}
        self._fixed: dict[tuple[object, ...], PoolSpec] = {}
        self._hearing: tuple[tuple[object, ...], FleetHearing] | None = None  # the last one made, and of what

    def bounds(self, pool: PoolSpec, entry: CapacityEntry | None) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """`within_bounds(pool, entry)`: cached on their values, and here on the very objects, which a step asks of
        several times (the pool's ~250 slots take longer to hash than the check that they are the ones)."""
        last = self._last.get(pool.name)
        if last is not None and last[0] is pool:
            held = last[1]
            # The same entry, or one a decision made again with the very slots and draining tuples (decide_pool
            # keeps within_bounds' own when it moves none): within_bounds reads nothing else of it.
            if held is entry or (held is not None and entry is not None and held.slots is entry.slots
                                 and held.draining is entry.draining and held.desired == entry.desired):
                return last[2]
        found = within_bounds(pool, entry)
        self._last[pool.name] = (pool, entry, found)  # held: an object's id is not reused while it lives
        return found

    def hearing(self, at: datetime, lost_after_minutes: float, heard_s: float | None, back_s: float | None,
                silent_s: float | None) -> FleetHearing:
        """The fleet's hearing as a sample had it (the fleet's: the pools sampled at one pass share it, so it is made
        once per pass, not once per pool)."""
        key = (at, lost_after_minutes, heard_s, back_s, silent_s)
        if self._hearing is None or self._hearing[0] != key:
            self._hearing = key, FleetHearing(
                at, timedelta(minutes=lost_after_minutes),
                ((at - timedelta(seconds=heard_s), ""),) if heard_s is not None else (),
                at - timedelta(seconds=back_s) if back_s is not None else None,
                timedelta(seconds=silent_s) if silent_s is not None else None)
        return self._hearing[1]

    def desired(self, pool: PoolSpec, entries: Mapping[str, CapacityEntry]) -> int:
        return pool.count if pool.min_count is None else self.bounds(pool, entries.get(pool.name))[2]

    def fixed(self, pool: PoolSpec, entries: Mapping[str, CapacityEntry]) -> PoolSpec:
        """An autoscaled pool as a fixed count at its desired (what the spend cap reads of a pool not decided)."""
        desired = self.desired(pool, entries)
        key = ("fixed", pool.name, pool.max_price_usd_per_hour, desired)
        found = self._fixed.get(key)
        if found is None:
            found = self._fixed[key] = replace(pool, count=desired, min_count=None, max_count=None)
        return found

    def slots(self, pool: PoolSpec, entry: CapacityEntry | None, serving: int, on_the_way: int,
              draining_serving: int) -> tuple[tuple[SlotState, ...], dict[str, int]]:
        bounds = self.bounds(pool, entry)  # all _synth_slots reads of the entry
        # Keyed on the very bounds object (`bounds` hands the same one while the entry's slots stay, and the cache
        # of within_bounds for the same values): hashing the pool's ~250 slots at every step cost more. The value
        # holds the object, so its id is not reused while the key is here.
        key = (pool.name, id(bounds), serving, on_the_way, draining_serving)
        found = self._slots.get(key)
        if found is None or found[0] is not bounds:
            if len(self._slots) > 20_000:  # a fleet of 40 autoscaled pools cycles through ~10,000 of them
                self._slots.clear()
            values = self._values.get(pool.name) or self._values.setdefault(pool.name, _SlotValues(pool.name))
            found = self._slots[key] = (bounds, *_synth_slots(pool, entry, serving, on_the_way, draining_serving,
                                                              values, bounds))
        return found[1], found[2]


def _window(state: _PoolState, now: datetime, window_s: float) -> tuple[float, float]:
    """(busy, wall) machine-seconds of the replay's tiles that end in (now - window, now]."""
    if not state.cum:
        return 0.0, 0.0
    i = bisect.bisect_right(state.ends, now - timedelta(seconds=window_s))
    top = state.cum[-1]
    below = state.cum[i - 1] if i > 0 else (0.0, 0.0)
    return top[0] - below[0], top[1] - below[1]


def _arrival_time(state: _PoolState, index: float) -> datetime | None:
    """When the `index`-th task arrived (arrivals spread evenly within a tile)."""
    if not state.arrived:
        return None
    i = bisect.bisect_left(state.arrived, index)
    if i <= 0:
        return state.arrival_at[0]
    if i >= len(state.arrived):
        return state.arrival_at[-1]
    v0, v1 = state.arrived[i - 1], state.arrived[i]
    t0, t1 = state.arrival_at[i - 1], state.arrival_at[i]
    return t0 + (t1 - t0) * ((index - v0) / (v1 - v0) if v1 > v0 else 1.0)


# --- the run -----------------------------------------------------------------------------------------------


@dataclass
class Judged:
    """One attempt's fate in a replay."""

    attempt: Attempt
    outcome: str
    verdict: Verdict | None = None
    why: str = ""
    as_recorded: str | None = None


@dataclass(frozen=True)
class Trip:
    at: datetime
    image_digest: str
    signature: str
    pools: tuple[str, ...]
    machines: tuple[str, ...]


@quick_init
@dataclass(frozen=True)
class CapacityChange:
    at: datetime
    pool: str
    before: int
    after: int
    direction: str
    reason: str


@dataclass
class Run:
    """A whole replay under one policy."""

    label: str
    judged: dict[str, list[Judged]] = field(default_factory=dict)  # instance id -> its fates, admission first
    trips: list[Trip] = field(default_factory=list)
    pools: dict[str, PoolRun] = field(default_factory=dict)
    capacity: list[CapacityChange] = field(default_factory=list)
    passes: int = 0
    steps: int = 0
    limits: Counter[str] = field(default_factory=Counter)
    paused: Counter[str] = field(default_factory=Counter)  # capacity steps a pool spent paused by the breaker
    #: (instance, serving, time) -> its candidate and the spec it was judged under (a later run may reuse it).
    candidates: dict[tuple[str, bool, datetime], tuple[Candidate, FleetSpec]] = field(default_factory=dict)
    #: (pool, time) -> (the inputs, the entry decided, before, after) of decisions on history's own signals.
    decisions: dict[tuple[str, datetime], tuple[tuple[object, ...], CapacityEntry, int, int,
                                                DemandSample | None]] = field(default_factory=dict)
    exhausted: Counter[str] = field(default_factory=Counter)  # ... with its kill budget exhausted

    def admission(self, instance_id: str) -> Judged | None:
        return next((j for j in self.judged.get(instance_id, ()) if not j.attempt.serving), None)

    def fates(self) -> Iterable[Judged]:
        for fates in self.judged.values():
            yield from fates


def measured_cold_starts(found: Sequence[Attempt]) -> dict[str, timedelta]:
    """Per pool, the median time from registration to a passing admission verdict (how long a new machine took
    to serve); pools where none passed in the window are left out."""
    spans: dict[str, list[float]] = {}
    for a in found:
        if a.entry.pool and not a.serving and a.entry.verdict == "ok" and a.at > a.registered_at:
            spans.setdefault(a.entry.pool, []).append((a.at - a.registered_at).total_seconds())
    return {pool: timedelta(seconds=sorted(v)[len(v) // 2]) for pool, v in spans.items()}


def replay(history: History, spec_at: Callable[[datetime], FleetSpec], label: str, *,
           found: Sequence[Attempt] | None = None, follow: Run | None = None) -> Run:
    """History under the policy `spec_at` (the spec in force at each moment). `follow`: an earlier run of the same
    history whose capacity decisions this one takes where its inputs are exactly the same (`_capacity_step`)."""
    found = attempts(history) if found is None else found
    run = Run(label)
    machines, images = records_at_start(history, found)
    records = ReplayRecords(machines, images)
    entries: dict[str, CapacityEntry] = dict(history.capacity_start)
    cold = measured_cold_starts(found)
    pools: dict[str, _PoolState] = {}
    memo = _Memo()
    guards = _Guards()
    start_spec, then = spec_at(history.since), history.spec_at(history.since)
    for pool in start_spec.pools:  # machines the policy has beyond history's from the start (its own bounds)
        was = then.find_pool(pool.name)
        if was is not None:
            gap = memo.desired(pool, entries) - memo.desired(was, entries)
            pools[pool.name] = _PoolState(gaps=[(history.since, gap)])

    # In time order; at one moment: human edits, rentals, the verdict pass, then capacity (as a pass orders them).
    events: list[tuple[datetime, int, int, Any]] = [(e.at, 0, i, e) for i, e in enumerate(history.edits)]
    passes: dict[datetime, list[Candidate]] = {}
    for a in found:
        spec = spec_at(a.at)
        c = _reused_candidate(follow, a, spec) or candidate(a, spec, history.spec_at(a.at))
        run.candidates[(a.instance_id, a.serving, a.at)] = (c, spec)
        passes.setdefault(c.at, []).append(c)
        if not a.serving:
            events.append((a.registered_at, 1, len(events), c))
    events += [(at, 2, len(events) + i, group) for i, (at, group) in enumerate(passes.items())]
    steps: dict[datetime, dict[str, PoolSample]] = {}
    for pool_name, samples in history.demand.items():
        for sample in samples:
            steps.setdefault(sample.at, {})[pool_name] = sample
    events += [(at, 3, len(events) + i, group) for i, (at, group) in enumerate(steps.items())]
    events.sort(key=lambda e: (e[0], e[1], e[2]))

    dropped: set[str] = set()
    admitted: dict[str, Judged] = {}
    for at, kind, _, payload in events:
        if kind == 0:
            _apply_edit(records, payload)
        elif kind == 1:
            why = _not_rented(records, payload, spec_at(at), at)
            if why is not None:
                dropped.add(payload.attempt.instance_id)
                run.judged.setdefault(payload.attempt.instance_id, []).append(
                    Judged(payload.attempt, NOT_RENTED, why=why))
        elif kind == 2:
            _verdict_pass(run, records, guards, entries, payload, at, spec_at(at), admitted, dropped)
        else:
            _capacity_step(run, records, entries, payload, at, spec_at(at), pools, cold, memo, guards, follow)
    for name, state in pools.items():
        if name in run.pools:
            _finish_waits(run.pools[name], state, history.until)
    return run


def _reused_candidate(follow: Run | None, a: Attempt, spec: FleetSpec) -> Candidate | None:
    """The earlier run's candidate for `a`, when what `candidate` reads of the spec is the same (its pool, the
    early-verdict and serving settings): the same judge on the same report gives the same verdict."""
    if follow is None:
        return None
    kept = follow.candidates.get((a.instance_id, a.serving, a.at))
    if kept is None:
        return None
    c, then = kept
    name = a.entry.pool
    if (spec.find_pool(name), spec.early_verdict, spec.serving) != \
            (then.find_pool(name), then.early_verdict, then.serving):
        return None
    return c


def _apply_edit(records: ReplayRecords, edit: RecordEdit) -> None:
    """A human's edit, kept on the replay's own records: the operator's status and note, and only the entries the
    human kept (the replay's own version of each, where it has one)."""
    if edit.machine_id is not None:
        if not isinstance(edit.after, MachineRecord):
            records.remove(edit.machine_id)
            return
        mine = records.machines.get(edit.machine_id)
        ours = {e.instance_id: e for e in mine.benchmarks} if mine is not None else {}
        records.put(replace(edit.after, benchmarks=tuple(ours.get(e.instance_id, e) for e in edit.after.benchmarks)))
    elif edit.image_digest is not None:
        if not isinstance(edit.after, ImageSuspectRecord):
            records.images.pop(edit.image_digest, None)
            return
        mine_img = records.images.get(edit.image_digest)
        records.images[edit.image_digest] = edit.after if mine_img is None else replace(
            mine_img, status=edit.after.status, note=edit.after.note)


def _not_rented(records: ReplayRecords, c: Candidate, spec: FleetSpec, at: datetime) -> str | None:
    """Why the replay would not have rented this attempt's machine when it registered (None: it would have)."""
    a = c.attempt
    if records.excluded(a.machine_id, at):
        return f"machine {a.machine_id} was excluded then ({records.machines[a.machine_id].standing(at).detail})"
    digest, pool = a.entry.image_digest, a.entry.pool
    price, spec_pool = a.entry.price_usd_per_hour, spec.find_pool(pool)
    if price is not None and spec_pool is not None and price > spec_pool.max_price_usd_per_hour + 1e-9:
        return f"its ${price:.2f}/h is above the pool's max price ${spec_pool.max_price_usd_per_hour:.2f}/h"
    if digest and pool and spec_pool is not None:
        pause = pool_pause(pool, RecordSet(images=records.images), digest)
        if pause is not None:
            return f"pool {pool} was paused: image {digest[:19]} suspect ({pause.signature})"
    return None


def _verdict_pass(run: Run, records: ReplayRecords, guards: _Guards, entries: Mapping[str, CapacityEntry],
                  group: Sequence[Candidate], at: datetime, spec: FleetSpec, admitted: dict[str, Judged],
                  dropped: set[str]) -> None:
    verdicts: list[Verdict] = []
    kept: dict[str, Candidate] = {}
    for c in group:
        iid = c.attempt.instance_id
        if iid in dropped:
            continue
        if c.attempt.serving:
            admission = admitted.get(iid)
            if admission is not None and (admission.verdict is None or admission.verdict.verdict != "ok"):
                run.judged.setdefault(iid, []).append(Judged(c.attempt, NEVER_SERVED,
                                                             why="not admitted in this replay"))
                continue
        if c.verdict is None:
            j = Judged(c.attempt, c.outcome, why=c.why)
            run.judged.setdefault(iid, []).append(j)
            if not c.attempt.serving:
                admitted[iid] = j
            continue
        if c.as_recorded:
            run.limits[f"taken as recorded: {c.as_recorded}"] += 1
        verdicts.append(c.verdict)
        kept[iid] = c
    if not verdicts:
        return
    run.passes += 1
    # A pass of passing verdicts reads only its own machines' records (a retest's outcome is on the machine's
    # own); a failure reads the breaker's and the correlation's window: what `guard_and_record` can read for these
    # verdicts, nothing more (most passes pass). The kill budgets are the ones the replay keeps (`_Guards`).
    failing = any(v.is_failure for v in verdicts)
    view = records.view(at, {v.machine_id for v in verdicts if v.machine_id},
                        max(spec.circuit_breaker.window_hours, spec.retest.window_hours) if failing else 0.0)
    guarded, changed, _ = guard_and_record(guards.applied(spec, entries), view, verdicts, at,
                                           budgets=guards.budgets(spec, entries, records, at))
    for v in guarded.verdicts:
        c = kept[v.instance_id]
        j = Judged(c.attempt, JUDGED, v, as_recorded=c.as_recorded)
        run.judged.setdefault(v.instance_id, []).append(j)
        if not c.attempt.serving:
            admitted[v.instance_id] = j
    for rec in changed.values():
        records.put(rec)
    stamp = format_time(at)
    for digest, img in guarded.image_records.items():
        before = records.images.get(digest)
        records.images[digest] = img
        if img.active and img.tripped_at == stamp and (before is None or not before.active
                                                       or before.signature != img.signature):
            run.trips.append(Trip(at, digest, img.signature, img.pools, img.machines))


def _capacity_step(run: Run, records: ReplayRecords, entries: dict[str, CapacityEntry],
                   samples: Mapping[str, PoolSample], at: datetime, spec: FleetSpec,
                   pools: dict[str, _PoolState], cold: Mapping[str, timedelta], memo: _Memo,
                   guards: _Guards, follow: Run | None) -> None:
    """One pass's capacity: each sampled pool's tile accounted, then `decide_signals` on the replay's signals.

    `follow`: an earlier run of the same history (the base's) whose decisions this one takes over wherever it
    would decide on exactly the same inputs: the pool's spec, its entry, history's own signals (no machine and no
    task more or less than history), the same guards, and no spend cap tying the pools together."""
    run.steps += 1
    ranged: dict[str, tuple[PoolSpec, PoolSample, _PoolState, int]] = {}  # autoscaled pools sampled now
    own: set[str] = set()  # pools deciding on history's own signals
    sampled: list[tuple[PoolSpec, PoolSample, _PoolState]] = []  # the pools sampled now, in spec order
    for pool in spec.pools:
        sample = samples.get(pool.name)
        if sample is None:
            continue
        state = pools.get(pool.name) or pools.setdefault(pool.name, _PoolState())  # (made only when missing)
        sampled.append((pool, sample, state))
        start = cold.get(pool.name) or timedelta(minutes=pool.scaling.cold_start_minutes if pool.scaling else 15.0)
        serving_gap = _serving_gap(state, at, start)
        # Instances billed beyond history's: the replay's slots beyond history's (each slot holds an instance
        # unless history's was empty), so a pool draining in history is not counted twice.
        slots = pool.count if pool.min_count is None else len(memo.bounds(pool, entries.get(pool.name))[0])
        prun = run.pools.get(pool.name) or run.pools.setdefault(pool.name, PoolRun(pool.name))
        _account(prun, state, pool, sample, serving_gap,
                 max(slots - sample.slots, -sample.rented), at)
        if pool.min_count is not None:
            ranged[pool.name] = (pool, sample, state, serving_gap)
            if serving_gap == 0 and _gap_now(state) == 0 and abs(state.backlog) < 1e-9:
                own.add(pool.name)
    if ranged:
        images = RecordSet(images=records.images)
        # (no image suspect: no pool is paused, and nothing to look up for each)
        paused = [name for name in ranged if pool_pause(name, images, _digest(records, samples[name]))] \
            if any(img.active for img in records.images.values()) else []
        spent = guards.exhausted(spec, entries, records, at)
        exhausted = [name for name in ranged if name in spent]
        run.paused.update(paused)
        run.exhausted.update(exhausted)
        decided: list[tuple[str, CapacityEntry, int, int, DemandSample | None]] = []  # (pool, entry, before, after,
        # the decision's own demand sample)
        reused: set[str] = set()
        if follow is not None and spec.max_total_dph is None:
            for name in own:
                kept = follow.decisions.get((name, at))
                key = (_entry_key(entries.get(name)), ranged[name][0], name in paused, name in exhausted, None)
                if kept is not None and kept[0] == key:
                    reused.add(name)
                    decided.append((name, kept[1], kept[2], kept[3], kept[4]))
        # The signals only of the pools deciding (a reused decision's signals were history's own).
        deciding_signals = {name: _signals(pool, entries.get(name), sample, state, serving_gap, at, memo,
                                           spec.serving)
                            for name, (pool, sample, state, serving_gap) in ranged.items() if name not in reused}
        if deciding_signals:
            # Each pool is decided at its own samples: one not sampled now decided no change at this pass (a change
            # is always sampled). With a spend cap it enters as a fixed count at its desired (all the cap reads of
            # it); without one the others do not enter the decision at all.
            if spec.max_total_dph is None:
                deciding = replace(spec, pools=tuple(p for p in spec.pools if p.name in deciding_signals))
            else:
                deciding = replace(spec, pools=tuple(
                    p if p.name in deciding_signals or p.min_count is None else memo.fixed(p, entries)
                    for p in spec.pools))
            keys = {n: (_entry_key(entries.get(n)), ranged[n][0], n in paused, n in exhausted, spec.max_total_dph)
                    for n in deciding_signals}
            for d in decide_signals(deciding, entries, deciding_signals, at, paused_pools=paused,
                                    exhausted_pools=exhausted):
                decided.append((d.pool, d.entry, d.before, d.after, d.sample))
                if d.pool in own:
                    run.decisions[(d.pool, at)] = (keys[d.pool], d.entry, d.before, d.after, d.sample)
        for name, entry, before, after, demand in decided:
            if demand is not None:  # remembered as the leader's memory remembers it (flows.judge.DemandHistory)
                scaling = ranged[name][0].scaling or ScalingSettings()
                keep = timedelta(minutes=max(scaling.scale_up_after_minutes, scaling.scale_down_after_minutes))
                kept_state = pools[name]
                kept_state.history = demand_history((*kept_state.history, demand), demand.at, keep)
            if _entry_key(entries.get(name)) != _entry_key(entry):
                guards.entry_changed(name)
            entries[name] = entry
            if after != before:
                run.capacity.append(CapacityChange(at, name, before, after, entry.direction or "", entry.reason))
                run.pools[name].changes.append((at, before, after, entry.direction or ""))
    for pool, sample, state in sampled:
        state.gaps.append((at, memo.desired(pool, entries) - sample.desired))


def _entry_key(entry: CapacityEntry | None) -> tuple[object, ...] | None:
    """What of an entry a decision reads: its counts, slots, and the last change (the cooldown)."""
    return None if entry is None else (entry.desired, entry.slots, entry.draining, entry.changed_at, entry.direction)


class _Guards:
    """What the passes read of the guards, kept between them: the spec with the replay's capacity
    entries applied (again only when an entry changed) and each pool's kill budget (`breaker.kill_budgets`, again
    for a pool only when a bad mark of it was added or removed, or one left the window; the pool's allowance
    follows its count)."""

    def __init__(self) -> None:
        self._spec_id: int | None = None  # the spec the applied pools and budgets below are of
        self._dirty: set[str] = set()  # pools whose entry changed since they were applied
        self._applied: FleetSpec | None = None
        self._pools: dict[tuple[object, ...], PoolSpec] = {}  # (pool, its entry) -> the pool applied
        self._marks_spec: int | None = None  # the spec the kill budgets' marks below were read under
        self._marks_seen = -1  # the records' marks_version then
        self._seen: dict[str, int] = {}  # pool -> its marks' version when its budget was read
        self._leaves: dict[str, datetime] = {}  # pool -> when a mark of its budget leaves the window (read again)
        self._until: datetime | None = None  # the first of those
        self._used: dict[str, tuple[str, ...]] = {}
        self._budgets: dict[str, KillBudget] | None = None
        self._exhausted_of: Mapping[str, KillBudget] | None = None  # the budgets `_exhausted` was read from
        self._exhausted: frozenset[str] = frozenset()

    def entry_changed(self, pool: str) -> None:
        """Called by whoever changes a pool's capacity entry."""
        self._dirty.add(pool)

    def applied(self, spec: FleetSpec, entries: Mapping[str, CapacityEntry]) -> FleetSpec:
        """`capacity.apply_entries(spec, entries)`, pool by pool: only a pool whose entry changed is applied again
        (a change touches one pool; applying every pool again cost a fleet's slots each time)."""
        if self._spec_id != id(spec) or self._applied is None:
            self._spec_id, self._applied, self._budgets = id(spec), None, None
            self._dirty = {p.name for p in spec.pools}
        if self._dirty:
            dirty, self._dirty = self._dirty, set()
            before = self._applied.pools if self._applied is not None else spec.pools
            pools = [self._pool(spec, pool, entries) if pool.name in dirty else now
                     for pool, now in zip(spec.pools, before, strict=True)]
            self._applied = replace(spec, pools=tuple(pools))
            if self._budgets is not None:  # a new mapping: a pass may still hold the one `budgets` gave it
                self._budgets = {**self._budgets,
                                 **{p.name: self._budget(self._applied, p) for p in pools if p.name in dirty}}
        assert self._applied is not None
        return self._applied

    def _pool(self, spec: FleetSpec, pool: PoolSpec, entries: Mapping[str, CapacityEntry]) -> PoolSpec:
        entry = entries.get(pool.name) if pool.min_count is not None else None
        # What `apply_entries` reads of an entry (`within_bounds`: its counts and slots, not when or why it changed):
        # a pool's entries cycle through a few of those.
        pool_key = (id(pool), None if entry is None else (entry.desired, entry.slots, entry.draining))
        found = self._pools.get(pool_key)
        if found is None:
            if len(self._pools) > 20_000:
                self._pools.clear()
            one = {pool.name: entry} if entry is not None else {}
            found = self._pools[pool_key] = apply_entries(replace(spec, pools=(pool,)), one).pools[0]
        return found

    def _budget(self, applied: FleetSpec, pool: PoolSpec) -> KillBudget:
        """A pool's kill budget: its allowance follows its applied count."""
        return KillBudget(pool.name, applied.kill_budget.allowed(pool.count), self._used.get(pool.name, ()))

    def budgets(self, spec: FleetSpec, entries: Mapping[str, CapacityEntry], records: ReplayRecords,
                at: datetime) -> Mapping[str, KillBudget]:
        """`breaker.kill_budgets` of the applied spec on the replay's records at `at`, from the replay's own marks
        and pool by pool (the rule reads a pool's own marks against its own allowance): read again for the pools
        whose marks changed or one of whose marks left the window since."""
        applied = self.applied(spec, entries)
        if id(spec) != self._marks_spec:
            self._marks_spec, self._seen, self._leaves = id(spec), {}, {}
        elif self._budgets is not None and records.marks_version == self._marks_seen and self._until is not None \
                and at <= self._until:
            return self._budgets
        stale = [p for p in applied.pools if self._seen.get(p.name) != records.pool_marks_version(p.name)
                 or at > self._leaves[p.name]]
        if stale:
            window = timedelta(hours=spec.kill_budget.window_hours)
            names = [p.name for p in stale]
            budgets = kill_budgets_of_marks(replace(applied, pools=tuple(stale)),
                                            records.marks_since(at - window, names), at)
            for name in names:
                self._used[name] = budgets[name].used
                self._seen[name] = records.pool_marks_version(name)
                times = [_time(when) for _, _, when in records.marks_since(at - window, (name,))]
                self._leaves[name] = min((t + window for t in times if t is not None and t + window >= at),
                                         default=at + window)
            if self._budgets is not None:  # a new mapping: a pass may still hold the one given before
                self._budgets = {**self._budgets, **{p.name: self._budget(applied, p) for p in stale}}
        self._marks_seen = records.marks_version
        self._until = min(self._leaves.values(), default=None)
        if self._budgets is None:
            self._budgets = {p.name: self._budget(applied, p) for p in applied.pools}
        return self._budgets

    def exhausted(self, spec: FleetSpec, entries: Mapping[str, CapacityEntry], records: ReplayRecords,
                  at: datetime) -> frozenset[str]:
        budgets = self.budgets(spec, entries, records, at)
        if budgets is not self._exhausted_of:  # (a new mapping whenever a budget changed: read once per mapping)
            self._exhausted_of, self._exhausted = budgets, frozenset(n for n, b in budgets.items() if b.exhausted)
        return self._exhausted


def _digest(records: ReplayRecords, sample: PoolSample) -> str | None:
    """The full digest of the image record a sample's short desired digest names (None: none)."""
    if not sample.image:
        return None
    return next((d for d in records.images if d.removeprefix("sha256:").startswith(sample.image)), None)


def _account(prun: PoolRun, state: _PoolState, pool: PoolSpec, s: PoolSample, serving_gap: int, rented_gap: int,
             at: datetime) -> None:
    """One tile of work and money: history's, moved by the machines the replay had beyond history's.

    More machines serving take waiting tasks (never more than were waiting); fewer leave the work that did not
    fit on the others waiting (a pool without a queue: unserved), done later in their idle time. Work is timed at
    the pool's own recent proofs per busy machine-second. With no gap and no backlog the tile is history's, exactly."""
    span, busy_s, proofs = s.span_s, s.busy_s, s.proofs  # (read once each: the same values, locals)
    if busy_s > 0 and proofs > 0:
        measured = proofs / busy_s
        state.rate = measured if state.rate is None else 0.8 * state.rate + 0.2 * measured
    rate, backlog = state.rate, state.backlog
    per_task_s = 1.0 / rate if rate else 3600.0 / max(pool.min_rate_proofs_per_hour, 1e-9)
    waiting = s.total_waiting
    active = max(0, s.serving - s.draining_serving)
    done = 0.0  # tasks the replay finished beyond history's in this tile
    if serving_gap > 0:
        done = min(serving_gap * span / per_task_s, max(0.0, waiting + backlog))
    elif serving_gap < 0:
        room = max(0, active + serving_gap) * span
        overflow = max(0.0, busy_s - room)
        done = -overflow / per_task_s
        if s.waiting is None:
            prun.unserved_busy_s += overflow
        if backlog > 0:
            done += min(max(0.0, room - busy_s) / per_task_s, backlog)
    elif backlog > 0:
        done = min(max(0.0, active * span - busy_s) / per_task_s, backlog)
    state.backlog = max(backlog - done, -float(waiting))
    busy = max(0.0, busy_s + done * per_task_s)
    wall = max(busy, s.wall_s + serving_gap * span)
    state.ends.append(at)
    cum = state.cum
    last = cum[-1] if cum else (0.0, 0.0)
    cum.append((last[0] + busy, last[1] + wall))
    billed, usd, gpus = s.rented, s.usd_per_hour, pool.gpus_per_instance  # (rented: a sum, made once)
    rented = max(0, billed + rented_gap)
    per_instance = usd / billed if billed else pool.max_price_usd_per_hour
    prun.samples += 1
    prun.seconds += span
    prun.rented_seconds += rented * span
    prun.gpu_hours += rented * gpus * span / 3600
    prun.busy_gpu_hours += busy * gpus / 3600
    prun.spend_usd += max(0.0, usd + rented_gap * per_instance) * span / 3600
    prun.unpriced_hours += s.unpriced * span / 3600
    prun.proofs += max(0.0, proofs + done)
    prun.count_min = rented if prun.count_min is None else min(prun.count_min, rented)
    prun.count_max = rented if prun.count_max is None else max(prun.count_max, rented)
    if s.waiting is not None:
        prun.queue = True
        _waits(prun, state, s, at, waiting)


def _waits(prun: PoolRun, state: _PoolState, s: PoolSample, at: datetime, waiting: int) -> None:
    """Task waits, first in first out: tasks arrive as history's did (done + the queue's growth) and leave in
    the replay when its queue (history's + the backlog) no longer holds them. Departures are spread evenly over
    the tile; each tile adds the waits of its first, middle and last departing task."""
    # `waiting`: s.total_waiting (the caller has it)
    if not state.arrived:  # the tasks waiting at the first sample arrived before the window: not counted
        state.arrival_at.append(at - timedelta(seconds=s.span_s))
        state.arrived.append(0.0)
        state.departed = 0.0
        state.waiting = waiting
    total = state.arrived[-1] + max(0.0, s.proofs + waiting - (state.waiting or 0))
    state.arrival_at.append(at)
    state.arrived.append(total)
    state.waiting = waiting
    if s.oldest_wait_s is not None:
        prun.recorded_max_wait_s = max(prun.recorded_max_wait_s or 0.0, s.oldest_wait_s)
    left = max(0.0, total - max(0.0, waiting + state.backlog))
    if left > state.departed:
        start = at - timedelta(seconds=s.span_s)
        _add_waits(prun, state, state.departed, left, start, at)
        state.departed = left


def _add_waits(prun: PoolRun, state: _PoolState, first: float, last: float, start: datetime, end: datetime) -> None:
    if not state.arrived:  # (no arrival known: no wait to add)
        return
    n = last - first
    weight = n / 3
    # When each share left: the start, the middle and the end (start + span * 0.0 and * 1.0 are start and end
    # exactly; a timedelta times a float is not cheap, three times a sample).
    for share, left in ((0.0, start), (0.5, start + (end - start) * 0.5), (1.0, end)):
        index = first + share * n
        arrived = _arrival_time(state, index)
        if arrived is None:
            continue
        wait = max(0.0, (left - arrived).total_seconds())
        prun.waits.append((wait, weight))
        prun.max_wait_s = wait if prun.max_wait_s is None else max(prun.max_wait_s, wait)


def _finish_waits(prun: PoolRun, state: _PoolState, until: datetime) -> None:
    """Tasks still waiting at the end have waited until then (at least)."""
    prun.backlog_end = state.backlog
    if state.arrived and state.arrived[-1] > state.departed:
        _add_waits(prun, state, state.departed, state.arrived[-1], until, until)


def _signals(pool: PoolSpec, entry: CapacityEntry | None, s: PoolSample, state: _PoolState, serving_gap: int,
             at: datetime, memo: _Memo, serving: ServingSettings) -> PoolSignals:
    """What the capacity decision reads at this sample in the replay: history's own signals where the replay has
    not moved away from history (its windows, no machine more or less, no task more or less waiting); otherwise
    rebuilt from the replay's tiles (heartbeat intervals counted whole in the tile where they end: windows to the
    resolution of the tiles)."""
    scaling = pool.scaling
    up_s = (scaling.scale_up_after_minutes if scaling else 10.0) * 60.0
    down_s = (scaling.scale_down_after_minutes if scaling else 30.0) * 60.0
    same = serving_gap == 0 and abs(state.backlog) < 1e-9
    machines = max(0, s.serving - s.draining_serving + serving_gap)
    up = s.up if same and s.up is not None and math.isclose(s.up.window_s, up_s) else \
        Utilization(*_window(state, at, up_s), machines, up_s)
    down = s.down if same and s.down is not None and math.isclose(s.down.window_s, down_s) else \
        Utilization(*_window(state, at, down_s), machines, down_s)
    queue = s.queue(at)
    if queue is not None and queue.error is None and abs(state.backlog) >= 1e-9:
        total = max(0, round(s.total_waiting + state.backlog))
        oldest = _arrival_time(state, state.arrived[-1] - total) if total > 0 and state.arrived else None
        queue = replace(queue, waiting=_spread(dict(s.waiting or {}), total, pool), oldest_waiting_at=oldest)
    on_the_way = max(0, s.on_the_way + (_gap_now(state) - serving_gap))
    # The fleet's hearing as the pass had it, judged with the replayed spec's lost_after.
    hearing = memo.hearing(at, serving.lost_after_minutes, s.heard_s, s.back_s, s.silent_s)
    market = None
    if s.market is not None and pool.queue is not None and pool.queue.market is not None:
        settings = pool.queue.market
        market = market_of(s.market, at, settings.usd_per_fil, settings.min_margin)
    # The demand the leader remembered: the replay's own samples, as far back as the leader's memory reached.
    reach = timedelta(seconds=s.memory_s) if s.memory_s is not None else None
    history = tuple(h for h in state.history if at - h.at <= reach) if reach is not None else ()
    slots, counts = memo.slots(pool, entry, machines, on_the_way, s.draining_serving)
    heard: tuple[SlotState, ...] = ()  # the slots carrying heard_at (PoolSignals.heard): the one set here, if any
    if s.quiet_s is not None:  # the serving machine heard longest ago, as the pass saw it (the others: just now;
        # the counts of states hold)
        first = next((k for k, slot in enumerate(slots) if slot.state == "serving"), None)
        if first is not None:
            heard = (replace(slots[first], heard_at=at - timedelta(seconds=s.quiet_s)),)
            slots = (*slots[:first], heard[0], *slots[first + 1:])
    return PoolSignals(up, down, queue, slots, hearing, market, history, serving.heartbeat_minutes * 60.0, counts,
                       heard)


def _spread(waiting: dict[str, int], total: int, pool: PoolSpec) -> dict[str, int]:
    """`total` waiting tasks over the task types as history's waiting ones were (largest remainder)."""
    have = sum(waiting.values())
    if have <= 0:
        kind = pool.queue.task_types[0] if pool.queue and pool.queue.task_types else "PoRep"
        return {kind: total} if total else {}
    shares = {k: v * total / have for k, v in waiting.items()}
    out = {k: int(v) for k, v in shares.items()}
    for k in sorted(shares, key=lambda k: shares[k] - out[k], reverse=True)[:total - sum(out.values())]:
        out[k] += 1
    return out


# --- helpers ---------------------------------------------------------------------------------------------

_BLAMES = ("none", "machine", "image", "network", "params", "configuration", "marketplace", "unknown")


_mark_at = itemgetter(2)  # a bad mark's time, as recorded


def _time(text: str | None) -> datetime | None:
    return record_time(text, naive_as_utc=False)


def _phase(entry: BenchmarkEntry, name: str) -> datetime | None:
    phases = entry.evidence.get("phases")
    return _time(phases.get(name)) if isinstance(phases, Mapping) and isinstance(phases.get(name), str) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None

"""The reconcile pass as named steps: observe -> load -> evidence -> decide -> capacity -> directives -> publish.

Each step is a function with a typed input and result (Flux's ordered sub-reconcilers); `run_pass` runs them in
order and writes one summary, the `PassResult`, once. The decisions inside the steps are pure and take `now`
(`domain.judging.decide`, `domain.capacity.decide_all`, `domain.serving.directives`).

- observe: the worker reports, from the controller store (the `ReportSource` port), before the tree is synced;
- load: spec, records, capacity entries and what the history already judged, from the fleet tree (the
  `FleetTree` port, a unit of work as cosmicpython's: `adapters.fleet_tree.GitFleetTree` over git, a fake in
  tests). The tree calls back with a `FleetTreeView` of its freshly synced tip, so a human's pardon merged a
  second ago is respected; after a refused push it syncs again and the steps run again on the new tip;
- evidence: the instances about to be judged get their whole stored log ring instead of the report's tail;
- decide: verdicts, record changes, breaker and kill budget (`domain.judging.decide`);
- capacity: the autoscaled pools' counts (`domain.capacity.decide_all`) and the new capacity.yaml;
- demand (a thin hook on capacity, the leader only): each pool's demand sample for `fleet plan --what-if`
  (`flows.demand.DemandRecorder`), committed with the pass;
- directives: what each live worker is told (serve, stop, wait, drain);
- publish: the commit (records + capacity.yaml) pushed by the tree, then the directives stored.
"""

from __future__ import annotations

import gc
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

from reconciler.adapters.capacity_files import CAPACITY_FILE, render_capacity
from reconciler.adapters.collector import collector_paused
from reconciler.adapters.git import CommitRequest, FileChange, GitStoreError, PublishResult, TemporaryGitError
from reconciler.adapters.record_files import render_image_record, render_machine_record
from reconciler.domain import errors
from reconciler.domain.capacity import (
    CapacityDecision,
    CapacityEntry,
    DemandSample,
    QueueSnapshot,
    capacity_json,
    capacity_summary,
    capacity_trailers,
    decide_all,
    demand_history,
    hearing_for,
)
from reconciler.domain.demand import PoolSample
from reconciler.domain.due import DirectiveMemory, JudgeMemory, decide_due, directives_due
from reconciler.domain.errors import READY, RECONCILING, STALLED, STANDBY, Condition
from reconciler.domain.judging import (
    INSTANCE_TRAILER,
    SERVING_TRAILER,
    JudgedSets,
    PassDecision,
    awaiting_evidence,
    judged_sets,
)
from reconciler.domain.leadership import LeaseLost, leader_trailer
from reconciler.domain.observations import InstanceReport, format_time, parse_time
from reconciler.domain.planner import pool_pause
from reconciler.domain.records import (
    IMAGES_DIR,
    MACHINES_DIR,
    ImageSuspectRecord,
    RecordSet,
)
from reconciler.domain.redact import redact_line, redact_lines
from reconciler.domain.serving import FleetSignals, last_signal
from reconciler.domain.snark_market import MarketMiss
from reconciler.domain.spec import FleetSpec, QueueSource, ScalingSettings, SpecError
from reconciler.domain.verdict import Verdict
from reconciler.flows.demand import DemandRecorder, demand_trailers

SPEC_DIR = "fleet-spec"
SPEC_FILE = f"{SPEC_DIR}/fleet.yaml"


# --- ports ---------------------------------------------------------------------------------------------


class ReportSource(Protocol):
    """What the controller store offers the loop. Any exception it raises is an observation failure."""

    def reports(self) -> Sequence[InstanceReport]: ...


@runtime_checkable
class LogRingSource(Protocol):
    """A report source that can also give an instance's whole stored log ring (the controller store, SQLite or
    PostgreSQL): the evidence of the instances judged this pass. Without it, judging reads each report's tail."""

    def log_rings(self, instance_ids: Sequence[str]) -> Mapping[str, Sequence[str]]: ...


class StoreChanges(Protocol):
    """A change feed's answer (adapters/store `StoreChanges`)."""

    @property
    def sequence(self) -> int: ...

    @property
    def instance_ids(self) -> Sequence[str]: ...

    @property
    def complete(self) -> bool: ...


@runtime_checkable
class ChangeFeed(Protocol):
    """A report source that keeps a change sequence (both controller stores, `ControllerStore.changes_since`): a
    warm pass reads the reports of the instances written to since the sequence its memory holds, not all of them."""

    def changes_since(self, since: int) -> StoreChanges: ...

    def reports_of(self, instance_ids: Sequence[str]) -> Sequence[InstanceReport]: ...


class DirectiveSink(Protocol):
    """Where the directives for workers go (the controller store; workers read them over HTTP)."""

    def set_directives(self, directives: Mapping[str, Mapping[str, Any]], now: datetime, *,
                       fence: Callable[[Any], None] | None = None) -> int: ...


class FleetTreeView(Protocol):
    """The fleet tree at the tip the pass works on. Each read raises what its adapter raises: `spec()` a
    SpecError for a spec a human must fix (the pass stalls); the others only on a broken clone."""

    #: The spec directory inside the repository (`fleet-spec`): where the files a commit writes go.
    spec_dir: str

    def spec(self) -> FleetSpec: ...

    def records(self) -> RecordSet: ...

    def capacity(self) -> Mapping[str, CapacityEntry]: ...

    def trailer_values(self, key: str) -> frozenset[str]: ...

    def text(self, path: str) -> str | None:
        """A file under `spec_dir` at this tip (None: there is none): the demand recorder's day files."""
        ...

    def names(self, directory: str) -> list[str]:
        """The files under `spec_dir`/`directory` at this tip, as paths relative to `spec_dir`."""
        ...


class FleetTree(Protocol):
    """The fleet repository as one pass's unit of work (`adapters.fleet_tree.GitFleetTree`; a fake in tests).

    `publish` brings the tree to the branch tip, calls `build` with a view of it, and commits and pushes the
    request `build` returns (nothing for None: no empty commits). When the push is refused it brings the tree to
    the new tip and calls `build` again, so the change is recomputed over a human's edit, never rebased blindly
    over it. `before_push` runs right before each push (a replica's lease check) and may raise to push nothing.
    Raises TemporaryGitError (retry next pass), GitStoreError (stall) or what `before_push` raised."""

    def publish(self, build: Callable[[FleetTreeView], CommitRequest | None], *,
                before_push: Callable[[], None] | None = None) -> PublishResult: ...


class QueueReader(Protocol):
    """curio's task queue (adapters.curio_queue.CurioQueue); failures come back as the snapshot's error."""

    def read(self, source: QueueSource) -> QueueSnapshot: ...


@dataclass(frozen=True)
class LeaderTerm:
    """The leadership term a pass runs in, when replicas share a PostgreSQL store (the embedded store has none).

    `fence` asks the database whether this replica still holds the lease in `epoch` and raises LeaseLost if
    not; the pass calls it right before the push. `store_fence` is the same check inside the store's transaction
    that writes the directives (it holds the lease row until that commits)."""

    epoch: int
    fence: Callable[[], None]
    store_fence: Callable[[Any], None] | None = None


# --- the summary ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PassResult:
    """What one pass did. Exactly one of stalled / observation_error / error is set when it did not finish."""

    at: datetime
    verdicts: tuple[Verdict, ...] = ()
    commit: str | None = None
    pushed: bool = False
    attempts: int = 0
    pending: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    stalled: str | None = None  # permanent: bad spec, unusable clone; a human must act
    observation_error: str | None = None  # the controller store failed: nothing judged
    error: str | None = None  # temporary: fetch/push failed, or the lease was lost (`not-leader: ...`); retried
    reason: str | None = None  # the error taxonomy's reason constant when the pass did not finish
    image_records: tuple[ImageSuspectRecord, ...] = ()  # image-suspect records this pass wrote
    publish_seconds: float | None = None  # wall time of commit + push (with retries), when it committed
    capacity: tuple[CapacityDecision, ...] = ()  # autoscaled pools: signals and what was decided this pass
    standby: str | None = None  # a replica that does not lead: nothing judged or written; who leads instead
    #: Seconds per step (observe, load, evidence, decide, capacity, directives, render, publish: git and the store).
    steps: tuple[tuple[str, float], ...] = ()

    @property
    def breaker_trips(self) -> tuple[ImageSuspectRecord, ...]:
        """Image-suspect records that tripped in this pass (not ones that only grew by another machine)."""
        return tuple(r for r in self.image_records if r.active and r.tripped_at == format_time(self.at))

    @property
    def ok(self) -> bool:
        return self.stalled is None and self.observation_error is None and self.error is None

    def headline(self) -> str:
        if self.standby:
            return f"standby: {self.standby}"
        if self.stalled:
            return f"stalled: {self.stalled}"
        if self.observation_error:
            return f"observation failed, nothing judged: {self.observation_error}"
        if self.error:
            return self.error if self.reason == errors.LEASE_LOST else f"will retry: {self.error}"
        recorded = [v for v in self.verdicts if v.machine_id]
        if self.commit:
            return f"committed {self.commit[:12]}: {len(recorded)} verdict(s); {len(self.pending)} pending"
        return f"nothing new; {len(self.pending)} pending"

    def condition(self, previous: Mapping[str, Any] | None = None) -> Condition:
        """The pass as a Flux-style condition. `since` is kept from the previous pass's condition while type,
        status and reason stay the same (Kubernetes' lastTransitionTime), so "stalled since 09:14" is visible."""
        if self.stalled:
            kind, reason, message = STALLED, self.reason or errors.SPEC_INVALID, self.stalled
        elif self.observation_error:
            kind, reason, message = RECONCILING, errors.OBSERVATION_FAILED, self.observation_error
        elif self.error:
            kind, reason, message = RECONCILING, self.reason or errors.GIT_FAILED, self.error
        elif self.standby:
            kind, reason, message = READY, STANDBY, self.headline()
        else:
            kind, reason, message = READY, "Succeeded", self.headline()
        since = self.at
        if previous and (previous.get("type"), previous.get("reason")) == (kind, reason):
            since = parse_time(str(previous.get("since"))) or self.at
        return Condition(kind, "True", reason, message, since)

    def to_json(self, previous_condition: Mapping[str, Any] | None = None) -> dict[str, Any]:
        c = self.condition(previous_condition)
        return {
            "condition": {"type": c.type, "status": c.status, "reason": c.reason, "message": c.message,
                          "since": format_time(c.since)},
            "at": format_time(self.at), "ok": self.ok, "headline": self.headline(), "commit": self.commit,
            "pushed": self.pushed, "attempts": self.attempts, "pending": list(self.pending),
            "notes": list(self.notes), "stalled": self.stalled, "observation_error": self.observation_error,
            "error": self.error, "standby": self.standby,
            "steps": {name: round(seconds, 4) for name, seconds in self.steps},
            "capacity": [capacity_json(d, self.at) for d in self.capacity],
            "verdicts": [{"instance_id": v.instance_id, "machine_id": v.machine_id, "pool": v.pool,
                          "verdict": v.verdict, "blame": v.blame, "marks_bad": v.marks_bad,
                          "held_by": v.held_by, "root_cause": v.root_cause()} for v in self.verdicts],
        }



# --- the steps and their results -----------------------------------------------------------------------


@dataclass(frozen=True)
class Halted:
    """A step that could not go on: the pass judges and writes nothing. `stalled`: permanent (a human must act:
    a bad spec); otherwise the observation failed and the next pass tries again."""

    reason: str
    message: str
    stalled: bool = False

    def result(self, at: datetime, attempts: int = 0) -> PassResult:
        if self.stalled:
            return PassResult(at=at, stalled=self.message, reason=self.reason, attempts=attempts)
        return PassResult(at=at, observation_error=self.message, reason=self.reason, attempts=attempts)


@dataclass(frozen=True)
class Observed:
    """observe: every worker report (by instance id), read before the tree is synced. `changed`: the instances
    written to since the pass whose state `memory` holds (None: every one is new to this pass: no memory, a
    restart, a new leader, a source without a change sequence); `sequence`: the store's change sequence that
    covers (None without one)."""

    reports: Mapping[str, InstanceReport]
    changed: frozenset[str] | None = None
    sequence: int | None = None

    @classmethod
    def of(cls, reports: Iterable[InstanceReport]) -> Observed:
        """Every report new to the pass (a full read)."""
        return cls(_by_id(reports))

    @cached_property
    def all(self) -> tuple[InstanceReport, ...]:
        return tuple(self.reports.values())


def observe(source: ReportSource, memory: PassMemory | None = None) -> Observed | Halted:
    """The reports. With a memory and a store that keeps a change sequence (`ChangeFeed`), only the instances
    written to since the memory's pass are read, and the memory holds the rest; else one bulk read."""
    try:
        if memory is None or not isinstance(source, ChangeFeed):
            return Observed.of(source.reports())
        changes = source.changes_since(memory.sequence)
        if changes.complete or not memory.reports:  # a restart, a new leader, another store: one bulk read
            return Observed(_by_id(source.reports()), None, changes.sequence)
        fresh = source.reports_of(list(changes.instance_ids)) if changes.instance_ids else ()
        return Observed({**memory.reports, **_by_id(fresh)}, frozenset(changes.instance_ids), changes.sequence)
    except Exception as exc:  # any failure to observe must never become a verdict
        return Halted(errors.OBSERVATION_FAILED, f"{type(exc).__name__}: {exc}")


def _by_id(reports: Iterable[InstanceReport]) -> dict[str, InstanceReport]:
    return {r.instance_id: r for r in reports}


@dataclass(frozen=True)
class Loaded:
    """load: what the fleet tree says at the tip the pass works on."""

    spec: FleetSpec
    records: RecordSet
    capacity: Mapping[str, CapacityEntry]
    spec_dir: str
    judged: frozenset[str]  # Fleet-Instance trailers: instances judged at admission
    judged_serving: frozenset[str]  # Fleet-Serving-Instance trailers: instances judged while serving

    @cached_property
    def sets(self) -> JudgedSets:
        """What the history judged, from the trailers and the records."""
        return judged_sets(self.records, self.judged, self.judged_serving)


def load(view: FleetTreeView) -> Loaded | Halted:
    try:
        spec = view.spec()
    except SpecError as exc:
        return Halted(exc.reason, str(exc), stalled=True)
    return Loaded(spec, view.records(), view.capacity(), view.spec_dir, view.trailer_values(INSTANCE_TRAILER),
                  view.trailer_values(SERVING_TRAILER))


@dataclass(frozen=True)
class Evidence:
    """evidence: the reports decide reads (those it judges carry their whole stored log ring) and which instances
    are due this pass (None: every one)."""

    reports: Mapping[str, InstanceReport]
    due: frozenset[str] | None = None
    changed: frozenset[str] | None = None  # `Observed.changed`


def gather_evidence(source: ReportSource, observed: Observed, loaded: Loaded, inputs: PassInputs, now: datetime,
                    memory: PassMemory | None = None) -> Evidence | Halted:
    due = None
    if memory is not None and memory.judge is not None and observed.changed is not None:
        found = memory.judge.due(loaded.spec, inputs.desired_image_digest, loaded.sets, observed.changed,
                                 observed.reports, now)
        due = frozenset(found) if found is not None else None
    candidates = observed.all if due is None else [observed.reports[i] for i in due]
    try:
        awaiting = awaiting_evidence(loaded.spec, candidates, loaded.sets.judged, now)
        reports = observed.reports
        if awaiting and isinstance(source, LogRingSource):
            rings = source.log_rings(awaiting)
            reports = {**reports, **{i: replace(reports[i], log_tail=tuple(rings[i])) for i in awaiting
                                     if rings.get(i)}}
    except Exception as exc:  # judging on part of the evidence could blame the wrong one: judge nothing
        return Halted(errors.OBSERVATION_FAILED, f"{type(exc).__name__}: {exc}")
    return Evidence(reports, due, observed.changed)


def decide_step(loaded: Loaded, evidence: Evidence, inputs: PassInputs, now: datetime,
                memory: PassMemory | None = None, queues: Mapping[str, QueueSnapshot] | None = None) -> Decided:
    """decide: `judging.decide` over the due instances (every one without a memory), and what to remember of it.
    `queues`: curio's snapshots of the pass (the Snark Market's missed deadlines are serving evidence)."""
    heard = None  # each worker's last signal: the memory's, brought up to date (else worked out from every report)
    if memory is not None and memory.judge is not None and evidence.changed is not None:
        heard = {**memory.last_heard, **{i: last_signal(evidence.reports[i]) for i in evidence.changed
                                         if i in evidence.reports}}
    fleet = FleetSignals(tuple(evidence.reports.values()), heard)
    decision, remembered = decide_due(
        loaded.spec, evidence.reports, evidence.due, loaded.records, loaded.judged, inputs.desired_image_digest, now,
        judged_serving_ids=loaded.judged_serving, memory=memory.judge if memory is not None else None, fleet=fleet,
        sets=loaded.sets, market_misses=market_misses(queues or {}), prices=inputs.prices)
    return Decided(decision, remembered, fleet.last_heard())


@dataclass(frozen=True)
class Decided:
    """decide's result: the decision, and what the next warm pass starts from (each worker's last signal too)."""

    decision: PassDecision
    memory: JudgeMemory
    last_heard: Mapping[str, datetime]


@dataclass(frozen=True)
class CapacityPlan:
    """capacity: each autoscaled pool's decision, and capacity.yaml when anything changed (None: unchanged)."""

    decisions: tuple[CapacityDecision, ...] = ()
    file: FileChange | None = None


class DemandHistory:
    """Each pool's demand samples of the recent passes, kept in the leader's memory between passes: the capacity
    step reads them ("waiting work above target for the whole window") and adds its own. A replica that becomes
    leader starts without them, and for one window grows on the queue's task ages and utilization alone."""

    def __init__(self) -> None:
        self._samples: dict[str, tuple[DemandSample, ...]] = {}

    def samples(self) -> Mapping[str, Sequence[DemandSample]]:
        return dict(self._samples)

    def record(self, spec: FleetSpec, decisions: Sequence[CapacityDecision]) -> None:
        """This pass's samples, keeping back to the longest window of each pool (one per pass time)."""
        for d in decisions:
            if d.sample is None or d.pool not in {p.name for p in spec.pools}:
                continue
            scaling = spec.pool(d.pool).scaling or ScalingSettings()
            keep = timedelta(minutes=max(scaling.scale_up_after_minutes, scaling.scale_down_after_minutes))
            self._samples[d.pool] = demand_history((*self._samples.get(d.pool, ()), d.sample), d.sample.at, keep)


def read_queues(spec: FleetSpec, queue_reader: QueueReader | None) -> dict[str, QueueSnapshot]:
    """curio's queue (and Snark Market) of every autoscaled pool with a `queue:` source; failures are snapshots
    with an error, never exceptions."""
    out = {}
    for pool in spec.pools:
        if pool.min_count is not None and pool.queue is not None:
            out[pool.name] = (queue_reader.read(pool.queue) if queue_reader is not None
                              else QueueSnapshot(error="no queue reader in this process"))
    return out


def market_misses(queues: Mapping[str, QueueSnapshot]) -> dict[str, tuple[MarketMiss, ...]]:
    """Per instance (the curio node's name), the Snark Market runs that missed their deadline on it."""
    out: dict[str, list[MarketMiss]] = {}
    for snapshot in queues.values():
        for miss in snapshot.market.misses if snapshot.market is not None else ():
            if miss.machine_name:
                out.setdefault(miss.machine_name, []).append(miss)
    return {name: tuple(found) for name, found in out.items()}


def capacity_step(spec: FleetSpec, entries: Mapping[str, CapacityEntry], capacity_file: str,
                  reports: Iterable[InstanceReport], records: RecordSet, kill_budgets: Mapping[str, Any],
                  desired_image_digest: str | None, now: datetime, queues: Mapping[str, QueueSnapshot],
                  prices: Mapping[str, float] | None = None,
                  history: Mapping[str, Sequence[DemandSample]] | None = None,
                  last_heard: Mapping[str, datetime] | None = None) -> CapacityPlan:
    """Capacity decisions for the autoscaled pools (`entries`: capacity.yaml as the tree has it; `queues`: curio's
    snapshots, `read_queues`; `history`: the demand samples of the previous passes; `last_heard`: each worker's
    last signal, as the judge's step had them), and the new capacity.yaml when anything changed."""
    ranged = [p for p in spec.pools if p.min_count is not None]
    if not ranged:
        return CapacityPlan()
    names = {p.name for p in ranged}
    paused = [p.name for p in ranged if pool_pause(p.name, records, desired_image_digest) is not None]
    exhausted = [name for name, budget in kill_budgets.items() if getattr(budget, "exhausted", False)]
    # Every report: the fleet's hearing (silence everywhere) is the whole fleet's, not these pools' alone.
    reports = list(reports)
    decisions = decide_all(spec, entries, reports, queues, now, prices=prices, paused_pools=paused,
                           exhausted_pools=exhausted, history=history,
                           hearing=hearing_for(spec, reports, now, last_heard))
    if not any(d.changed for d in decisions):
        return CapacityPlan(tuple(decisions))
    merged = {**entries, **{d.pool: d.entry for d in decisions}}
    merged = {name: e for name, e in merged.items() if name in names}
    return CapacityPlan(tuple(decisions), FileChange(capacity_file, render_capacity(merged)))


def read_prices(read: Callable[[], Mapping[str, float]] | None) -> Mapping[str, float]:
    if read is None:
        return {}
    try:
        return read()
    except Exception:  # an unreadable slot state only loses the prices: the pool's max price stands in
        return {}


def with_drains(directive_docs: Mapping[str, Mapping[str, Any]], spec: FleetSpec,
                decisions: Sequence[CapacityDecision],
                reports: Iterable[InstanceReport]) -> Mapping[str, Mapping[str, Any]]:
    """`drain` for every serving worker on a draining slot: finish the current proofs, take no new work, stop.
    `directive_docs` is not changed: the docs with the drains are a new mapping (the same one if none drains)."""
    draining: dict[str, CapacityDecision] = {}
    for d in decisions:
        pool = spec.pool(d.pool)
        for index in d.entry.draining:
            draining[f"{pool.name}-{index}"] = d
    if not draining:
        return directive_docs
    out = dict(directive_docs)
    for report in reports:
        doc = out.get(report.instance_id)
        why = draining.get(report.slot or "")
        if why is None or doc is None or doc.get("action") != "serve":
            continue
        out[report.instance_id] = {
            **doc, "action": "drain",
            "reason": f"capacity: pool {why.pool} {why.before} -> {why.after} ({why.entry.reason}): finish the current "
                      "proofs, take no new work, then stop"}
    return out


@dataclass(frozen=True)
class DirectivePlan:
    """directives: what every live worker is told (`docs`, drains included), the same before the drains (`base`:
    what the next warm pass starts from) and what to remember of it."""

    docs: Mapping[str, Mapping[str, Any]]
    base: Mapping[str, Mapping[str, Any]]
    memory: DirectiveMemory


def directives_step(loaded: Loaded, evidence: Evidence, decision: PassDecision, capacity: CapacityPlan,
                    now: datetime, memory: PassMemory | None = None) -> DirectivePlan:
    """directives: per live worker, what the records say once this pass's decision is in them (serve, stop,
    wait), and `drain` on the slots capacity is shrinking. With a memory, only the directives that can have changed
    are worked out again (domain/due.py `directives_due`)."""
    after = RecordSet(machines={**loaded.records.machines, **decision.machine_records})
    previous = memory.directives if memory is not None and evidence.changed is not None else None
    told, recomputed, remembered = directives_due(evidence.reports, evidence.changed or (), after,
                                                  loaded.spec.serving, now, previous)
    base: dict[str, Mapping[str, Any]]
    if previous is None or memory is None:
        base = {i: d.to_json() for i, d in told.items()}
    else:
        base = dict(memory.base_docs)
        for iid in recomputed:
            if iid in told:
                base[iid] = told[iid].to_json()
            else:
                base.pop(iid, None)
    return DirectivePlan(with_drains(base, loaded.spec, capacity.decisions, evidence.reports.values()), base,
                         remembered)


def record_changes(decision: PassDecision, spec_dir: str = SPEC_DIR) -> tuple[FileChange, ...]:
    """The record files a decision writes, rendered as they are committed."""
    machines = [FileChange(f"{spec_dir}/{MACHINES_DIR}/{mid}.yaml", render_machine_record(rec))
                for mid, rec in sorted(decision.machine_records.items())]
    images = [FileChange(f"{spec_dir}/{IMAGES_DIR}/{digest.removeprefix('sha256:')}.yaml", render_image_record(rec))
              for digest, rec in sorted(decision.image_records.items())]
    return (*machines, *images)


def commit_request(decision: PassDecision, capacity: Sequence[CapacityDecision] = (),
                   capacity_file: FileChange | None = None, leader_epoch: int | None = None,
                   spec_dir: str = SPEC_DIR) -> CommitRequest | None:
    """The commit that publishes a decision (records and, when it changed, capacity.yaml), or None when it
    changed nothing (no empty commits). `leader_epoch`: the leadership term writing it (replicas), carried as the
    `Fleet-Leader-Epoch` trailer."""
    has_records = bool(decision.machine_records or decision.image_records)
    if not has_records and capacity_file is None:
        return None
    summary = decision.summary() if has_records else capacity_summary(capacity)
    body = decision.body() if has_records else ""
    changed = [d for d in capacity if d.changed]
    if capacity_file is not None:
        lines = [f"- capacity {d.trailer()}" + (f"; draining {', '.join(d.drain)}" if d.drain else "")
                 + (f"; released {', '.join(d.released)}" if d.released else "") for d in changed]
        body = "\n".join(x for x in (body, *lines) if x)
    trailers = (*decision.trailers(), *capacity_trailers(capacity))
    changes = (*record_changes(decision, spec_dir), *((capacity_file,) if capacity_file is not None else ()))
    # Everything in a decision comes from redacted reports; the commit text is redacted once more because
    # a commit message, once pushed, cannot be taken back.
    return CommitRequest(redact_line(summary), "\n".join(redact_lines(body.splitlines())),
                         (*trailers, *leader_trailer(leader_epoch)), changes)


@dataclass(frozen=True)
class Built:
    """Everything the steps concluded on one tip of the tree, and the commit that publishes it."""

    loaded: Loaded
    decided: Decided
    capacity: CapacityPlan
    directives: DirectivePlan
    request: CommitRequest | None
    steps: tuple[tuple[str, float], ...] = ()  # seconds per step on this tip
    demand: DemandTaken | None = None

    @property
    def decision(self) -> PassDecision:
        return self.decided.decision


@dataclass(frozen=True)
class PassInputs:
    """What a pass is given besides the tree, the store and `now` (see `run_pass`)."""

    desired_image_digest: str | None = None
    queue_reader: QueueReader | None = None
    prices: Mapping[str, float] | None = None
    leader_epoch: int | None = None
    clock: Callable[[], float] = time.monotonic  # for the seconds per step
    demand: DemandRecorder | None = None  # the leader's demand recorder (kept by the loop)


def build(view: FleetTreeView, source: ReportSource, observed: Observed, inputs: PassInputs, now: datetime,
          memory: PassMemory | None = None) -> Built | Halted:
    """load -> evidence -> decide -> capacity -> directives on one tip of the tree, and the commit request (its
    files rendered). `memory`: the leader's warm state (read, never changed here)."""
    steps = _Laps(inputs.clock)
    loaded = load(view)
    if isinstance(loaded, Halted):
        return loaded
    steps.lap("load")
    evidence = gather_evidence(source, observed, loaded, inputs, now, memory)
    if isinstance(evidence, Halted):
        return evidence
    steps.lap("evidence")
    queues = read_queues(loaded.spec, inputs.queue_reader)
    decided = decide_step(loaded, evidence, inputs, now, memory, queues)
    decision = decided.decision
    steps.lap("decide")
    capacity = capacity_step(loaded.spec, loaded.capacity, f"{loaded.spec_dir}/{CAPACITY_FILE}", observed.all,
                             loaded.records, decision.kill_budgets, inputs.desired_image_digest, now,
                             queues, inputs.prices, memory.demand.samples() if memory is not None else None,
                             decided.last_heard)
    steps.lap("capacity")
    told = directives_step(loaded, evidence, decision, capacity, now, memory)
    steps.lap("directives")
    request = commit_request(decision, capacity.decisions, capacity.file, inputs.leader_epoch, loaded.spec_dir)
    steps.lap("render")
    taken = demand_step(view, loaded, observed, capacity, decision, inputs, now, committing=request is not None)
    if taken is not None:
        request = with_demand(request, taken.files, inputs.leader_epoch)
        steps.lap("demand")
    return Built(loaded, decided, capacity, told, request, tuple(steps.laps), taken)


@dataclass(frozen=True)
class DemandTaken:
    """demand: this pass's samples and the day files that go with its commit (none: not due yet)."""

    samples: tuple[PoolSample, ...]
    files: tuple[FileChange, ...]


def demand_step(view: FleetTreeView, loaded: Loaded, observed: Observed, capacity: CapacityPlan,
                decision: PassDecision, inputs: PassInputs, now: datetime, *, committing: bool) -> DemandTaken | None:
    """demand (a thin hook on capacity): each pool's demand sample when due, and the day files to commit with the
    pass (with any commit it makes anyway, else once due). None without a recorder (`--once`, tests)."""
    recorder = inputs.demand
    if recorder is None:
        return None
    exhausted = [name for name, b in decision.kill_budgets.items() if b.exhausted]
    samples = recorder.take(loaded.spec, view.text, observed.all, loaded.records, capacity.decisions, exhausted,
                            inputs.prices or {}, inputs.desired_image_digest, now)
    files = recorder.changes(view.text, view.names, loaded.spec_dir, samples, now, committing=committing)
    return DemandTaken(samples, files)


def with_demand(request: CommitRequest | None, demand_files: Sequence[FileChange],
                leader_epoch: int | None = None) -> CommitRequest | None:
    """`request` with the demand day files added (or a commit of them alone), each named in a `Fleet-Demand`
    trailer."""
    if not demand_files:
        return request
    trailers = demand_trailers(demand_files)
    if request is None:
        pools = sorted({path.split("/")[-2] for _, path in trailers})
        return CommitRequest(f"fleet demand: samples of {', '.join(pools) or 'no pool'}", "",
                             (*trailers, *leader_trailer(leader_epoch)), tuple(demand_files))
    return replace(request, trailers=(*request.trailers, *trailers), changes=(*request.changes, *demand_files))


class _Laps:
    """Seconds per step, for the pass's summary (`PassResult.steps`)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.started = self.last = clock()
        self.laps: list[tuple[str, float]] = []

    def lap(self, step: str) -> None:
        now = self.clock()
        self.laps.append((step, now - self.last))
        self.last = now


@dataclass(frozen=True)
class Published:
    """publish: what reached git and the store."""

    commit: str | None
    pushed: bool
    attempts: int
    seconds: float | None  # wall time of commit + push (with retries), when it committed
    notes: tuple[str, ...] = ()  # what could not be stored (the directives: workers ask again)
    directives_stored: bool = False


def store_directives(sink: DirectiveSink | None, told: Mapping[str, Mapping[str, Any]], now: datetime,
                     term: LeaderTerm | None, stored: Mapping[str, Mapping[str, Any]] | None = None) -> tuple[str, ...]:
    """The directives into the store, fenced by the leader's term; notes on what could not be stored. `stored`:
    what this leader wrote last (its memory, same term): only the directives that differ are written. Raises
    LeaseLost when the term ended: the new leader computes them from the same records on its first pass."""
    if sink is None:
        return ()
    if stored is not None:
        told = {i: doc for i, doc in told.items() if stored.get(i) != doc}
        if not told:
            return ()
    try:
        if term is None:
            sink.set_directives(told, now)
        else:
            sink.set_directives(told, now, fence=term.store_fence or _fenced(term))
    except LeaseLost:
        raise
    except Exception as exc:  # the records are published; workers learn their verdict next pass
        return (f"directives not stored (workers ask again): {type(exc).__name__}: {exc}",)
    return ()


def publish(tree: FleetTree, on_tip: Callable[[FleetTreeView], CommitRequest | None], sink: DirectiveSink | None,
            directives_of: Callable[[], Mapping[str, Mapping[str, Any]] | None], now: datetime,
            term: LeaderTerm | None, monotonic: Callable[[], float],
            stored: Mapping[str, Mapping[str, Any]] | None = None) -> Published:
    """The commit through the tree (the steps run in `on_tip`, again on a newer tip after a refused push), then the
    directives the steps concluded on the last tip into the store (none when a step halted; `stored`: what this
    leader stored last, so only the ones that differ are written). Raises what the tree raises, and LeaseLost
    (`not-leader: ...`) whenever the term turns out to have ended: before the push, after a refused push that left
    nothing to publish (another leader's commit is the likeliest reason), or before the directives were stored."""
    started = monotonic()
    try:
        done = tree.publish(on_tip) if term is None else tree.publish(on_tip, before_push=term.fence)
    except LeaseLost as exc:
        raise LeaseLost(f"not-leader: push stopped by the lease check: {exc}") from None
    seconds = monotonic() - started if done.commit else None
    if term is not None and done.commit is None and done.attempts > 1:
        try:  # a human's commit also refuses a push: only the lease says which
            term.fence()
        except LeaseLost as exc:
            raise _LostAfterPush(f"not-leader: push refused; nothing left to publish: {exc}", done, seconds) from None
    told = directives_of()
    try:
        notes = store_directives(sink, told, now, term, stored) if told is not None else ()
    except LeaseLost as exc:
        what = f"commit {done.commit[:12]} pushed" if done.commit and done.pushed else "nothing new to publish"
        raise _LostAfterPush(f"not-leader: {what}; directives not stored: {exc}", done, seconds) from None
    return Published(done.commit, done.pushed, done.attempts, seconds, notes,
                     directives_stored=told is not None and sink is not None and not notes)


class _LostAfterPush(LeaseLost):
    """The term ended once the tree had published (or found nothing to publish): what reached git stands and is
    reported with the loss."""

    def __init__(self, message: str, done: PublishResult, seconds: float | None) -> None:
        super().__init__(message)
        self.published = Published(done.commit, done.pushed, done.attempts, seconds)


def summarize(now: datetime, built: Built, published: Published, lost: LeaseLost | None = None,
              steps: Sequence[tuple[str, float]] = ()) -> PassResult:
    """The pass's one summary, written once. `lost`: the term ended after the steps ran (the pass says
    `not-leader`, never Succeeded; what it pushed before is still reported). `steps`: seconds per step."""
    decision = built.decision
    return PassResult(at=now, verdicts=decision.verdicts, commit=published.commit, pushed=published.pushed,
                      attempts=published.attempts, pending=decision.pending, notes=(*decision.notes, *published.notes),
                      capacity=built.capacity.decisions,
                      image_records=tuple(rec for _, rec in sorted(decision.image_records.items())),
                      publish_seconds=published.seconds, error=str(lost) if lost else None,
                      reason=lost.reason if lost else None, steps=tuple(steps))


class PassMemory:
    """The leader's warm state from one pass to the next (issue 33): every report it read, the store's change
    sequence they cover and each worker's last signal; what its last decide and directives steps left (the
    deadline index, the pending instances, every live worker's directive); the directives it stored, and in which
    leadership term. `run_pass` reads it and takes the pass's own only once the pass's work is published: a pass
    that fails leaves it as it was, and the next one reads the same changes again. A new one (a restart, `--once`)
    makes the first pass a full one: one bulk read, every instance judged."""

    def __init__(self) -> None:
        self.sequence = 0
        self.reports: Mapping[str, InstanceReport] = {}
        self.last_heard: Mapping[str, datetime] = {}
        self.judge: JudgeMemory | None = None
        self.directives: DirectiveMemory | None = None
        self.base_docs: Mapping[str, Mapping[str, Any]] = {}
        self.stored: Mapping[str, Mapping[str, Any]] | None = None
        self.stored_epoch: int | None = None
        self.demand = DemandHistory()

    def stored_in(self, epoch: int | None) -> Mapping[str, Mapping[str, Any]] | None:
        """The directives this replica stored last, if in the same term (another leader may have written since)."""
        return self.stored if self.stored is not None and self.stored_epoch == epoch else None

    def follow(self, observed: Observed) -> None:
        """A standby's reading of the store: the reports and their sequence, nothing judged. What a pass would
        remember of its decisions is dropped (the leader's decisions moved on meanwhile): the pass that follows a
        takeover judges every instance, from reports in memory and the changes since."""
        self.sequence = observed.sequence or 0
        self.reports = observed.reports
        self.last_heard, self.judge, self.directives, self.base_docs = {}, None, None, {}

    def keep(self, observed: Observed, built: Built, published: Published, epoch: int | None) -> None:
        self.sequence = observed.sequence or 0
        self.reports = observed.reports
        self.last_heard = built.decided.last_heard
        self.judge = built.decided.memory
        self.directives = built.directives.memory
        self.base_docs = built.directives.base
        self.demand.record(built.loaded.spec, built.capacity.decisions)
        if published.directives_stored:
            self.stored, self.stored_epoch = built.directives.docs, epoch
        # What the leader keeps lives as long as it leads (10,000 reports: about a million objects, none in a
        # reference cycle): out of the collector's generations, so the next passes' collections do not walk it
        # again (as the loop's records, record_files.load_records). Replaced ones are freed by their refcounts.
        gc.freeze()


def run_pass(tree: FleetTree, source: ReportSource, now: datetime, *,
             desired_image_digest: str | None = None, directive_sink: DirectiveSink | None = None,
             monotonic: Callable[[], float] = time.monotonic, queue_reader: QueueReader | None = None,
             term: LeaderTerm | None = None, prices: Callable[[], Mapping[str, float]] | None = None,
             memory: PassMemory | None = None, demand: DemandRecorder | None = None) -> PassResult:
    """One pass: observe, then the steps on the fresh tip of the tree (again on a newer tip if the push was
    refused), publish, and the one summary.

    `directive_sink`: gets what each live worker should do (serve, stop, wait), recomputed from the
    published records every pass (so a crash between commit and write only delays them one pass).
    `queue_reader`: curio's queue (and Snark Market) for autoscaled pools with a `queue:` source (None:
    utilization only), read before judging: the market's missed deadlines are serving evidence.
    `prices`: instance -> $/h from the provisioner's slot state or the marketplace, so a shrinking pool drains the
    worst $/proof first (None or unknown: the pool's max price, i.e. the slowest machine first).

    `term`: when replicas share the store, the leadership term this pass runs in. Its epoch goes into the
    commit as a trailer and its fence runs right before the push and before the directives are stored: a
    replica whose term ended (paused past its lease, or cut off from the database) writes nothing.

    `memory`: kept by a long-running leader between its passes: the pass reads only what changed in the store
    since the last one and judges only the instances that are due, with the same outcome as a full pass.

    `demand`: the leader's demand recorder (kept by the loop): samples of each pool's demand from the capacity
    step, committed to fleet-spec/demand/ for `fleet plan --what-if`; it also remembers the instances' prices."""
    with collector_paused():  # a pass at fleet size allocates millions of objects: see adapters/collector.py
        return _run_pass(tree, source, now, desired_image_digest=desired_image_digest, directive_sink=directive_sink,
                         monotonic=monotonic, queue_reader=queue_reader, term=term, prices=prices, memory=memory,
                         demand=demand)


def _run_pass(tree: FleetTree, source: ReportSource, now: datetime, *, desired_image_digest: str | None,
              directive_sink: DirectiveSink | None, monotonic: Callable[[], float], queue_reader: QueueReader | None,
              term: LeaderTerm | None, prices: Callable[[], Mapping[str, float]] | None, memory: PassMemory | None,
              demand: DemandRecorder | None) -> PassResult:
    started = monotonic()
    observed = observe(source, memory)
    if isinstance(observed, Halted):
        return observed.result(now)
    observed_s = monotonic() - started
    current = read_prices(prices)
    inputs = PassInputs(desired_image_digest, queue_reader, current if demand is None else demand.known_prices(current),
                        term.epoch if term is not None else None, monotonic, demand)
    outcome: list[Built | Halted] = []  # the steps' outcome on the last tip the tree was synced to

    def on_tip(view: FleetTreeView) -> CommitRequest | None:
        outcome[:] = [build(view, source, observed, inputs, now, memory)]
        return outcome[0].request if isinstance(outcome[0], Built) else None

    def directives_of() -> Mapping[str, Mapping[str, Any]] | None:
        return outcome[0].directives.docs if outcome and isinstance(outcome[0], Built) else None

    def steps() -> list[tuple[str, float]]:
        built = outcome[0]
        assert isinstance(built, Built)
        publishing = monotonic() - publish_started - sum(seconds for _, seconds in built.steps)
        return [("observe", observed_s), *built.steps, ("publish", publishing)]

    stored = memory.stored_in(inputs.leader_epoch) if memory is not None else None
    publish_started = monotonic()
    try:
        published = publish(tree, on_tip, directive_sink, directives_of, now, term, monotonic, stored)
    except _LostAfterPush as exc:  # published (or found nothing to publish), then found the term over
        assert isinstance(outcome[0], Built)
        _demand_done(demand, outcome[0], published=exc.published.commit is not None)
        return summarize(now, outcome[0], exc.published, exc, steps())
    except (LeaseLost, TemporaryGitError) as exc:  # retried next pass (by whichever replica leads then)
        _demand_done(demand, outcome[0] if outcome else None, published=False)
        return PassResult(at=now, error=str(exc), reason=exc.reason)
    except GitStoreError as exc:
        _demand_done(demand, outcome[0] if outcome else None, published=False)
        return PassResult(at=now, stalled=str(exc), reason=exc.reason)
    built = outcome[0]
    if isinstance(built, Halted):
        return built.result(now, published.attempts)
    _demand_done(demand, built, published=True)
    if memory is not None:
        memory.keep(observed, built, published, inputs.leader_epoch)
    return summarize(now, built, published, steps=steps())


def _demand_done(demand: DemandRecorder | None, built: Built | Halted | None, *, published: bool) -> None:
    """Tell the recorder what the pass published: its samples, and whether their day files went out with it."""
    if demand is not None and isinstance(built, Built) and built.demand is not None:
        demand.done(built.demand.samples, flushed=published and bool(built.demand.files))


def follow(tree: FleetTree, source: ReportSource, memory: PassMemory | None) -> tuple[str, ...]:
    """A standby replica's pass: nothing judged, nothing written. Its clone follows the branch (the page it serves
    shows the leader's records) and, with a memory, it follows the store's change sequence and keeps the records
    parsed, so the pass it runs once it takes over reads only what changed since. Notes on what it could not do."""
    notes: list[str] = []
    if memory is not None:
        observed = observe(source, memory)
        if isinstance(observed, Halted):
            notes.append(f"store not followed: {observed.message}")
        else:
            memory.follow(observed)

    def read(view: FleetTreeView) -> None:  # a build that commits nothing: publish only syncs
        if memory is not None:
            view.records()

    try:
        tree.publish(read)
    except (GitStoreError, TemporaryGitError) as exc:
        notes.append(f"clone not refreshed (the page shows older records): {exc}")
    return tuple(notes)


def _fenced(term: LeaderTerm) -> Callable[[Any], None]:
    """A store fence made of the term's own check, for a term without one (it does not hold the lease row)."""
    return lambda _conn: term.fence()


def run(pass_once: Callable[[datetime], PassResult], *, interval_s: float, stop_event: threading.Event,
        clock: Callable[[], datetime], sleep: Callable[[float], object] | None = None,
        on_pass: Callable[[PassResult], None] | None = None, max_passes: int | None = None) -> list[PassResult]:
    """Run passes every `interval_s` until `stop_event` is set (or `max_passes`). A pass that raises
    unexpectedly is reported as an error and the loop goes on: the next pass starts from git again."""
    wait = sleep if sleep is not None else stop_event.wait
    results: list[PassResult] = []
    while not stop_event.is_set():
        now = clock()
        try:
            result = pass_once(now)
        except Exception as exc:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            result = PassResult(at=now, error=f"pass crashed: {detail}")
        results.append(result)
        if on_pass is not None:
            on_pass(result)
        if max_passes is not None and len(results) >= max_passes:
            break
        if stop_event.is_set():
            break
        wait(interval_s)
    return results

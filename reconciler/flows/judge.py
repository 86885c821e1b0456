"""The reconcile pass: load (spec + records from git, reports from the controller store) -> decide -> apply.

`reconciler.domain.judging.decide` is pure; `run_pass` is the shell: it reads the reports through the
`ReportSource` port, then hands `GitStore.publish` a build function that loads the spec and records of the
freshly synced tree and decides on THAT tree (so a human's pardon merged a second ago is respected).
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from reconciler.adapters.capacity_files import CAPACITY_FILE, load_capacity, render_capacity
from reconciler.adapters.git import CommitRequest, FileChange, GitStoreError, PublishResult, TemporaryGitError
from reconciler.adapters.record_files import RecordCache, render_image_record, render_machine_record
from reconciler.adapters.record_index import load_for_pass
from reconciler.adapters.spec_files import load_spec
from reconciler.domain import errors
from reconciler.domain.capacity import (
    CapacityDecision,
    QueueSnapshot,
    capacity_json,
    capacity_summary,
    capacity_trailers,
    decide_all,
)
from reconciler.domain.errors import READY, RECONCILING, STALLED, STANDBY, Condition
from reconciler.domain.judging import INSTANCE_TRAILER, SERVING_TRAILER, PassDecision, awaiting_evidence, decide
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
from reconciler.domain.serving import directives
from reconciler.domain.spec import FleetSpec, QueueSource, SpecError
from reconciler.domain.verdict import Verdict
from reconciler.flows.demand import DemandRecorder, demand_trailers

SPEC_DIR = "fleet-spec"
SPEC_FILE = f"{SPEC_DIR}/fleet.yaml"


class ReportSource(Protocol):
    """What the controller store offers the loop. Any exception it raises is an observation failure."""

    def reports(self) -> Sequence[InstanceReport]: ...


@runtime_checkable
class LogRingSource(Protocol):
    """A report source that can also give an instance's whole stored log ring (the controller store, SQLite or
    PostgreSQL): the evidence of the instances judged this pass. Without it, judging reads each report's tail."""

    def log_rings(self, instance_ids: Sequence[str]) -> Mapping[str, Sequence[str]]: ...


class DirectiveSink(Protocol):
    """Where the directives for workers go (the controller store; workers read them over HTTP)."""

    def set_directives(self, directives: Mapping[str, Mapping[str, Any]], now: datetime, *,
                       fence: Callable[[Any], None] | None = None) -> int: ...


class RecordPublisher(Protocol):
    """What the loop needs from git (implemented by `reconciler.adapters.git.GitStore`)."""

    def publish(self, build: Callable[[Path], CommitRequest | None], *,
                before_push: Callable[[], None] | None = None) -> PublishResult: ...

    def trailer_values(self, key: str) -> set[str]: ...


@dataclass(frozen=True)
class LeaderTerm:
    """The leadership term a pass runs in, when replicas share a PostgreSQL store (the embedded store has none).

    `fence` asks the database whether this replica still holds the lease in `epoch` and raises LeaseLost if
    not; the pass calls it right before the push. `store_fence` is the same check inside the store's transaction
    that writes the directives (it holds the lease row until that commits)."""

    epoch: int
    fence: Callable[[], None]
    store_fence: Callable[[Any], None] | None = None


# --- the pass (shell) -----------------------------------------------------------------------------------


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
    error: str | None = None  # temporary: fetch/push failed; the next pass retries
    reason: str | None = None  # the error taxonomy's reason constant when the pass did not finish
    image_records: tuple[ImageSuspectRecord, ...] = ()  # image-suspect records this pass wrote
    publish_seconds: float | None = None  # wall time of commit + push (with retries), when it committed
    capacity: tuple[CapacityDecision, ...] = ()  # autoscaled pools: signals and what was decided this pass
    standby: str | None = None  # a replica that does not lead: nothing judged or written; who leads instead

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
            return f"will retry: {self.error}"
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
            "capacity": [capacity_json(d, self.at) for d in self.capacity],
            "verdicts": [{"instance_id": v.instance_id, "machine_id": v.machine_id, "pool": v.pool,
                          "verdict": v.verdict, "blame": v.blame, "marks_bad": v.marks_bad,
                          "held_by": v.held_by, "root_cause": v.root_cause()} for v in self.verdicts],
        }


def record_changes(decision: PassDecision, spec_dir: str = SPEC_DIR) -> tuple[FileChange, ...]:
    """The record files a decision writes, rendered as they are committed."""
    machines = [FileChange(f"{spec_dir}/{MACHINES_DIR}/{mid}.yaml", render_machine_record(rec))
                for mid, rec in sorted(decision.machine_records.items())]
    images = [FileChange(f"{spec_dir}/{IMAGES_DIR}/{digest.removeprefix('sha256:')}.yaml", render_image_record(rec))
              for digest, rec in sorted(decision.image_records.items())]
    return (*machines, *images)


def commit_request(decision: PassDecision, capacity: Sequence[CapacityDecision] = (),
                   capacity_file: FileChange | None = None, leader_epoch: int | None = None) -> CommitRequest | None:
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
    changes = (*record_changes(decision), *((capacity_file,) if capacity_file is not None else ()))
    # Everything in a decision comes from redacted reports; the commit text is redacted once more because
    # a commit message, once pushed, cannot be taken back.
    return CommitRequest(redact_line(summary), "\n".join(redact_lines(body.splitlines())),
                         (*trailers, *leader_trailer(leader_epoch)), changes)


class QueueReader(Protocol):
    """curio's task queue (adapters.curio_queue.CurioQueue); failures come back as the snapshot's error."""

    def read(self, source: QueueSource) -> QueueSnapshot: ...


def capacity_step(spec: FleetSpec, spec_path: Path, capacity_file: str, reports: Sequence[InstanceReport],
                  records: RecordSet, kill_budgets: Mapping[str, Any], desired_image_digest: str | None, now: datetime,
                  queue_reader: QueueReader | None,
                  prices: Mapping[str, float] | None = None) -> tuple[list[CapacityDecision], FileChange | None]:
    """Capacity decisions for the autoscaled pools, and the new capacity.yaml when anything changed."""
    ranged = [p for p in spec.pools if p.min_count is not None]
    if not ranged:
        return [], None
    queues = {}
    for pool in ranged:
        if pool.queue is not None:
            queues[pool.name] = (queue_reader.read(pool.queue) if queue_reader is not None
                                 else QueueSnapshot(error="no queue reader in this process"))
    entries, _ = load_capacity(spec_path)  # load_spec refused a broken file already
    paused = [p.name for p in ranged if pool_pause(p.name, records, desired_image_digest) is not None]
    exhausted = [name for name, budget in kill_budgets.items() if getattr(budget, "exhausted", False)]
    decisions = decide_all(spec, entries, reports, queues, now, prices=prices, paused_pools=paused,
                           exhausted_pools=exhausted)
    if not any(d.changed for d in decisions):
        return decisions, None
    merged = {**entries, **{d.pool: d.entry for d in decisions}}
    merged = {name: e for name, e in merged.items() if name in {p.name for p in ranged}}
    return decisions, FileChange(capacity_file, render_capacity(merged))


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


def _prices(read: Callable[[], Mapping[str, float]] | None) -> Mapping[str, float]:
    if read is None:
        return {}
    try:
        return read()
    except Exception:  # an unreadable slot state only loses the prices: the pool's max price stands in
        return {}


def with_drains(directive_docs: dict[str, dict[str, Any]], spec: FleetSpec,
                decisions: Sequence[CapacityDecision], reports: Sequence[InstanceReport]) -> dict[str, dict[str, Any]]:
    """`drain` for every serving worker on a draining slot: finish the current proofs, take no new work, stop."""
    draining: dict[str, CapacityDecision] = {}
    for d in decisions:
        pool = spec.pool(d.pool)
        for index in d.entry.draining:
            draining[f"{pool.name}-{index}"] = d
    for report in reports:
        doc = directive_docs.get(report.instance_id)
        why = draining.get(report.slot or "")
        if why is None or doc is None or doc.get("action") != "serve":
            continue
        directive_docs[report.instance_id] = {
            **doc, "action": "drain",
            "reason": f"capacity: pool {why.pool} {why.before} -> {why.after} ({why.entry.reason}): finish the current "
                      "proofs, take no new work, then stop"}
    return directive_docs


def run_pass(store: RecordPublisher, source: ReportSource, now: datetime, *,
             desired_image_digest: str | None = None, spec_file: str = SPEC_FILE,
             record_cache: RecordCache | None = None, directive_sink: DirectiveSink | None = None,
             monotonic: Callable[[], float] = time.monotonic, queue_reader: QueueReader | None = None,
             term: LeaderTerm | None = None, prices: Callable[[], Mapping[str, float]] | None = None,
             demand: DemandRecorder | None = None) -> PassResult:
    """One pass: read reports, then publish whatever `decide` concludes on the fresh tip of the branch.

    `directive_sink`: gets what each live worker should do (serve, stop, wait), recomputed from the
    published records every pass (so a crash between commit and write only delays them one pass).

    `record_cache`: kept by a long-running loop between its passes, so a pass parses only the record files
    that changed since the last one (10,000 files: minutes to parse, milliseconds to stat).

    `queue_reader`: curio's queue for autoscaled pools with a `queue:` source (None: utilization only).
    `prices`: instance -> $/h from the provisioner's slot state, so a shrinking pool drains the worst $/proof
    first (None or unknown: the pool's max price, i.e. the slowest machine first).

    `term`: when replicas share the store, the leadership term this pass runs in. Its epoch goes into the
    commit as a trailer and its fence runs right before the push and before the directives are stored: a
    replica whose term ended (paused past its lease, or cut off from the database) writes nothing.

    `demand`: the leader's demand recorder (kept by the loop): samples of each pool's demand from the capacity
    step, committed to fleet-spec/demand/ for `fleet plan --what-if`."""
    try:
        reports = tuple(source.reports())
    except Exception as exc:  # any failure to observe must never become a verdict
        return PassResult(at=now, observation_error=f"{type(exc).__name__}: {exc}", reason=errors.OBSERVATION_FAILED)

    outcome: dict[str, Any] = {}
    pass_prices = _prices(prices) if demand is None else demand.known_prices(_prices(prices))

    def build(workdir: Path) -> CommitRequest | None:
        outcome.clear()
        try:
            spec = load_spec(workdir / spec_file)
        except SpecError as exc:
            outcome["stalled"] = exc
            return None
        records = load_for_pass(workdir / Path(spec_file).parent, record_cache)
        judged = store.trailer_values(INSTANCE_TRAILER)
        try:
            evidence = with_whole_rings(source, reports, awaiting_evidence(spec, reports, judged, now))
        except Exception as exc:  # judging on part of the evidence could blame the wrong one: judge nothing
            outcome["observation_error"] = f"{type(exc).__name__}: {exc}"
            return None
        decision = decide(spec, evidence, records, judged, desired_image_digest, now,
                          judged_serving_ids=store.trailer_values(SERVING_TRAILER), prices=pass_prices)
        outcome["decision"] = decision
        after = RecordSet(machines={**records.machines, **decision.machine_records})
        capacity, capacity_file = capacity_step(
            spec, workdir / spec_file, str(Path(spec_file).parent / CAPACITY_FILE), reports, records,
            decision.kill_budgets, desired_image_digest, now, queue_reader, pass_prices)
        outcome["capacity"] = capacity
        outcome["directives"] = with_drains(
            {i: d.to_json() for i, d in directives(reports, after, spec.serving, now).items()}, spec, capacity,
            reports)
        epoch = term.epoch if term is not None else None
        request = commit_request(decision, capacity, capacity_file, epoch)
        if demand is None:
            return request
        spec_dir = workdir / Path(spec_file).parent
        taken = demand.take(spec, spec_dir, reports, records, capacity,
                            [name for name, b in decision.kill_budgets.items() if b.exhausted], pass_prices,
                            desired_image_digest, now)
        files = demand.changes(spec_dir, str(Path(spec_file).parent), taken, now, committing=request is not None)
        outcome["demand"] = (taken, bool(files))
        return with_demand(request, files, epoch)

    started = monotonic()
    try:
        published = store.publish(build) if term is None else store.publish(build, before_push=term.fence)
    except (LeaseLost, TemporaryGitError) as exc:  # retried next pass (by whichever replica leads then)
        _demand_done(demand, outcome, published=False)
        return PassResult(at=now, error=str(exc), reason=exc.reason)
    except GitStoreError as exc:
        _demand_done(demand, outcome, published=False)
        return PassResult(at=now, stalled=str(exc), reason=exc.reason)
    _demand_done(demand, outcome, published=True)
    if "observation_error" in outcome:
        return PassResult(at=now, observation_error=outcome["observation_error"], reason=errors.OBSERVATION_FAILED,
                          attempts=published.attempts)
    if "stalled" in outcome:
        spec_error: SpecError = outcome["stalled"]
        return PassResult(at=now, stalled=str(spec_error), reason=spec_error.reason, attempts=published.attempts)
    decision: PassDecision = outcome["decision"]
    notes = decision.notes
    if directive_sink is not None:
        try:
            if term is None:
                directive_sink.set_directives(outcome["directives"], now)
            else:
                directive_sink.set_directives(outcome["directives"], now, fence=term.store_fence or _fenced(term))
        except LeaseLost as exc:  # the new leader computes them from the same records on its first pass
            notes = (*notes, f"directives not stored: {exc}")
        except Exception as exc:  # the records are published; workers learn their verdict next pass
            notes = (*notes, f"directives not stored (workers ask again): {type(exc).__name__}: {exc}")
    return PassResult(at=now, verdicts=decision.verdicts, commit=published.commit, pushed=published.pushed,
                      attempts=published.attempts, pending=decision.pending, notes=notes,
                      capacity=tuple(outcome.get("capacity", ())),
                      image_records=tuple(rec for _, rec in sorted(decision.image_records.items())),
                      publish_seconds=monotonic() - started if published.commit else None)


def _demand_done(demand: DemandRecorder | None, outcome: Mapping[str, Any], *, published: bool) -> None:
    if demand is not None and "demand" in outcome:
        taken, flushed = outcome["demand"]
        demand.done(taken, flushed=flushed and published)


def with_whole_rings(source: ReportSource, reports: Sequence[InstanceReport],
                     instance_ids: Sequence[str]) -> tuple[InstanceReport, ...]:
    """`reports`, those of `instance_ids` carrying their whole stored log ring instead of its tail (when the
    source can give it: `LogRingSource`)."""
    if not instance_ids or not isinstance(source, LogRingSource):
        return tuple(reports)
    rings = source.log_rings(instance_ids)
    return tuple(replace(r, log_tail=tuple(rings[r.instance_id])) if rings.get(r.instance_id) else r
                 for r in reports)


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

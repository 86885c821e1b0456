"""The warm pass decides exactly what the full pass decides (domain/due.py): random fleet histories, each pass
judged twice, by `judging.decide` / `serving.directives` over every report and by `decide_due` / `directives_due`
over what changed and fell due, and the two compared field by field.

A history: workers register, fetch params, benchmark (fast, slow, an image fault, a machine fault, a params failure
over the network, a run that never ends, a run streaming proofs slow enough for the early verdict), then serve with
heartbeats (healthy, degraded, going silent, failing, stopping), and get destroyed; some report an unsafe machine
id or a pool the spec does not have; passes come 1 to 25 minutes apart; the records the full pass writes are kept
(as its commit would keep them, sometimes without its trailers) and humans now and then pardon a machine by deleting
its record, ban one, or edit the spec; the leader sometimes restarts (its memory is lost)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.domain.due import DirectiveMemory, JudgeMemory, decide_due, directives_due
from reconciler.domain.judging import SERVING_TRAILER, PassDecision, decide, judged_sets
from reconciler.domain.observations import BenchmarkResult, InstanceReport, PhaseEvent
from reconciler.domain.records import MachineRecord, RecordSet
from reconciler.domain.serving import FleetSignals, directives, last_signal
from reconciler.domain.spec import FleetSpec, RecordExpirySettings
from tests.scenarios import CUDA_ERROR_TAIL, DAEMON_REFUSED_TAIL, DIGEST, OTHER_DIGEST, SPEC, T0

NETWORK_TAIL = ("curl: (6) Could not resolve host: proofs.filecoin.io",)
KINDS = ("fast", "fast", "fast", "slow", "image-fault", "machine-fault", "params-network", "never-ends", "early-slow")
SERVING = ("healthy", "healthy", "degraded", "goes-silent", "fails", "stops")
MACHINES = tuple(str(100 + i) for i in range(8))


@dataclass
class Worker:
    """One simulated instance: what it has told the controller so far, and what it will do next."""

    iid: str
    machine_id: str | None
    pool: str
    kind: str
    serving: str
    digest: str
    registered_at: datetime
    events: list[PhaseEvent] = field(default_factory=list)
    result: BenchmarkResult | None = None
    tail: tuple[str, ...] = ()
    destroyed_at: datetime | None = None
    step: int = 0
    beats: int = 0
    last_beat: datetime | None = None

    def report(self) -> InstanceReport:
        return InstanceReport(instance_id=self.iid, registered_at=self.registered_at, pool=self.pool,
                              slot=f"{self.pool}-0", machine_id=self.machine_id, host_id="7781",
                              contract_id=f"c-{self.iid}", gpu_name="RTX PRO 4000", image_digest=self.digest,
                              events=tuple(self.events), result=self.result, log_tail=self.tail,
                              destroyed_at=self.destroyed_at)

    def advance(self, now: datetime, rng: random.Random) -> None:
        """The worker's next report (one step of its script), at `now` on the controller's clock."""
        def event(phase: str, status: str, **kw: Any) -> None:
            self.events.append(PhaseEvent(phase, status, now, **kw))

        self.step += 1
        s = self.step
        if s == 1:
            event("register", "done")
            event("params", "started")
        elif s == 2:
            if self.kind == "params-network":
                event("params", "failed", exit_code=6, log_tail=NETWORK_TAIL, message="curl exited 6")
                self.tail = NETWORK_TAIL
            else:
                event("params", "done")
                event("daemon", "started")
                event("daemon", "done")
                event("benchmark", "started", details={"requested": 10, "concurrency": 2})
        elif s == 3 and self.kind == "early-slow":
            event("benchmark", "progress", details={"proofs": [{"index": i, "label": "COMPLETED", "seconds": 400.0}
                                                               for i in (1, 2, 3, 4)]})
        elif s == 3 and self.kind not in ("never-ends", "params-network"):
            self._result(now)
        elif s >= 4 and self.result is not None and self.result.outcome == "completed" and self.kind == "fast":
            self._serve(now, rng)

    def _result(self, now: datetime) -> None:
        started = self.events[-1].at
        if self.kind in ("fast", "slow"):
            rate = 35.0 if self.kind == "fast" else 20.0
            self.result = BenchmarkResult(outcome="completed", at=now, requested=10, completed=10, failed=0,
                                          started_at=started, exit_code=0, proofs_per_hour=rate,
                                          seconds_per_proof=3600 / rate, image_digest=self.digest,
                                          log_tail=("=== Batch Summary ===", "completed:     10"))
            self.events.append(PhaseEvent("benchmark", "done", now))
        else:
            tail = DAEMON_REFUSED_TAIL if self.kind == "image-fault" else CUDA_ERROR_TAIL
            self.tail = tail
            self.result = BenchmarkResult(outcome="error", at=now, requested=10, completed=0, failed=0,
                                          started_at=started, exit_code=1, log_tail=tail)
            self.events.append(PhaseEvent("benchmark", "failed", now, exit_code=1, log_tail=tail,
                                          message="benchmark.sh exited 1"))

    def _serve(self, now: datetime, rng: random.Random) -> None:
        if not any(e.phase == "serve" and e.status == "started" for e in self.events):
            self.events.append(PhaseEvent("serve", "started", now))
            self.last_beat = now
            return
        if any(e.phase == "serve" and e.status in ("failed", "done") for e in self.events):
            return
        self.beats += 1
        if self.serving == "fails" and self.beats > 3:
            self.events.append(PhaseEvent("serve", "failed", now, exit_code=1, message="cuzk-daemon exited 1",
                                          log_tail=CUDA_ERROR_TAIL if rng.random() < 0.5 else ()))
            return
        if self.serving == "stops" and self.beats > 5:
            self.events.append(PhaseEvent("serve", "done", now))
            return
        if self.serving == "goes-silent" and self.beats > 4:
            return  # it says nothing more
        interval = (now - (self.last_beat or now)).total_seconds() or 300.0
        per_hour = 12.0 if self.serving == "degraded" else 40.0
        completed = round(per_hour * interval / 3600)
        self.events.append(PhaseEvent("serve", "progress", now, details={"heartbeat": {
            "seq": self.beats, "interval_s": interval, "completed": completed, "failed": 0, "busy": True}}))
        self.last_beat = now


@dataclass
class Warm:
    """What the leader keeps between passes (flows/judge.py PassMemory, in small)."""

    reports: dict[str, InstanceReport] = field(default_factory=dict)
    heard: dict[str, datetime] = field(default_factory=dict)
    judge: JudgeMemory | None = None
    directives: DirectiveMemory | None = None


def run_history(seed: int, passes: int = 30) -> int:
    """A random history; every pass judged both ways and compared. Returns the number of verdicts (so a test can
    say the histories judge something)."""
    rng = random.Random(seed)
    spec: FleetSpec = SPEC
    if rng.random() < 0.5:  # bad records that expire within the history, and probations that end in it
        spec = replace(spec, record_expiry=RecordExpirySettings(
            hours_by_blame={"machine": 0.5, "marketplace": 0.3, "network": 0.4}, probation_hours=0.75))
    digest: str | None = DIGEST
    now = T0
    workers: list[Worker] = []
    machines: dict[str, MachineRecord] = {}
    trailers: dict[str, set[str]] = {"Fleet-Instance": set(), SERVING_TRAILER: set()}
    warm = Warm()
    verdicts = 0
    for n in range(passes):
        now += timedelta(minutes=rng.choice((1, 2, 5, 5, 10, 15, 25)))
        changed: set[str] = set()
        for _ in range(rng.randint(0, 3)):  # new workers
            iid = f"i{len(workers):03d}"
            machine = rng.choice((*MACHINES, *MACHINES, None, "../x"))
            workers.append(Worker(iid, machine, rng.choice(("rtx-pro-4000", "rtx-pro-4000", "rtx4090", "gone")),
                                  rng.choice(KINDS), rng.choice(SERVING), rng.choice((DIGEST, DIGEST, OTHER_DIGEST)),
                                  now))
        for w in workers:
            if w.destroyed_at is None and (w.step == 0 or rng.random() < 0.45):
                w.advance(now, rng)
                changed.add(w.iid)
            if w.destroyed_at is None and w.step > 2 and rng.random() < 0.03:
                w.destroyed_at = now
                changed.add(w.iid)
        if rng.random() < 0.05 and machines:  # a human: pardon by deletion, a ban, or a pardon
            victim = rng.choice(sorted(machines))
            action = rng.choice(("delete", "ban", "pardon"))
            if action == "delete":
                del machines[victim]
            else:
                machines[victim] = replace(machines[victim], status="banned" if action == "ban" else "pardoned")
        if rng.random() < 0.03:  # a spec edit, or a new desired image
            if rng.random() < 0.5:
                spec = replace(spec, serving=replace(spec.serving, lost_after_minutes=rng.choice((15.0, 20.0, 30.0))))
            else:
                digest = rng.choice((DIGEST, OTHER_DIGEST, None))
        if rng.random() < 0.05:  # the leader restarts: no memory
            warm = Warm()
        if rng.random() < 0.1:  # records read again from files: equal, not the same objects
            machines = {m: replace(r) for m, r in machines.items()}
        reports = {w.iid: w.report() for w in workers}
        records = RecordSet(machines=dict(machines))

        full = decide(spec, reports.values(), records, trailers["Fleet-Instance"], digest, now,
                      judged_serving_ids=trailers[SERVING_TRAILER])
        decision = _incremental(warm, spec, reports, changed, records, trailers, digest, now)
        assert_same(full, decision, f"seed {seed}, pass {n}")

        after = RecordSet(machines={**machines, **full.machine_records})
        told = directives(reports.values(), after, spec.serving, now)
        warm_changed = changed if warm.directives is not None else set()
        told_due, _, warm.directives = directives_due(reports, warm_changed, after, spec.serving, now, warm.directives)
        assert dict(told_due) == told, f"seed {seed}, pass {n}: directives differ"

        # What the commit leaves: the records and the trailers (now and then the records alone, as a human's
        # merge of them would: the instances are then judged by their records only, and a pardon by deletion
        # makes them unjudged again).
        machines.update(full.machine_records)
        if rng.random() < 0.8:
            for key, value in full.trailers():
                trailers.setdefault(key, set()).add(value)
        verdicts += len(full.verdicts)
    return verdicts


def _incremental(warm: Warm, spec: FleetSpec, reports: Mapping[str, InstanceReport], changed: set[str],
                 records: RecordSet, trailers: Mapping[str, set[str]], digest: str | None,
                 now: datetime) -> PassDecision:
    sets = judged_sets(records, trailers["Fleet-Instance"], trailers[SERVING_TRAILER])
    due = warm.judge.due(spec, digest, sets, changed, reports, now) if warm.judge is not None else None
    heard = {**warm.heard, **{i: last_signal(reports[i]) for i in changed}} if warm.judge is not None else None
    fleet = FleetSignals(tuple(reports.values()), heard)
    decision, warm.judge = decide_due(spec, reports, due, records, trailers["Fleet-Instance"], digest, now,
                                      judged_serving_ids=trailers[SERVING_TRAILER], memory=warm.judge, fleet=fleet,
                                      sets=sets)
    warm.heard = dict(fleet.last_heard())
    return decision


def assert_same(full: PassDecision, incremental: PassDecision, where: str) -> None:
    for name in ("verdicts", "machine_records", "image_records", "pending", "notes", "kill_budgets", "quarantined"):
        a, b = getattr(full, name), getattr(incremental, name)
        assert a == b, f"{where}: {name} differ:\n full: {a}\n warm: {b}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=2**32))
def test_the_warm_pass_decides_what_the_full_pass_decides_on_random_histories(seed: int) -> None:
    run_history(seed)


def test_the_histories_judge_every_kind_of_verdict() -> None:
    """Not a history that judges nothing: over a few seeds, verdicts of every kind are compared."""
    total = sum(run_history(seed, passes=40) for seed in range(6))
    assert total > 60


def test_a_quiet_pass_looks_at_nothing_but_what_is_due() -> None:
    """The point of it: with nothing changed and no deadline due, the warm pass judges no report at all."""
    worker = Worker("i000", "100", "rtx-pro-4000", "fast", "healthy", DIGEST, T0)
    rng = random.Random(1)
    now = T0
    for _ in range(6):
        now += timedelta(minutes=5)
        worker.advance(now, rng)
    reports = {worker.iid: worker.report()}
    records = RecordSet()
    trailers: dict[str, set[str]] = {"Fleet-Instance": set(), SERVING_TRAILER: set()}
    warm = Warm()
    first = _incremental(warm, SPEC, reports, {worker.iid}, records, trailers, DIGEST, now)
    assert [v.verdict for v in first.verdicts] == ["ok"]
    records = RecordSet(machines=dict(first.machine_records))
    trailers["Fleet-Instance"].add(worker.iid)
    _incremental(warm, SPEC, reports, set(), records, trailers, DIGEST, now + timedelta(minutes=1))
    assert warm.judge is not None
    due = warm.judge.due(SPEC, DIGEST, judged_sets(records, trailers["Fleet-Instance"]), set(), reports,
                         now + timedelta(minutes=2))
    assert due == set()
    # Its lost deadline: 20 minutes after its last heartbeat it is due again (and only then).
    last = worker.last_beat
    assert last is not None
    assert warm.judge.deadlines == {worker.iid: last + timedelta(minutes=20)}

"""A fleet's last 30 days, made for `fleet plan --what-if` at 1,000 and 10,000 machines (bench/bench_whatif.py).

Deterministic (seeded). Nothing is hand-written that the reconciler writes itself:
- verdicts: every admission is a report judged by `verdict.judge`, then guarded and recorded by
  `judging.guard_and_record` pass by pass (the tail of `judging.decide`) on the records so far: kill-budget holds,
  the breaker tripping on a bad image's day, expiry and probation are the real ones. One bot commit per pass
  (trailers as `flows.judge.commit_request` writes them) through `git fast-import`, a few humans' pardons.
- demand: each autoscaled pool is followed by a simulated leader that passes every 5 minutes: demand in
  machine-equivalents (a daily wave, noise, PoRep tasks queueing when the pool is short), machines serving after a
  15-minute cold start, the signals a pass measures, `capacity.decide_signals` deciding, and samples taken as the
  recorder takes them (`PoolSample.differs_from`, a decision always, at least every 15 minutes). Fixed pools are
  sampled on the same rule. Day files rendered by `adapters.demand_files`, committed once a day.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.common import fast_import_data, git
from reconciler.adapters.capacity_files import render_capacity
from reconciler.adapters.demand_files import day_path, render_day
from reconciler.adapters.git import BOT_EMAIL, BOT_NAME
from reconciler.adapters.record_files import render_image_record, render_machine_record
from reconciler.adapters.spec_files import check_spec_text
from reconciler.domain.breaker import kill_budgets_of_marks
from reconciler.domain.capacity import (
    CapacityEntry,
    PoolSignals,
    QueueSnapshot,
    SlotState,
    Utilization,
    decide_signals,
)
from reconciler.domain.demand import PoolSample
from reconciler.domain.judging import guard_and_record
from reconciler.domain.observations import BenchmarkResult, InstanceReport, PhaseEvent, ProofResult, format_time
from reconciler.domain.planner import pool_pause
from reconciler.domain.records import RecordSet
from reconciler.domain.replay import ReplayRecords
from reconciler.domain.spec import FleetSpec
from reconciler.domain.verdict import judge

UNTIL = datetime(2026, 12, 2, 0, 0, tzinfo=UTC)
DAYS = 30
SLOTS = 250  # per pool
PASS_MINUTES = 5  # the simulated leader's passes
SPACING_MINUTES = 15  # the recorder's longest spacing
DIGEST = "sha256:" + "a1" * 32
BAD_DIGEST = "sha256:" + "b2" * 32  # the week's bad image, desired for a day
GPUS = (("RTX 4090", 40.0, 0.45), ("RTX 5090", 90.0, 0.9), ("RTX PRO 4000", 29.0, 0.35), ("L40S", 45.0, 0.8))
PARAMS_LOG = ("fleet-worker: fetching params 32GiB", "[#26a862 56GiB/56GiB(100%) CN:16 DL:0B]",
              "fleet-worker: params verified (blake2b) in 21m40s", "cuzk-daemon: listening on 127.0.0.1:9820")
IMAGE_TAIL = (*PARAMS_LOG, "cuzk-daemon: thread 'tokio-runtime-worker' panicked at "
              "/build/curio/extern/supraseal-c2/src/lib.rs:316:9:", "cuzk-daemon: sppark::Error #-700",
              "Error: Prove RPC failed", "benchmark.sh: cuzk-bench exited with status 1, 0/10 proofs")


@dataclass(frozen=True)
class Built:
    repo: Path
    until: datetime
    machines: int
    attempts: int
    commits: int
    samples: int
    demand_bytes: int


def spec_text(pools: int) -> str:
    lines = ["version: 1", "image: {repository: ghcr.io/example/cuzk-worker}", "controller: {url: http://127.0.0.1:8080}",
             "circuit_breaker: {distinct_machines: 3, window_hours: 24}",
             "kill_budget: {max_fraction: 0.2, min_machines: 1, window_hours: 24}", "pools:"]
    for i in range(pools):
        gpu, rate, price = GPUS[i % len(GPUS)]
        lines += [f"  - name: p{i:02d}", f"    gpu_name: {gpu}", f"    min_rate_proofs_per_hour: {rate:g}",
                  f"    max_price_usd_per_hour: {price:g}",
                  "    benchmark: {proofs: 10, concurrency: 1, timeout_minutes: 120}"]
        if i % 2 == 0:  # half the pools follow demand
            lines += [f"    count: {{min: {SLOTS // 2}, max: {SLOTS * 3 // 2}}}",
                      "    queue: {url_env: CURIO_DB_URL, task_types: [PoRep]}"]
        else:
            lines.append(f"    count: {SLOTS}")
    return "\n".join(lines) + "\n"


def _spec(text: str) -> FleetSpec:
    spec, problems = check_spec_text(text, "fleet.yaml")
    if spec is None:
        raise RuntimeError(f"bench spec is invalid: {[str(p) for p in problems]}")
    return spec


def _report(iid: str, machine: str, pool: str, gpu: str, start: datetime, kind: str, rate: float,
            digest: str, rng: random.Random) -> InstanceReport:
    def at(minutes: float) -> datetime:
        return start + timedelta(minutes=minutes)

    events = [PhaseEvent("params", "started", at(1)), PhaseEvent("params", "done", at(22)),
              PhaseEvent("benchmark", "started", at(25), details={"requested": 10, "concurrency": 1})]
    if kind == "image":
        result = BenchmarkResult("error", at(27), 10, 0, 0, started_at=at(25), exit_code=1, log_tail=IMAGE_TAIL)
        return InstanceReport(iid, start, pool=pool, machine_id=machine, gpu_name=gpu, image_digest=digest,
                              events=(*events, PhaseEvent("benchmark", "failed", at(27), exit_code=1,
                                                          log_tail=IMAGE_TAIL)), result=result, log_tail=IMAGE_TAIL)
    seconds = [round(3600 / rate * rng.uniform(0.95, 1.05), 1) for _ in range(10)]
    total = sum(seconds)
    result = BenchmarkResult("completed", at(25) + timedelta(seconds=total), 10, 10, 0, started_at=at(25), exit_code=0,
                             proofs_per_hour=round(36000 / total, 2), seconds_per_proof=round(total / 10, 2),
                             concurrency=1, image_digest=digest,
                             proofs=tuple(ProofResult(i + 1, "COMPLETED", s) for i, s in enumerate(seconds)),
                             log_tail=("=== Batch Summary ===", "completed:     10", "failed:        0"))
    return InstanceReport(iid, start, pool=pool, machine_id=machine, host_id=f"h{int(machine) % 997}", gpu_name=gpu,
                          image_digest=digest, events=tuple(events), result=result, log_tail=PARAMS_LOG)


def _verdict_passes(spec: FleetSpec, rng: random.Random, since: datetime) -> tuple[ReplayRecords, list[tuple[
        datetime, list[str], list[str]]], int]:
    """Every slot's admissions (one every 6-14 days: machines lost and replaced, from 10 days before the window;
    on the bad image's day some fail on it), each on a machine the records do not exclude when it is rented,
    judged and guarded pass by pass. The records after the last pass, and each pass: (time, machines it wrote,
    instances it judged)."""
    bad_day = since + timedelta(days=DAYS // 2)
    rentals = []
    for p in range(len(spec.pools)):
        for slot in range(SLOTS):
            t = since - timedelta(days=rng.uniform(0, 10))
            while t < UNTIL - timedelta(hours=2):
                rentals.append((t.replace(microsecond=0), p, slot))
                t += timedelta(days=rng.uniform(6, 14))
    rentals.sort()
    records = ReplayRecords({}, {})
    pending: dict[datetime, list[InstanceReport]] = {}
    passes: list[tuple[datetime, list[str], list[str]]] = []
    attempts = 0

    def judge_until(t: datetime) -> None:
        nonlocal attempts
        for at in sorted(k for k in pending if k <= t):
            verdicts = [v for r in pending.pop(at) if (v := judge(r, spec.pool(r.pool or ""), at)) is not None]
            attempts += len(verdicts)
            view = records.view(at, {v.machine_id for v in verdicts if v.machine_id},
                                max(spec.circuit_breaker.window_hours, spec.retest.window_hours))
            window = timedelta(hours=spec.kill_budget.window_hours)
            budgets = kill_budgets_of_marks(spec, records.marks_since(at - window), at)
            guarded, changed, _ = guard_and_record(spec, view, verdicts, at, prices={
                v.instance_id: round(spec.pool(v.pool or "").max_price_usd_per_hour * rng.uniform(0.6, 1.0), 3)
                for v in verdicts}, budgets=budgets)
            for rec in changed.values():
                records.put(rec)
            records.images.update(guarded.image_records)
            passes.append((at, sorted(changed), [v.instance_id for v in guarded.verdicts]))

    for serial, (t, p, slot) in enumerate(rentals):
        judge_until(t)
        pool = spec.pools[p]
        machine = str(100_000 + p * 1_000 + rng.randrange(SLOTS * 3 // 2))
        while records.excluded(machine, t):  # the offer query leaves out machines recorded bad
            machine = str(100_000 + p * 1_000 + rng.randrange(SLOTS * 3 // 2))
        roll = rng.random()
        bad = bad_day <= t < bad_day + timedelta(days=1) and roll < 0.4
        if bad and pool_pause(pool.name, RecordSet(images=records.images), BAD_DIGEST) is not None:
            continue  # the breaker paused the pool for the bad image: nothing is rented on it
        kind = "image" if bad else "slow" if roll < 0.08 else "ok"
        rate = pool.min_rate_proofs_per_hour * (rng.uniform(0.6, 0.95) if kind == "slow" else rng.uniform(1.02, 1.6))
        report = _report(f"{pool.name}-{slot}-{serial:06x}", machine, pool.name, pool.gpu_name, t, kind, rate,
                         BAD_DIGEST if bad else DIGEST, rng)
        judged_at = t + timedelta(minutes=27 if bad else 60)
        pending.setdefault(judged_at + timedelta(seconds=30 - judged_at.second % 30), []).append(report)
    judge_until(UNTIL)
    return records, passes, attempts


def _demand(spec: FleetSpec, rng: random.Random, since: datetime) -> tuple[dict[str, list[PoolSample]],
                                                                         dict[str, CapacityEntry]]:
    """Each pool's samples over the window, from a simulated leader (autoscaled pools decide on them)."""
    start_entries = {p.name: CapacityEntry(p.name, SLOTS, tuple(range(SLOTS))) for p in spec.pools
                     if p.min_count is not None}
    out: dict[str, list[PoolSample]] = {}
    for pool in spec.pools:
        phase = rng.uniform(0, 2 * math.pi)
        rate = pool.min_rate_proofs_per_hour * 1.2 / 3600  # proofs per busy second
        entry = start_entries.get(pool.name)
        desired = SLOTS if entry is None else entry.desired
        arrivals: list[tuple[datetime, int]] = []  # (when, machines ordered) still on their way
        serving = desired
        backlog = 0.0
        oldest: datetime | None = None
        tiles: list[tuple[datetime, float, float]] = []
        samples: list[PoolSample] = []
        last: PoolSample | None = None
        last_at = since
        busy_sum = wall_sum = proofs = 0.0
        t = since
        while t < UNTIL:
            t += timedelta(minutes=1)
            minute = (t - since).total_seconds() / 60
            day = math.sin(2 * math.pi * minute / 1440 + phase)
            want = SLOTS * (0.85 + 0.45 * day + 0.05 * rng.gauss(0, 1))  # machine-equivalents of work
            while arrivals and arrivals[0][0] <= t:
                serving += arrivals.pop(0)[1]
            serving = min(serving, desired)
            busy = min(max(0.0, want) + backlog / (rate * 60), serving)
            backlog = max(0.0, backlog + (max(0.0, want) - busy) * rate * 60)
            oldest = None if backlog < 1 else (oldest or t)
            busy_sum += busy * 60
            wall_sum += serving * 60
            proofs += busy * 60 * rate
            tiles.append((t, busy * 60, serving * 60))
            if int(minute) % PASS_MINUTES:
                continue
            on_the_way = sum(n for _, n in arrivals)
            up = _window(tiles, t, 600, serving)
            down = _window(tiles, t, 1800, serving)
            queue = QueueSnapshot({"PoRep": round(backlog)}, {"PoRep": int(busy)}, oldest) if pool.queue else None
            changed = False
            if entry is not None:
                states = tuple(SlotState(f"{pool.name}-{i}", i, f"{pool.name}-{i}",
                                         "serving" if i < serving else "on-the-way") for i in entry.slots)
                (d,) = decide_signals(replace(spec, pools=(pool,)), {pool.name: entry},
                                      {pool.name: PoolSignals(up, down, queue, states)}, t)
                changed = d.changed
                if d.after > desired:
                    arrivals.append((t + timedelta(minutes=15), d.after - desired))
                elif d.after < desired:
                    serving = min(serving, d.after)
                desired, entry = d.after, replace(d.entry, draining=(), slots=tuple(range(d.after)))
            sample = PoolSample(
                pool=pool.name, at=t, span_s=(t - last_at).total_seconds(), desired=desired,
                slots=len(entry.slots) if entry is not None else SLOTS, draining=0, serving=int(serving),
                on_the_way=on_the_way, stopped=0, draining_serving=0, busy_s=round(busy_sum, 3),
                wall_s=round(wall_sum, 3), proofs=int(proofs), usd_per_hour=round(serving * pool.max_price_usd_per_hour
                                                                                   * 0.8, 3),
                unpriced=0, waiting=queue.waiting if queue else None, running=queue.running if queue else None,
                oldest_wait_s=(t - oldest).total_seconds() if queue and oldest else None,
                up=up if entry is not None else None, down=down if entry is not None else None,
                image=DIGEST[7:19], changed=changed)
            due = last is None or changed or (t - last_at) >= timedelta(minutes=SPACING_MINUTES) or \
                sample.differs_from(last) is not None
            if due:
                samples.append(sample)
                last, last_at = sample, t
                busy_sum = wall_sum = proofs = 0.0
        out[pool.name] = samples
    return out, start_entries


def _window(tiles: list[tuple[datetime, float, float]], now: datetime, seconds: float, machines: float) -> Utilization:
    busy = wall = 0.0
    for at, b, w in reversed(tiles):
        if (now - at).total_seconds() >= seconds:
            break
        busy += b
        wall += w
    return Utilization(busy, wall, int(machines), seconds)


def build(root: Path, machines: int, seed: int = 11) -> Built:
    """The repository of a fleet of `machines` slots with its last DAYS days, under `root`."""
    rng = random.Random(seed)
    since = UNTIL - timedelta(days=DAYS)
    text = spec_text(max(1, machines // SLOTS))
    spec = _spec(text)
    records, passes, attempts = _verdict_passes(spec, rng, since)
    demand, entries = _demand(spec, rng, since)
    repo = root / f"fleet-{machines}"
    git(root, "init", "--quiet", "--initial-branch=main", str(repo))
    stream: list[bytes] = []
    blob_of: dict[str, int] = {}
    for mark, (machine_id, rec) in enumerate(sorted(records.machines.items()), start=1):
        blob_of[machine_id] = mark
        stream.append(b"blob\nmark :%d\n" % mark + fast_import_data(render_machine_record(rec)))
    images = [(img.tripped_at,
               f"M 100644 inline fleet-spec/images/{digest.removeprefix('sha256:')}.yaml\n".encode()
               + fast_import_data(render_image_record(img))) for digest, img in sorted(records.images.items())]

    def commit(at: datetime, who: str, message: str, changes: list[bytes]) -> None:
        stamp = f"{int(at.timestamp())} +0000"
        email = BOT_EMAIL if who == BOT_NAME else "ada@example.invalid"
        stream.append(b"commit refs/heads/main\n" + f"author {who} <{email}> {stamp}\n".encode()
                      + f"committer {who} <{email}> {stamp}\n".encode() + fast_import_data(message) + b"".join(changes))

    commit(since - timedelta(days=11), "Ada Operator", "fleet: the pools",
           [b"M 100644 inline fleet-spec/fleet.yaml\n" + fast_import_data(text),
            b"M 100644 inline fleet-spec/capacity.yaml\n" + fast_import_data(render_capacity(entries))])
    pardoned = sorted(records.machines)[::97][:5]  # humans pardon a few machines after their last verdict
    last_verdict = {m: max(e.at for e in records.machines[m].benchmarks) for m in pardoned}
    days = {d: [] for d in range(DAYS + 1)}  # demand files by day index, committed at the day's end
    demand_bytes = 0
    for pool, samples in demand.items():
        by_day: dict[datetime, list[PoolSample]] = {}
        for s in samples:
            by_day.setdefault(datetime(s.at.year, s.at.month, s.at.day, tzinfo=UTC), []).append(s)
        for day, day_samples in by_day.items():
            content = render_day(day_samples).encode()
            demand_bytes += len(content)
            index = min(DAYS, (day - since.replace(hour=0)).days)
            days[max(0, index)].append(f"M 100644 inline fleet-spec/{day_path(pool, day.date())}\n".encode()
                                       + fast_import_data(content))
    events: list[tuple[datetime, int, str, list[bytes]]] = []
    for at, machines_written, instances in passes:
        body = "".join(f"Fleet-Machine: {m}\n" for m in machines_written) + \
            "".join(f"Fleet-Instance: {i}\n" for i in instances)
        events.append((at, 1, f"fleet: {len(instances)} verdict(s)\n\n{body}",
                       [f"M 100644 :{blob_of[m]} fleet-spec/machines/{m}.yaml\n".encode() for m in machines_written]
                       + [change for tripped, change in images if tripped == format_time(at)]))
    for m, at in last_verdict.items():
        events.append((datetime.fromisoformat(at.replace("Z", "+00:00")) + timedelta(hours=6), 2,
                       f"pardon machine {m}: host replaced its PSU\n", [f"D fleet-spec/machines/{m}.yaml\n".encode()]))
    for d, changes in days.items():
        if changes:
            events.append((since.replace(hour=0) + timedelta(days=d, hours=23, minutes=59), 1,
                           "fleet demand: samples\n", changes))
    for at, kind, message, changes in sorted(events, key=lambda e: (e[0], e[1])):
        commit(at, BOT_NAME if kind == 1 else "Ada Operator", message, changes)
    git(repo, "fast-import", "--quiet", stdin=b"".join(stream))
    git(repo, "checkout", "--quiet", "main")
    return Built(repo, UNTIL, machines, attempts, len(events) + 1, sum(len(v) for v in demand.values()), demand_bytes)


def format_until(built: Built) -> str:
    return format_time(built.until)

"""Synthetic, realistic inputs for the benchmarks: a fleet spec with enough pools for 10,000 slots,
worker reports as the controller store returns them, machine records with benchmark history, and offers.

Record entries are not invented field by field: a few templates come from `verdict.judge` on realistic
reports (a passing benchmark, a slow machine, a CUDA error, a params failure), then vary per machine and
attempt (ids, times, rates), so the YAML on disk has the size and shape the reconciler really writes.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from reconciler.adapters.record_files import render_machine_record
from reconciler.adapters.spec_files import check_spec_text
from reconciler.domain.marketplace import Offer
from reconciler.domain.observations import BenchmarkResult, InstanceReport, PhaseEvent
from reconciler.domain.records import BenchmarkEntry, MachineRecord
from reconciler.domain.spec import FleetSpec
from reconciler.domain.verdict import judge

T0 = datetime(2026, 12, 2, 18, 0, tzinfo=UTC)
DIGEST = "sha256:" + "a1" * 32

#: (pool name, marketplace GPU model, min rate): 12 pools x 1000 slots = room for 12,000 instances.
POOLS: tuple[tuple[str, str, float], ...] = (
    ("rtx4090-a", "RTX 4090", 40), ("rtx4090-b", "RTX 4090", 40), ("rtx4090-c", "RTX 4090", 40),
    ("rtx5090-a", "RTX 5090", 90), ("rtx5090-b", "RTX 5090", 90), ("pro4000-a", "RTX PRO 4000", 29),
    ("pro4000-b", "RTX PRO 4000", 29), ("pro6000-a", "RTX PRO 6000", 80), ("rtx3090-a", "RTX 3090", 25),
    ("a6000-a", "RTX A6000", 28), ("l40s-a", "L40S", 45), ("h100-a", "H100 PCIE", 70),
)
SLOTS_PER_POOL = 1000

PARAMS_LOG = (
    "fleet-worker: fetching params 32GiB into /var/tmp/filecoin-proof-parameters",
    "[#26a862 38GiB/56GiB(67%) CN:16 DL:408MiB ETA:46s]",
    "[#26a862 56GiB/56GiB(100%) CN:16 DL:0B]",
    "02/12 18:21:40 [NOTICE] Download complete: /var/tmp/filecoin-proof-parameters/v28-stacked.params",
    "fleet-worker: params verified (blake2b) in 21m40s",
    "cuzk-daemon: loading SRS from /var/tmp/filecoin-proof-parameters",
    "cuzk-daemon: listening on 127.0.0.1:9820",
    "+ cuzk-bench batch -t porep --c1 /opt/fleet/c1.json -c 10 -j 2",
)
CUDA_TAIL = (*PARAMS_LOG, "  [1/10] ok — 121.4s", "Error: CUDA error 999: unknown error",
             "benchmark.sh: cuzk-bench exited with status 1, 1/10 proofs")
PARAMS_FAIL_TAIL = (PARAMS_LOG[0], "[#26a862 3.1GiB/56GiB(5%) CN:16 DL:1.2MiB ETA:13h]",
                    "02/12 18:40:11 [ERROR] CUID#7 - Download aborted. URI=https://proofs.example/v28.params",
                    "Exception: [AbstractCommand.cc:351] errorCode=22 Timeout.",
                    "aria2c: download failed (exit 22) after 3 attempts")


def spec_yaml(pools: Sequence[tuple[str, str, float]] = POOLS, count: int = SLOTS_PER_POOL) -> str:
    lines = ["version: 1", "image: {repository: ghcr.io/example/cuzk-worker}",
             "controller: {url: http://127.0.0.1:8080}", "circuit_breaker: {distinct_machines: 3, window_hours: 24}",
             "kill_budget: {max_fraction: 0.2, min_machines: 1, window_hours: 24}", "pools:"]
    for name, gpu, rate in pools:
        lines += [f"  - name: {name}", f"    gpu_name: {gpu}", f"    count: {count}",
                  f"    min_rate_proofs_per_hour: {rate}", "    max_price_usd_per_hour: 2.5",
                  "    benchmark: {proofs: 10, concurrency: 2, timeout_minutes: 120}"]
    return "\n".join(lines) + "\n"


def make_spec() -> FleetSpec:
    spec, problems = check_spec_text(spec_yaml(), "bench-fleet.yaml")
    if spec is None:
        raise RuntimeError(f"bench spec is invalid: {problems}")
    return spec


def _events(kind: str, start: datetime) -> tuple[PhaseEvent, ...]:
    def at(minutes: float) -> datetime:
        return start + timedelta(minutes=minutes)

    evs = [PhaseEvent("register", "done", at(0.5)), PhaseEvent("params", "started", at(1))]
    if kind == "params-failed":
        return (*evs, PhaseEvent("params", "failed", at(40), exit_code=22, message="aria2c exited 22",
                                 log_tail=PARAMS_FAIL_TAIL))
    evs += [PhaseEvent("params", "progress", at(5 + i), details={"done_gib": 8 * i, "total_gib": 56})
            for i in range(1, 7)]
    evs += [PhaseEvent("params", "done", at(22)), PhaseEvent("daemon", "started", at(23)),
            PhaseEvent("daemon", "done", at(24)), PhaseEvent("benchmark", "started", at(25))]
    if kind == "running":
        return tuple(evs)
    if kind == "cuda-error":
        return (*evs, PhaseEvent("benchmark", "failed", at(27), exit_code=1, message="benchmark.sh exited 1",
                                 log_tail=CUDA_TAIL))
    return (*evs, PhaseEvent("benchmark", "done", at(60)))


def make_report(instance_id: str, machine_id: str, pool: tuple[str, str, float], kind: str, rate: float,
                start: datetime) -> InstanceReport:
    """A report as the controller store hands it to the loop. kind: ok | slow | cuda-error | params-failed |
    running. `rate` is the proofs/hour of a completed benchmark."""
    name, gpu, _ = pool
    result = None
    tail: tuple[str, ...] = PARAMS_LOG
    if kind in ("ok", "slow"):
        spp = 3600.0 / rate
        tail = (*PARAMS_LOG, *(f"  [{i}/10] ok — {spp * 2:.1f}s" for i in range(1, 11)), "=== Batch Summary ===",
                "completed:     10", "failed:        0",
                f"throughput:    {rate / 60:.3f} proofs/min ({spp:.1f}s/proof)")
        result = BenchmarkResult(outcome="completed", at=start + timedelta(minutes=60), requested=10, completed=10,
                                 failed=0, started_at=start + timedelta(minutes=25), exit_code=0,
                                 proofs_per_hour=rate, seconds_per_proof=spp, proof_type="porep", concurrency=2,
                                 image_digest=DIGEST, log_tail=tail[-14:])
    elif kind == "cuda-error":
        tail = CUDA_TAIL
        result = BenchmarkResult(outcome="error", at=start + timedelta(minutes=27), requested=10, completed=1,
                                 failed=0, started_at=start + timedelta(minutes=25), exit_code=1, log_tail=CUDA_TAIL)
    elif kind == "params-failed":
        tail = PARAMS_FAIL_TAIL
    return InstanceReport(
        instance_id=instance_id, registered_at=start, pool=name, slot=f"{name}-0", machine_id=machine_id,
        host_id=str(7000 + int(machine_id) % 997), contract_id=str(9_000_000 + int(machine_id)), gpu_name=gpu,
        image_digest=DIGEST, image_version="v1", events=_events(kind, start), result=result, log_tail=tail)


def _template_entries() -> dict[str, BenchmarkEntry]:
    """One real entry per verdict kind, produced by verdict.judge (evidence as the loop writes it)."""
    spec = make_spec()
    pool = POOLS[0]
    out = {}
    for kind, rate in (("ok", 62.0), ("slow", 21.0), ("cuda-error", 0.0), ("params-failed", 0.0)):
        report = make_report(f"tmpl-{kind}", "100000", pool, kind, rate or 1.0, T0)
        verdict = judge(report, spec.pool(pool[0]), T0 + timedelta(hours=3))
        if verdict is None:
            raise RuntimeError(f"template {kind}: judge returned None")
        out[kind] = verdict.to_entry()
    return out


def machine_id_of(index: int) -> str:
    return str(100_000 + index)


def machine_records(machines: int, entries_per_machine: int, seed: int = 7) -> Iterator[MachineRecord]:
    """`machines` records with `entries_per_machine` judged attempts each (mostly passing, some failures)."""
    rng = random.Random(seed)
    templates = _template_entries()
    kinds = ["ok"] * 14 + ["slow"] * 3 + ["cuda-error"] * 2 + ["params-failed"]
    for m in range(machines):
        mid = machine_id_of(m)
        pool = POOLS[m % len(POOLS)]
        base_rate = rng.uniform(0.9, 1.6) * pool[2]
        entries = []
        for e in range(entries_per_machine):
            kind = rng.choice(kinds)
            at = T0 - timedelta(days=entries_per_machine - e, minutes=rng.randint(0, 600))
            instance_id = f"{pool[0]}-{m % SLOTS_PER_POOL}-{m:05x}{e:02x}"
            entry = replace(templates[kind], instance_id=instance_id,
                            at=at.strftime("%Y-%m-%dT%H:%M:%SZ"), pool=pool[0], contract_id=str(8_000_000 + m * 64 + e))
            if kind in ("ok", "slow"):
                rate = round(base_rate * rng.uniform(0.9, 1.1) * (0.5 if kind == "slow" else 1.0), 1)
                ok = rate >= pool[2]
                spp = round(3600 / rate, 1)
                entry = replace(entry, proofs_per_hour=rate, seconds_per_proof=spp,
                                verdict="ok" if ok else "below-min-rate", blame="none" if ok else "machine",
                                marks_bad=not ok, min_rate_proofs_per_hour=pool[2],
                                reason=f"{'ok' if ok else 'below-min-rate'} {rate}/h {'>=' if ok else '<'} "
                                       f"{pool[2]:g}/h ({spp} s/proof)",
                                evidence={**entry.evidence, "proofs_per_hour": rate, "seconds_per_proof": spp,
                                          "gpu_name": pool[1], "machine_id": mid, "instance_id": instance_id})
            entries.append(entry)
        status = "bad" if entries[-1].marks_bad else "ok"
        yield MachineRecord(mid, status=status, host_id=str(7000 + m % 997), gpu_name=pool[1],
                            benchmarks=tuple(entries))


def write_records(spec_dir: Path, machines: int, entries_per_machine: int) -> list[MachineRecord]:
    """Write the records as the reconciler would (render_machine_record) and return them."""
    mdir = spec_dir / "machines"
    mdir.mkdir(parents=True, exist_ok=True)
    records = []
    for rec in machine_records(machines, entries_per_machine):
        (mdir / f"{rec.machine_id}.yaml").write_text(render_machine_record(rec), encoding="utf-8")
        records.append(rec)
    return records


def pass_reports(records: Sequence[MachineRecord], instances: int, new_fraction: float = 0.05,
                 running_fraction: float = 0.05, seed: int = 11) -> list[InstanceReport]:
    """What the store returns in a steady-state pass over `instances` live instances: most were judged in an
    earlier pass (their ids are in the machines' records), a few finished since the last pass (to judge),
    a few are still benchmarking."""
    rng = random.Random(seed)
    out = []
    for i in range(instances):
        rec = records[i % len(records)]
        pool = next(p for p in POOLS if p[0] == rec.benchmarks[-1].pool)
        start = T0 + timedelta(minutes=rng.randint(0, 60))
        roll = rng.random()
        if roll < new_fraction:
            kind = rng.choice(["ok"] * 6 + ["slow", "cuda-error", "params-failed"])
            iid = f"{pool[0]}-{i % SLOTS_PER_POOL}-n{i:06x}"
        elif roll < new_fraction + running_fraction:
            kind, iid = "running", f"{pool[0]}-{i % SLOTS_PER_POOL}-r{i:06x}"
        else:
            kind, iid = "ok", rec.benchmarks[-1].instance_id
        rate = pool[2] * rng.uniform(0.4, 1.5)
        out.append(make_report(iid, rec.machine_id, pool, kind, rate, start))
    return out


def offers(count: int, machines: int, seed: int = 5, *, all_fit: bool = False) -> list[Offer]:
    """`count` marketplace offers over `machines` machines (several offers per machine, as on vast.ai).
    `all_fit`: every offer satisfies the first pool's constraints (the worst case for sorting)."""
    rng = random.Random(seed)
    gpus = [p[1] for p in POOLS] + ["RTX 3080", "RTX 4070"]
    out = []
    for i in range(count):
        m = rng.randrange(machines)
        offer = Offer(offer_id=str(20_000_000 + i), machine_id=machine_id_of(m), host_id=str(7000 + m % 997),
                      gpu_name=gpus[m % len(gpus)], num_gpus=rng.choice([1, 1, 1, 2, 4]),
                      price_usd_per_hour=round(rng.uniform(0.1, 3.0), 3), reliability=rng.uniform(0.8, 1.0),
                      inet_down_mbps=rng.uniform(50, 2000), disk_gb=rng.choice([100, 200, 500, 1000]),
                      cpu_ram_gb=rng.choice([64, 128, 256, 512]), cuda_max_good=rng.choice([11.8, 12.4, 12.8]),
                      verified=rng.random() < 0.8, geolocation="Norway, NO")
        if all_fit:
            offer = replace(offer, gpu_name=POOLS[0][1], num_gpus=1, price_usd_per_hour=round(rng.uniform(0.1, 2.4), 3),
                            reliability=rng.uniform(0.96, 1.0), inet_down_mbps=rng.uniform(500, 2000), disk_gb=500,
                            cpu_ram_gb=256, cuda_max_good=12.8, verified=True)
        out.append(offer)
    return out

"""The Pulumi program at scale: 1,000 slots with 10,000 machine records (issue #12, target <= 10 s).

Runs infra/program.main() as `pulumi up` runs it, with the engine replaced by pulumi's own mocks (the CLI is
not installable here): the program reads the spec and the records, registers the worker image and one
dynamic resource per slot (each one serialising the slot provider, as the SDK does), and the mocks answer
each registration at once. Measured: wall time of the whole program with the record index warm and on a fresh
clone's first run (index built), the record load through the index vs plain `load_records` (reference), the
bytes of slot inputs the engine would receive and store, and - the reference measured in the same run - the
bytes the same slots would carry with the exclusion set and measured rates inline in every slot (the earlier
program: records x slots). A RecursionError in the SDK's serialize_provider (seen at ~488 resources) would
fail the run.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi

from bench.common import Figure
from bench.data import write_records
from infra import program
from reconciler.adapters.record_files import load_records
from reconciler.adapters.record_index import load_indexed
from reconciler.adapters.spec_files import load_spec
from reconciler.domain.slots import slot_inputs

SLOT_TYPE = "pulumi-python:dynamic/fleet:Slot"
MACHINES = 10_000
POOLS = (("rtx4090", "RTX 4090", 40, 400), ("rtx5090", "RTX 5090", 90, 250), ("pro4000", "RTX PRO 4000", 29, 250),
         ("rtx3090", "RTX 3090", 25, 100))  # 1,000 slots
DIGEST = "sha256:" + "b2" * 32
CPU_TIMES: list[float] = []


def spec_text(context: Path) -> str:
    lines = ["version: 1", "image: {repository: ghcr.io/example/cuzk-worker, context: " + str(context) + "}",
             "controller: {url: https://controller.example}", "pools:"]
    for name, gpu, rate, count in POOLS:
        lines += [f"  - name: {name}", f"    gpu_name: {gpu}", f"    count: {count}",
                  f"    min_rate_proofs_per_hour: {rate}", "    max_price_usd_per_hour: 2.5"]
    return "\n".join(lines) + "\n"


@dataclass
class RegisterOnly(pulumi.runtime.Mocks):
    slot_inputs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        if args.typ == "docker:index/image:Image":
            return f"{args.name}-id", {**args.inputs, "repoDigest": f"ghcr.io/example/cuzk-worker@{DIGEST}"}
        if args.typ == SLOT_TYPE:
            self.slot_inputs[args.name] = dict(args.inputs)
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list | None]:
        return {}, None


def run_program(root: Path, mocks: RegisterOnly) -> float:
    """Wall seconds of one program run; its CPU seconds are appended to CPU_TIMES (wall time on this shared
    2-core machine mostly measures the other processes)."""
    config = {"gpu-fleet:specPath": str(root / "fleet-spec" / "fleet.yaml"), "gpu-fleet:backend": "vastai",
              "gpu-fleet:poolDataDir": str(root / "pool-data")}
    started, cpu = time.perf_counter(), time.process_time()

    @pulumi.runtime.test
    def go() -> None:
        pulumi.runtime.set_mocks(mocks, project="gpu-fleet", stack="bench", preview=False)
        pulumi.runtime.set_all_config(config)
        program.main()

    go()
    CPU_TIMES.append(time.process_time() - cpu)
    return time.perf_counter() - started


def _bytes(props: dict[str, Any]) -> int:
    return len(json.dumps(props, sort_keys=True, default=str).encode())


def run(repeats: int = 2) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="bench-program-") as tmp:
        root = Path(tmp)
        # a checkout: the record index lives in its git dir (adapters/record_index.py), as in CI's clone
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        context = root / "worker-image"
        context.mkdir()
        (context / "Dockerfile").write_text("FROM scratch\n")
        spec_dir = root / "fleet-spec"
        spec_dir.mkdir()
        (spec_dir / "fleet.yaml").write_text(spec_text(context))
        write_records(spec_dir, MACHINES, 2)

        mocks = RegisterOnly()
        CPU_TIMES.clear()
        cold = run_program(root, mocks)  # builds the record index (a fresh clone: CI's `pulumi up`)
        warm = []
        for _ in range(repeats):
            mocks = RegisterOnly()
            warm.append(run_program(root, mocks))
        seconds = statistics.median(warm)
        cold_cpu, warm_cpu = CPU_TIMES[0], statistics.median(CPU_TIMES[1:])
        t0 = time.perf_counter()
        records = load_indexed(spec_dir)
        bad = len(records.bad_machine_ids())
        index_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        load_records(spec_dir)  # the reference: every file parsed and validated
        plain_s = time.perf_counter() - t0
        slots = len(mocks.slot_inputs)
        inputs_bytes = sum(_bytes({k: v for k, v in p.items() if k != "__provider"})
                           for p in mocks.slot_inputs.values())
        provider_bytes = sum(len(str(p.get("__provider", ""))) for p in mocks.slot_inputs.values())
        pool_files = sorted((root / "pool-data").glob("*.json"))
        pool_bytes = sum(f.stat().st_size for f in pool_files)

        # reference: the same slots with the records-derived data inline in every slot
        spec = load_spec(spec_dir / "fleet.yaml")
        inline = 0
        for pool in spec.pools:
            one = slot_inputs(spec, pool, f"{pool.name}-0", records, image=f"ghcr.io/x@{DIGEST}",
                              image_digest=DIGEST).to_props()
            inline += _bytes(one) * pool.count

    detail = f"{slots:,} slots in {len(POOLS)} pools, {MACHINES:,} machine records ({bad:,} bad)"
    return [
        Figure("program registers 1,000 slots with 10,000 records (record index warm)", seconds, "s",
               f"wall, median of {repeats}; CPU {warm_cpu:.1f} s; {detail}; almost all of it is the pulumi SDK's own "
               "per-resource registration (prepare/serialize/stack trace per resource)",
               target="<= 10 s", passed=seconds <= 10 and slots == 1000),
        Figure("  same, CPU time of the program process", warm_cpu, "s", "median; what the figure is on an idle "
               "machine with one core for it", target="<= 10 s", passed=warm_cpu <= 10),
        Figure("  first run of a fresh clone (builds the record index)", cold, "s",
               f"wall, 1 run, CPU {cold_cpu:.1f} s; CI's `pulumi up` runs in a fresh clone", target="<= 10 s",
               passed=cold <= 10),
        Figure("  records through the index (warm) / load_records without it (reference)", index_s, "s",
               f"reference load_records: {plain_s:.1f} s"),
        Figure("slot inputs sent to the engine (all slots, without __provider)", inputs_bytes, "B",
               f"{inputs_bytes / max(slots, 1):,.0f} B per slot; + {len(pool_files)} pool-data files, "
               f"{pool_bytes:,} B in all (written once per pool)"),
        Figure("reference: same slots with exclusions + rates inline", inline, "B",
               f"{inline / max(slots, 1):,.0f} B per slot; {inline / max(inputs_bytes, 1):,.0f}x the above"),
        Figure("serialized provider (__provider), all slots", provider_bytes, "B",
               f"{provider_bytes / max(slots, 1):,.0f} B per slot; no RecursionError over {slots:,} resources"),
    ]

"""Shared test scenarios: a two-pool spec, the image digest, times, and builders of instance reports
(completed benchmarks, failures with realistic log tails). Used by unit and integration tests alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from reconciler.adapters.spec_files import check_spec_text
from reconciler.domain.observations import BenchmarkResult, InstanceReport, PhaseEvent
from reconciler.domain.records import ImageSuspectRecord, MachineRecord, RecordSet
from reconciler.domain.spec import FleetSpec
from reconciler.domain.verdict import Verdict, judge

T0 = datetime(2026, 12, 2, 18, 0, tzinfo=UTC)
DIGEST = "sha256:" + "a1" * 32

SPEC_YAML = """\
version: 1
image: {repository: ghcr.io/example/cuzk-worker}
controller: {url: http://127.0.0.1:8080}
circuit_breaker: {distinct_machines: 2, window_hours: 24}
kill_budget: {max_fraction: 0.2, min_machines: 1, window_hours: 24}
pools:
  - name: rtx-pro-4000
    gpu_name: RTX PRO 4000
    count: 2
    min_rate_proofs_per_hour: 29
    max_price_usd_per_hour: 0.6
    benchmark: {proofs: 10, concurrency: 2, timeout_minutes: 120}
  - name: rtx4090
    gpu_name: RTX 4090
    count: 10
    min_rate_proofs_per_hour: 40
    max_price_usd_per_hour: 0.6
    benchmark: {proofs: 10, concurrency: 2, timeout_minutes: 90}
"""

#: The seed's incident: params fine, the bench runs before our daemon listens, 0 proofs.
PARAMS_OK_LOG = (
    "fleet-worker: fetching params 32GiB into /var/tmp/filecoin-proof-parameters",
    "[#26a862 44GiB/44GiB(100%) CN:16 DL:0B]",
    "02/12 18:21:40 [NOTICE] Download complete: /var/tmp/filecoin-proof-parameters/v28-stacked.params",
    "fleet-worker: params verified (blake2b) in 21m40s",
)

DAEMON_REFUSED_TAIL = (
    *PARAMS_OK_LOG,
    "cuzk-daemon: loading SRS from /var/tmp/filecoin-proof-parameters",
    "+ cuzk-bench batch -t porep --c1 /opt/fleet/c1.json -c 10 -j 2",
    "Error: connection refused (os error 111) connecting to 127.0.0.1:9820",
    "benchmark.sh: cuzk-bench exited with status 1, 0/10 proofs",
)


def ev(phase: str, status: str, minutes: float, **kw: Any) -> PhaseEvent:
    return PhaseEvent(phase=phase, status=status, at=T0 + timedelta(minutes=minutes), **kw)


def make_report(instance_id: str, machine_id: str | None = "40213", *, pool: str = "rtx-pro-4000",
                host_id: str | None = "7781", gpu_name: str = "RTX PRO 4000", digest: str | None = DIGEST,
                events: Sequence[PhaseEvent] = (), result: BenchmarkResult | None = None,
                log_tail: Sequence[str] = (), registered_min: float = 0.0,
                destroyed_min: float | None = None) -> InstanceReport:
    return InstanceReport(
        instance_id=instance_id, registered_at=T0 + timedelta(minutes=registered_min), pool=pool,
        slot=f"{pool}-0", machine_id=machine_id, host_id=host_id, contract_id=f"c-{instance_id}",
        gpu_name=gpu_name, image_digest=digest, events=tuple(events), result=result, log_tail=tuple(log_tail),
        destroyed_at=None if destroyed_min is None else T0 + timedelta(minutes=destroyed_min))


def completed_report(instance_id: str, machine_id: str, rate: float, **kw: Any) -> InstanceReport:
    spp = 3600.0 / rate
    result = BenchmarkResult(outcome="completed", at=T0 + timedelta(minutes=60), requested=10, completed=10,
                             failed=0, started_at=T0 + timedelta(minutes=25), exit_code=0, proofs_per_hour=rate,
                             seconds_per_proof=spp, image_digest=kw.get("digest", DIGEST),
                             log_tail=("=== Batch Summary ===", "completed:     10", "failed:        0",
                                       f"throughput:    {rate / 60:.3f} proofs/min ({spp:.1f}s/proof)"))
    return make_report(instance_id, machine_id, events=[*bench_events(), ev("benchmark", "done", 60)],
                       result=result, **kw)


def error_report(instance_id: str, machine_id: str, tail: Sequence[str], *, exit_code: int = 1,
                 **kw: Any) -> InstanceReport:
    """benchmark.sh exited non-zero: the worker reports the failed phase and an error result, 0 proofs."""
    at = T0 + timedelta(minutes=27)
    result = BenchmarkResult(outcome="error", at=at, requested=10, completed=0, failed=0,
                             started_at=T0 + timedelta(minutes=25), exit_code=exit_code, log_tail=tuple(tail))
    events = [*bench_events(), ev("benchmark", "failed", 27, exit_code=exit_code, log_tail=tuple(tail),
                                  message=f"benchmark.sh exited {exit_code}")]
    return make_report(instance_id, machine_id, events=events, result=result, log_tail=tail, **kw)


LATER = T0 + timedelta(hours=3)

OTHER_DIGEST = "sha256:" + "b2" * 32


def _gpu_panic_tail(payload: str) -> tuple[str, ...]:
    """A GPU failure as the real daemon reports it (curio e0294b0f extern/supraseal-c2/src/lib.rs:316 panics with
    sppark's error; the panic message is on the next line, Rust >= 1.73), then the bench gives up."""
    return (
        *PARAMS_OK_LOG,
        "cuzk-daemon: 2026-12-02T18:24:00.102260Z  INFO cuzk_daemon: cuzk-daemon ready, serving on 127.0.0.1:9820",
        "  [1/10] COMPLETED — 121.4s (prove=38411 ms, queue=3 ms)",
        "cuzk-daemon: thread 'tokio-runtime-worker' panicked at /build/curio/extern/supraseal-c2/src/lib.rs:316:9:",
        f"cuzk-daemon: {payload}",
        "Error: Prove RPC failed",
        "",
        "Caused by:",
        f'    status: Internal, message: "partition 0 GPU task panicked: task 57 panicked with message '
        f'\\"{payload}\\"", '
        "details: [], metadata: MetadataMap { headers: {} }",
        "benchmark.sh: cuzk-bench exited with status 1, 1/10 proofs",
    )


#: A machine-class CUDA failure: the container sees no GPU (cudaErrorNoDevice, negated by sppark).
CUDA_ERROR_TAIL = _gpu_panic_tail("sppark::Error #-100")
#: An image-class CUDA failure: our kernels fault (cudaErrorIllegalAddress) - on every machine alike.
IMAGE_CUDA_TAIL = _gpu_panic_tail("sppark::Error #-700")


def spec_from_text(text: str = SPEC_YAML) -> FleetSpec:
    spec, problems = check_spec_text(text, "fleet.yaml")
    assert spec is not None, problems
    return spec


def bench_events(bench_start: float = 25.0) -> list[PhaseEvent]:
    return [ev("register", "done", 0.5), ev("params", "started", 1), ev("params", "done", 22),
            ev("daemon", "started", 23), ev("daemon", "done", 24), ev("benchmark", "started", bench_start)]


def params_failed_report(instance_id: str, machine_id: str, tail: Sequence[str], **kw: Any) -> InstanceReport:
    events = [ev("register", "done", 0.5), ev("params", "started", 1),
              ev("params", "failed", 14, exit_code=22, log_tail=tuple(tail), message="aria2c exited 22")]
    return make_report(instance_id, machine_id, events=events, log_tail=tail, **kw)


def verdict_of(report: InstanceReport, now: datetime = LATER) -> Verdict:
    v = judge(report, SPEC.pool(report.pool or ""), now)
    assert v is not None
    return v


def records_of(verdicts: Iterable[Verdict], images: Iterable[ImageSuspectRecord] = ()) -> RecordSet:
    machines: dict[str, MachineRecord] = {}
    for v in verdicts:
        assert v.machine_id is not None
        rec = machines.get(v.machine_id, MachineRecord(v.machine_id))
        machines[v.machine_id] = rec.with_entry(v.to_entry(), host_id=v.host_id, gpu_name=v.gpu_name)
    return RecordSet(machines=machines, images={i.image_digest: i for i in images})


SPEC = spec_from_text()

"""Builders for capacity tests: an autoscaled spec and serving reports with heartbeats at chosen minutes."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from reconciler.adapters.spec_files import check_spec_text
from reconciler.domain.observations import BenchmarkResult, InstanceReport, PhaseEvent
from reconciler.domain.spec import FleetSpec
from tests.scenarios import DIGEST, T0

AUTOSCALED_SPEC = """\
version: 1
image: {repository: ghcr.io/example/cuzk-worker}
controller: {url: http://127.0.0.1:8080}
max_total_dph: 6.0
serving: {heartbeat_minutes: 5, window_minutes: 60, lost_after_minutes: 20}
pools:
  - name: rtx4090
    gpu_name: RTX 4090
    count: {min: 1, max: 8}
    min_rate_proofs_per_hour: 40
    max_price_usd_per_hour: 0.5
    scaling: {target_utilization: 0.8, scale_up_after_minutes: 20, scale_down_after_minutes: 30,
              cooldown_minutes: 15}
    queue: {url_env: CURIO_DB_URL, task_types: [PoRep]}
"""


def autoscaled_spec(text: str = AUTOSCALED_SPEC) -> FleetSpec:
    spec, problems = check_spec_text(text, "fleet.yaml")
    assert spec is not None, [str(p) for p in problems]
    return spec


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def _ev(phase: str, status: str, minutes: float, **kw: object) -> PhaseEvent:
    return PhaseEvent(phase=phase, status=status, at=at(minutes), **kw)  # type: ignore[arg-type]


MARKET_SPEC = AUTOSCALED_SPEC.replace(
    "task_types: [PoRep]}",
    "task_types: [PoRep],\n            market: {task_types: [PSProve], min_margin: 0.2, usd_per_fil: 4.0}}")


def serving(instance_id: str, slot: str, busy: Sequence[bool], *, start: float = 0.0, rate: float = 50.0,
            every: float = 5.0, pool: str = "rtx4090", stopped_at: float | None = None,
            proofs_per_beat: int = 4, beat_minutes: Sequence[float] | None = None) -> InstanceReport:
    """A worker that passed admission at `start` and sends a heartbeat every `every` minutes, busy or not (or at
    `beat_minutes`, one per entry of `busy`: silences and returns)."""
    minutes = list(beat_minutes) if beat_minutes is not None else [start + 1 + every * i for i in range(len(busy))]
    beats = [_ev("serve", "progress", minutes[i], details={"heartbeat": {
        "seq": i + 1, "interval_s": (minutes[i] - minutes[i - 1]) * 60.0 if i else None,
        "completed": proofs_per_beat if b else 0, "failed": 0, "busy": b}}) for i, b in enumerate(busy)]
    events = [_ev("benchmark", "started", start - 20), _ev("serve", "started", start), *beats]
    if stopped_at is not None:
        events.append(_ev("serve", "done", stopped_at, message="drained: no proofs left in progress"))
    result = BenchmarkResult("completed", at(start - 1), 10, 10, 0, proofs_per_hour=rate,
                             seconds_per_proof=3600 / rate)
    return InstanceReport(instance_id, at(start - 30), pool=pool, slot=slot, machine_id=f"m-{instance_id}",
                          gpu_name="RTX 4090", image_digest=DIGEST, events=tuple(events), result=result)


def benchmarking(instance_id: str, slot: str, start: float, pool: str = "rtx4090") -> InstanceReport:
    """A machine still in params/benchmark: capacity on its way."""
    return InstanceReport(instance_id, at(start), pool=pool, slot=slot, machine_id=f"m-{instance_id}",
                          gpu_name="RTX 4090", image_digest=DIGEST,
                          events=(_ev("params", "started", start + 1), _ev("benchmark", "started", start + 5)))

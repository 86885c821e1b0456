"""Machine records for the record-loading tests (the stat-keyed cache and the blob-keyed index): entries with a
rate, records built from them, and records written to a spec directory as the reconciler writes them."""

from __future__ import annotations

from pathlib import Path

from reconciler.adapters.atomic_files import write_text_atomic
from reconciler.adapters.record_files import machine_record_path, render_machine_record
from reconciler.domain.records import BenchmarkEntry, MachineRecord


def rated_entry(instance: str, rate: float, marks_bad: bool = False, pool: str = "rtx4090") -> BenchmarkEntry:
    verdict = "below-min-rate" if marks_bad else "ok"
    return BenchmarkEntry(instance_id=instance, at="2026-12-02T10:00:00Z", verdict=verdict,
                          blame="machine" if marks_bad else "none", marks_bad=marks_bad, pool=pool,
                          price_usd_per_hour=None if rate > 44 else round(rate / 100, 2),
                          reason=f"{verdict} {rate}/h", proofs_per_hour=rate,
                          evidence={"log_tail": [f"throughput:    {rate / 60:.3f} proofs/min"], "exit_code": 0})


def rated_record(machine_id: str, *rates: float, bad: bool = False) -> MachineRecord:
    """One entry per rate; with `bad`, the last one marks the machine bad."""
    rec = MachineRecord(machine_id)
    for i, rate in enumerate(rates):
        rec = rec.with_entry(rated_entry(f"p-{machine_id}-{i}", rate, bad and i == len(rates) - 1), host_id="7",
                             gpu_name="RTX 4090")
    return rec


def write_record(spec_dir: Path, rec: MachineRecord) -> Path:
    path = machine_record_path(spec_dir, rec.machine_id)
    write_text_atomic(path, render_machine_record(rec))
    return path

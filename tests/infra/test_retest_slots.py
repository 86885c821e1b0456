"""The Pulumi program's side of a retest (issue 29 item 4): the slot whose instance failed `unknown` and was held
for a retest carries that machine in `retest_machine_ids`, so the provider's next create for that slot rents it
first while it is offered (as `fleet apply`'s planner does with `retest_machine`). Only that slot, only within the
retest window, never a machine recorded bad since. The program's own function, real record objects."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from infra.hosts import retest_machines_by_slot, static_slot_props
from reconciler.domain.records import BenchmarkEntry, MachineRecord, RecordSet
from reconciler.domain.retests import HELD_FOR_RETEST
from reconciler.domain.spec import ControllerSettings, FleetSpec, ImageSettings, PoolSpec

POOL = PoolSpec(name="a", gpu_name="RTX 4090", count=3, min_rate_proofs_per_hour=40, max_price_usd_per_hour=0.6)
OTHER = PoolSpec(name="b", gpu_name="RTX 4090", count=1, min_rate_proofs_per_hour=40, max_price_usd_per_hour=0.6)
SPEC = FleetSpec(image=ImageSettings(repository="registry.example/worker"), controller=ControllerSettings(url="http://c"),
                 pools=(POOL, OTHER))


def _entry(instance_id: str, at: datetime, *, pool: str = "a", held_by: str | None = HELD_FOR_RETEST,
           verdict: str = "benchmark-error", marks_bad: bool = False) -> BenchmarkEntry:
    return BenchmarkEntry(instance_id=instance_id, at=at.strftime("%Y-%m-%dT%H:%M:%SZ"), verdict=verdict,
                          blame="unknown" if not marks_bad else "machine", marks_bad=marks_bad,
                          reason=f"{verdict}: not recognised: odd", pool=pool, image_digest="sha256:" + "e" * 64,
                          signature="benchmark-error-unrecognized-x", held_by=held_by)


def _records(*records: MachineRecord) -> RecordSet:
    return RecordSet(machines={r.machine_id: r for r in records})


def test_the_slot_whose_instance_failed_unknown_retests_its_machine(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    records = _records(MachineRecord(machine_id="m1", benchmarks=(_entry("a-1-n1", now - timedelta(minutes=20)),)))
    props = static_slot_props(SPEC, POOL, records, pool_data_dir=str(tmp_path))
    assert props["a-1"]["retest_machine_ids"] == ["m1"]
    assert "retest_machine_ids" not in props["a-0"] and "retest_machine_ids" not in props["a-2"]
    # The other pool's slots never take it, even with the same slot index.
    assert "retest_machine_ids" not in static_slot_props(SPEC, OTHER, records, pool_data_dir=str(tmp_path))["b-0"]


def test_no_retest_once_decided_outside_the_window_or_when_bad() -> None:
    now = datetime(2026, 12, 6, 18, 0, tzinfo=UTC)
    held = _entry("a-0-n1", now - timedelta(minutes=20))
    window = timedelta(hours=SPEC.retest.window_hours)
    cases = {
        # The retest ran and was judged: its newest attempt is no longer held.
        "retested": MachineRecord(machine_id="m1", benchmarks=(held, _entry("a-0-n2", now, held_by=None,
                                                                            verdict="ok"))),
        # Past the retest window: nothing to retest any more.
        "expired": MachineRecord(machine_id="m2", benchmarks=(_entry("a-0-n3", now - window - timedelta(minutes=1)),)),
        # Recorded bad meanwhile (a ban by a PR): never rented again, retest or not.
        "bad": MachineRecord(machine_id="m3", status="banned", benchmarks=(_entry("a-0-n4", now),)),
    }
    for name, record in cases.items():
        records = _records(record)
        assert retest_machines_by_slot(SPEC, POOL, records, records.bad_machine_ids(now), now) == {}, name
    pending = _records(MachineRecord(machine_id="m4", benchmarks=(_entry("a-2-n5", now),)))
    assert retest_machines_by_slot(SPEC, POOL, pending, frozenset(), now) == {"a-2": {"m4"}}

"""Machine records: round trip, derived bad set and perf history, unsafe ids, unreadable files kept."""

from pathlib import Path

import pytest

from reconciler.adapters.atomic_files import write_text_atomic
from reconciler.adapters.record_files import load_records, machine_record_path, render_machine_record
from reconciler.domain.records import BenchmarkEntry, MachineRecord, RecordError, check_machine_id


def _entry(instance: str, verdict: str, rate: float | None, marks_bad: bool) -> BenchmarkEntry:
    return BenchmarkEntry(instance_id=instance, at="2026-12-02T10:00:00Z", verdict=verdict,
                          blame="machine" if marks_bad else "none", marks_bad=marks_bad,
                          reason=f"{verdict} at {rate}", proofs_per_hour=rate,
                          evidence={"log_tail": ["[1/2] ok — 90.0s"], "exit_code": 0})


def test_round_trip_and_derived_views(tmp_path: Path) -> None:
    good = MachineRecord("111").with_entry(_entry("p-0-a", "ok", 45.0, False), host_id="7", gpu_name="RTX 4090")
    good = good.with_entry(_entry("p-0-b", "ok", 41.0, False), host_id="7", gpu_name="RTX 4090")
    slow = MachineRecord("222").with_entry(_entry("p-1-a", "below-min-rate", 20.0, True), host_id="7",
                                           gpu_name="RTX PRO 4000")
    for rec in (good, slow):
        write_text_atomic(machine_record_path(tmp_path, rec.machine_id), render_machine_record(rec))

    records = load_records(tmp_path)
    assert records.problems == ()
    assert records.machines["111"] == good
    assert records.machines["222"].host_id == "7"
    assert records.bad_machine_ids() == {"222"}
    perf = records.perf_history()
    assert perf["111"].median_proofs_per_hour == 43.0 and perf["111"].samples == 2
    assert perf["222"].last_proofs_per_hour == 20.0


def test_a_pardon_stands_when_the_machine_proves_again_and_ends_on_a_new_failure() -> None:
    # Issue 23: operator states are never overwritten by the bot; only a NEW failure re-adds a pardoned machine.
    rec = MachineRecord("5", status="pardoned")
    assert not rec.is_bad
    assert rec.with_entry(_entry("x", "ok", 50.0, False), host_id=None, gpu_name=None).status == "pardoned"
    assert rec.with_entry(_entry("y", "timeout", None, True), host_id=None, gpu_name=None).status == "bad"
    banned = MachineRecord("6", status="banned")
    assert banned.with_entry(_entry("x", "ok", 50.0, False), host_id=None, gpu_name=None).status == "banned"
    assert banned.with_entry(_entry("y", "timeout", None, True), host_id=None, gpu_name=None).status == "banned"


@pytest.mark.parametrize("bad_id", ["../etc", "a/b", ".hidden", "", "x" * 65, "a..b", "a\x00b", None, 1.5])
def test_unsafe_machine_ids_are_refused(bad_id: object) -> None:
    with pytest.raises(RecordError, match="not a safe id"):
        check_machine_id(bad_id)


def test_numeric_machine_id_is_accepted_as_text() -> None:
    assert check_machine_id(40213) == "40213"


def test_unreadable_record_is_reported_and_excluded_not_dropped(tmp_path: Path) -> None:
    path = tmp_path / "machines" / "333.yaml"
    path.parent.mkdir()
    path.write_text("machine_id: '333'\nstatus: maybe\nbenchmarks: []\n")
    records = load_records(tmp_path)
    assert "333" in records.bad_machine_ids()
    assert any("333.yaml" in p and "status" in p and "maybe" in p for p in records.problems)
    assert path.read_text().endswith("benchmarks: []\n")


def test_record_whose_id_differs_from_file_name_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "machines" / "444.yaml"
    path.parent.mkdir()
    path.write_text("machine_id: '445'\nstatus: ok\nbenchmarks: []\n")
    records = load_records(tmp_path)
    assert records.machines == {}
    assert "does not match the file name" in records.problems[0]

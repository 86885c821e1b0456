"""`summarize`: the one reading of a machine record's entries that every view shares (standing, kill-budget
marks, probation, last price, recorded verdicts, performance), and `BenchmarkEntry.from_field_values`, the
entry the record index builds from a stored row."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from reconciler.domain.records import (
    BadMachine,
    BenchmarkEntry,
    MachinePerf,
    MachineRecord,
    RecordSummary,
    summarize,
)

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def entry(instance: str, verdict: str = "ok", *, rate: float | None = None, price: float | None = None,
          marks_bad: bool = False, pool: str | None = "p", at: str = "2026-12-01T10:00:00Z",
          expires_at: str | None = None, probation_until: str | None = None) -> BenchmarkEntry:
    return BenchmarkEntry(instance, at, verdict, "machine" if marks_bad else "none", marks_bad, f"{verdict}",
                          pool=pool, proofs_per_hour=rate, price_usd_per_hour=price, expires_at=expires_at,
                          probation_until=probation_until, evidence={"exit_code": 0})


def test_an_ok_record_summarised() -> None:
    record = MachineRecord("7", "ok", host_id="70", gpu_name="RTX 4090", benchmarks=(
        entry("a", rate=40.0, price=0.4),
        entry("b", "benchmark-error", rate=3.0, price=None),  # a failed run's rate is no measurement
        entry("c", "below-min-rate", rate=30.0, price=0.5, pool="q"),
        entry("d", rate=44.0, price=None),
    ))
    summary = summarize(record)
    assert summary == RecordSummary(
        "7", "ok", "RTX 4090", MachinePerf("7", "RTX 4090", 3, 40.0, 44.0), 0.5, (),
        (("a", "ok", 40.0, 0.4), ("b", "benchmark-error", 3.0, None), ("c", "below-min-rate", 30.0, 0.5),
         ("d", "ok", 44.0, None)),
        None)
    assert not summary.is_bad and not summary.passed_on_probation


def test_a_bad_record_is_listed_with_its_marking_and_newest_entries() -> None:
    first = entry("a", "timeout", marks_bad=True, pool="p", at="2026-12-01T08:00:00Z")
    second = entry("b", "below-min-rate", rate=20.0, marks_bad=True, pool="q", at="2026-12-01T09:00:00Z",
                   expires_at="2026-12-08T09:00:00Z")
    held = entry("c", "benchmark-error", pool="q", at="2026-12-01T10:00:00Z")  # blamed on the image
    record = MachineRecord("8", "bad", host_id="80", gpu_name="H100", note="flaky", benchmarks=(first, second, held))
    summary = summarize(record)
    assert summary.is_bad and not summary.passed_on_probation
    assert summary.marks == (("p", "2026-12-01T08:00:00Z"), ("q", "2026-12-01T09:00:00Z"))
    assert summary.listed == BadMachine("8", "80", "H100", "flaky", second, held, "bad")
    assert summary.listed.standing(NOW) == record.standing(NOW)
    assert summary.perf == MachinePerf("8", "H100", 1, 20.0, 20.0) and summary.last_price is None


def test_banned_by_hand_without_entries_is_listed_with_no_entries() -> None:
    summary = summarize(MachineRecord("9", "banned"))
    assert summary.listed == BadMachine("9", None, None, None, None, None, "banned")
    assert summary.is_bad and summary.perf is None and summary.marks == summary.verdicts == ()


def test_passed_again_on_probation_is_listed_only_while_its_bad_entry_has_a_probation_period() -> None:
    marked = entry("a", "below-min-rate", rate=10.0, marks_bad=True, expires_at="2026-11-02T00:00:00Z",
                   probation_until="2026-12-02T00:00:00Z")
    passed = entry("b", rate=50.0)
    on_probation = summarize(MachineRecord("10", "ok", gpu_name="L40S", benchmarks=(marked, passed)))
    assert on_probation.passed_on_probation and not on_probation.is_bad
    assert on_probation.listed == BadMachine("10", None, "L40S", None, marked, passed, "ok")
    # No probation period on the bad entry (recorded before probation existed), or a pardon: not listed.
    old = MachineRecord("11", "ok", benchmarks=(entry("a", "timeout", marks_bad=True), passed))
    pardoned = MachineRecord("12", "pardoned", benchmarks=(marked, passed))
    for record in (old, pardoned):
        summary = summarize(record)
        assert summary.listed is None and not summary.passed_on_probation and not summary.is_bad
        assert summary.marks == ((marked.pool, marked.at),)


_optional_text = st.none() | st.text(min_size=1, max_size=8)
_optional_number = st.none() | st.floats(min_value=0, max_value=1e6, allow_nan=False)
_entries = st.builds(
    BenchmarkEntry, st.text(min_size=1, max_size=8), st.just("2026-12-01T10:00:00Z"),
    st.sampled_from(["ok", "below-min-rate", "timeout"]), st.sampled_from(["machine", "none"]), st.booleans(),
    st.text(max_size=8), contract_id=_optional_text, pool=_optional_text, proofs_per_hour=_optional_number,
    price_usd_per_hour=_optional_number, held_by=_optional_text, stage=st.none() | st.just("serving"),
    expires_at=_optional_text, probation_until=_optional_text, probation=st.none() | st.booleans(),
    evidence=st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


@given(_entries)
def test_an_entry_from_its_field_values_is_the_entry(original: BenchmarkEntry) -> None:
    rebuilt = BenchmarkEntry.from_field_values(original.field_values(), original.evidence)
    assert rebuilt == original and repr(rebuilt) == repr(original)
    assert list(vars(rebuilt)) == [f.name for f in fields(BenchmarkEntry)]  # the order __init__ sets them in
    assert len(original.field_values()) == len(fields(BenchmarkEntry)) - 1

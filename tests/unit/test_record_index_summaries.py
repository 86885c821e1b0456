"""The record index stores what `summarize` computes and reads it back; it decides nothing about a record.

Its summaries equal `summarize` of the parsed record; an unchanged listing answers the views from the aggregates
kept with its snapshot (no summary read); and stored rows from another version of the code that parses or
summarises records are never served (the index starts afresh, aggregates included).
"""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

import reconciler.adapters.record_index as record_index
from reconciler.adapters.record_files import load_records
from reconciler.adapters.record_index import RecordIndex
from reconciler.domain.records import BenchmarkEntry, MachineRecord, summarize
from tests.record_support import rated_record, write_record

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def ahead() -> int:
    """A clock by which every file on disk was written long ago (none is "racy")."""
    return time.time_ns() + 10 * RecordIndex.RACY_NS


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    spec = tmp_path / "fleet-spec"
    marked = BenchmarkEntry("i-9", "2026-11-01T00:00:00Z", "below-min-rate", "machine", True, "slow", pool="p",
                            proofs_per_hour=12.0, price_usd_per_hour=0.3, expires_at="2026-11-02T00:00:00Z",
                            probation_until="2026-12-30T00:00:00Z")
    passed = BenchmarkEntry("i-10", "2026-11-03T00:00:00Z", "ok", "none", False, "fine", pool="p",
                            proofs_per_hour=50.0)
    write_record(spec, MachineRecord("501", "ok", gpu_name="RTX 4090", benchmarks=(marked, passed)))
    for i in range(6):
        write_record(spec, rated_record(f"{i}00", 40.0 + i, 10.0 + i, bad=i % 2 == 0))
    write_record(spec, MachineRecord("700", "banned", note="by hand"))
    return spec


def test_the_stored_summaries_are_what_summarize_gives(spec: Path, tmp_path: Path) -> None:
    plain = load_records(spec)
    for parsed_here in (True, False):  # the load that parsed them, then one that reads the stored rows
        indexed = RecordIndex(tmp_path / "index.sqlite", clock_ns=ahead).load(spec)
        summaries = indexed.all_summaries()
        assert list(summaries) == list(plain.machines)
        for machine_id, record in plain.machines.items():
            assert summaries[machine_id] == summarize(record), (machine_id, parsed_here)


def test_an_unchanged_listing_answers_the_views_from_the_kept_aggregates(spec: Path, tmp_path: Path) -> None:
    first = RecordIndex(tmp_path / "index.sqlite", clock_ns=ahead).load(spec)
    views = (first.standings(NOW, passed_on_probation=True), first.perf_history(), first.status_counts(),
             first.bad_marks(), first.last_prices(), first.bad_machine_ids(NOW))
    index = RecordIndex(tmp_path / "index.sqlite", clock_ns=ahead)
    again = index.load(spec)
    assert index.from_snapshot
    assert (again.standings(NOW, passed_on_probation=True), again.perf_history(), again.status_counts(),
            again.bad_marks(), again.last_prices(), again.bad_machine_ids(NOW)) == views
    summaries = again.all_summaries()
    assert isinstance(summaries, record_index.BuiltOnUse) and not summaries._built  # none was read


def test_rows_written_by_other_code_are_never_served(spec: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The version hashes the code that parses and summarises records: after an upgrade that changes either,
    the index starts afresh, the aggregates of an unchanged listing included."""
    path = tmp_path / "index.sqlite"
    old = RecordIndex(path, clock_ns=ahead).load(spec)
    old.status_counts()  # kept with the snapshot
    monkeypatch.setattr(record_index, "_version", lambda: "another version of summarize")
    index = RecordIndex(path, clock_ns=ahead)
    records = index.load(spec)
    assert index.parsed == 8 and not index.from_snapshot
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM aggregates").fetchone()[0] == 0
    assert records.status_counts() == load_records(spec).status_counts()

"""Reconcile pass time: `loop.decide` over 100 / 1,000 / 10,000 live instances with 100,000 stored
benchmark records (10,000 machine files x 10 attempts), and `records.load_records`, the pass's other
per-record cost, measured on a sample of real files and scaled to 10,000 files.

A pass is: read reports (controller store) -> sync git -> load spec + records -> trailer_values -> decide ->
commit + push. The git part is measured in bench_git; here the pure decision and the record loading.
"""

from __future__ import annotations

import statistics
import tempfile
from datetime import timedelta
from pathlib import Path

import yaml

from bench.common import Figure, median_time, timed
from bench.data import T0, machine_records, make_spec, pass_reports, write_records
from reconciler.loop import decide
from reconciler.records import RecordSet, load_records, parse_machine_record

MACHINES = 10_000
ENTRIES_PER_MACHINE = 10
SIZES = (100, 1_000, 10_000)
TARGET_S = 2.0
#: Record files actually parsed to measure load_records (parsing all 10,000 takes ~10 minutes; see results).
LOAD_SAMPLE_FILES = (100, 300)


def run(repeats: int = 3) -> list[Figure]:
    spec = make_spec()
    records = list(machine_records(MACHINES, ENTRIES_PER_MACHINE))
    stored = sum(len(r.benchmarks) for r in records)
    record_set = RecordSet(machines={r.machine_id: r for r in records})
    now = T0 + timedelta(hours=3)
    judged: frozenset[str] = frozenset()  # trailer_values of a history whose verdicts are all in the records
    figures = []
    decide_10k = 0.0
    for size in SIZES:
        reports = pass_reports(records, size)
        decision = decide(spec, reports, record_set, judged, None, now)
        seconds = median_time(lambda reports=reports: decide(spec, reports, record_set, judged, None, now), repeats)
        if size == SIZES[-1]:
            decide_10k = seconds
        figures.append(Figure(
            f"decide: {size:,} instances, {stored:,} stored records", seconds, "s",
            f"median of {repeats}; {len(decision.verdicts)} new verdicts, {len(decision.pending)} pending, "
            f"{len(decision.machine_records)} records changed"))
    per_file_s, per_file_c_s = _load_cost(records, repeats)
    load_10k = per_file_s * MACHINES
    figures.append(Figure(
        f"load_records: {MACHINES:,} files ({stored:,} records), scaled", load_10k, "s",
        f"{per_file_s * 1000:.1f} ms/file measured on {LOAD_SAMPLE_FILES[-1]} real ~17 KB record files "
        f"(median of {repeats}; linear: see sample sizes); yaml.safe_load (pure Python) + jsonschema per file"))
    figures.append(Figure(
        "  same with yaml.CSafeLoader (proposal), scaled", per_file_c_s * MACHINES, "s",
        f"{per_file_c_s * 1000:.1f} ms/file: parse with libyaml, same schema check"))
    total = decide_10k + load_10k
    figures.append(Figure(
        "pass over 10,000 instances (decide + load_records; git excluded)", total, "s",
        "as the loop runs it today: every pass re-parses every record file", target=f"< {TARGET_S:g} s",
        passed=total < TARGET_S))
    figures.append(Figure(
        "  decide alone over 10,000 instances", decide_10k, "s",
        "the pass when records are cached between passes (parse only files whose git blob changed)",
        target=f"< {TARGET_S:g} s", passed=decide_10k < TARGET_S))
    return figures


def _load_cost(records: list, repeats: int) -> tuple[float, float]:
    """Seconds per record file for load_records, and for the same parse with libyaml's CSafeLoader."""
    per_file = []
    with tempfile.TemporaryDirectory(prefix="bench-records-") as tmp:
        for count in LOAD_SAMPLE_FILES:
            spec_dir = Path(tmp) / f"s{count}"
            write_records(spec_dir, count, ENTRIES_PER_MACHINE)
            seconds = median_time(lambda spec_dir=spec_dir: load_records(spec_dir), repeats)
            per_file.append(seconds / count)
            print(f"    load_records on {count} files: {seconds:.2f} s ({seconds / count * 1000:.1f} ms/file)",
                  flush=True)
        files = sorted((Path(tmp) / f"s{LOAD_SAMPLE_FILES[-1]}" / "machines").glob("*.yaml"))
        texts = [(f, f.read_text(encoding="utf-8")) for f in files]
        c_times = [timed(lambda: [_parse_with_libyaml(t, f) for f, t in texts]) for _ in range(repeats)]
    return per_file[-1], statistics.median(c_times) / len(texts)


def _parse_with_libyaml(text: str, file: Path) -> object:
    """records.parse_machine_record with the C loader swapped in (what the proposal changes)."""
    original = yaml.safe_load
    yaml.safe_load = lambda stream: yaml.load(stream, Loader=yaml.CSafeLoader)  # type: ignore[assignment]
    try:
        return parse_machine_record(text, file)
    finally:
        yaml.safe_load = original  # type: ignore[assignment]

"""Reconcile pass time over 100 / 1,000 / 10,000 live instances with 100,000 stored benchmark records
(10,000 machine files x 10 attempts, ~170 MB of YAML on disk), as the loop runs it:

- cold: the first pass of a process (or `fleet reconcile --once`), which loads through the record index
  (reconciler/adapters/record_index.py `load_for_pass`): with no index yet (a new checkout: every file is
  parsed, in two processes, and the index written), and after a restart (the index as the last run left it);
  both then build all 10,000 records (decide walks them all). Reference: `load_records` with an empty cache,
  which parses every file in full in one process (how the first pass loaded before);
- warm: a later pass of the loop, whose `RecordCache` parses only the record files that changed since the
  previous pass (the ones the previous pass's commit rewrote), and only stat()s the rest.

A pass is: read reports (controller store) -> sync git -> load spec + records -> trailer_values -> decide ->
render the changed records -> commit + push -> store directives. The git part is measured in bench_git; here the
loading, deciding and rendering, on real record files in a temporary directory; and the store's part (read every
report, store every directive) on each store adapter, SQLite and PostgreSQL (a server this bench starts), with
the whole warm pass on PostgreSQL against SQLite.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

from bench.bench_store import STORE_EVENTS, STORE_LOG_LINES, fill
from bench.common import POSTGRES_SETTINGS, Figure
from bench.data import T0, machine_id_of, make_spec, pass_reports, write_records
from reconciler.adapters.atomic_files import write_text_atomic
from reconciler.adapters.record_files import (
    RecordCache,
    load_records,
    machine_record_path,
    render_machine_record,
)
from reconciler.adapters.record_index import default_index_path, load_for_pass
from reconciler.adapters.store.port import REPORT_TAIL_LINES, ControllerStore
from reconciler.adapters.store.postgres import PostgresStore
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.domain.judging import decide
from reconciler.domain.records import MachineRecord
from reconciler.domain.spec import FleetSpec
from reconciler.flows.judge import commit_request
from tests.postgres_server import PostgresServer

MACHINES = 10_000
ENTRIES_PER_MACHINE = 10
SIZES = (100, 1_000, 10_000)
TARGET_S = 2.0
#: Steady state: a benchmark takes about an hour (56 GiB params download + proofs), so each live instance
#: finishes at most one per hour; with a pass every 30 s, 1/120 of the instances finished since the last pass
#: (their records changed), 5% are still benchmarking within their timeout.
STEADY = (1 / 120, timedelta(hours=2))
#: The decide stress model of earlier runs: 5% finished since the last pass, and of the 5% still running about
#: half are past their timeout (judged too): ~7.8% of the instances get a verdict.
STRESS = (0.05, timedelta(hours=3))


@dataclass(frozen=True)
class PassTime:
    """One timed pass: load_records, decide, and rendering the records it changed (the commit's files)."""

    load_s: float
    decide_s: float
    render_s: float
    changed_files: int  # record files rewritten since the previous pass
    parsed: int  # files load_records parsed (the rest came from the cache)
    verdicts: int
    records_written: int
    cpu_s: float = 0.0  # process CPU time of the three phases (the machine is shared: wall time varies with load)

    @property
    def total_s(self) -> float:
        return self.load_s + self.decide_s + self.render_s


def run(repeats: int = 3, machines: int = MACHINES, sizes: tuple[int, ...] = SIZES) -> list[Figure]:
    spec = make_spec()
    with tempfile.TemporaryDirectory(prefix="bench-pass-") as tmp:
        spec_dir = Path(tmp)
        started = time.perf_counter()
        write_records(spec_dir, machines, ENTRIES_PER_MACHINE)
        megabytes = sum(f.stat().st_size for f in (spec_dir / "machines").iterdir()) / 1e6
        print(f"    wrote {machines:,} record files ({megabytes:.0f} MB) in {time.perf_counter() - started:.0f} s",
              flush=True)
        # Outside git, the index goes to $XDG_CACHE_HOME: this run's own (put back at the end).
        cache_home = os.environ.get("XDG_CACHE_HOME")
        os.environ["XDG_CACHE_HOME"] = str(spec_dir / ".cache")
        try:
            return _run(spec, spec_dir, machines, megabytes, repeats, sizes)
        finally:
            if cache_home is None:
                os.environ.pop("XDG_CACHE_HOME", None)
            else:
                os.environ["XDG_CACHE_HOME"] = cache_home


def _run(spec: FleetSpec, spec_dir: Path, machines: int, megabytes: float, repeats: int, sizes: tuple[int, ...]
         ) -> list[Figure]:
    started = time.perf_counter()
    reference = load_records(spec_dir, RecordCache())
    reference_s = time.perf_counter() - started
    del reference
    first: dict[str, float] = {}
    for case in ("no index", "index present"):
        cache = RecordCache()
        started = time.perf_counter()
        loaded = load_for_pass(spec_dir, cache)
        first[case] = time.perf_counter() - started
    if loaded.problems or len(loaded.machines) != machines:
        raise RuntimeError(f"bench records did not load: {loaded.problems[:3]}")
    if not default_index_path(spec_dir).exists():
        raise RuntimeError("the first pass wrote no record index")
    print(f"    first pass load: {first['no index']:.1f} s (no index), {first['index present']:.1f} s (index "
          f"present); load_records, empty cache: {reference_s:.1f} s", flush=True)
    load_records(spec_dir, cache)  # as the next pass: reads every file once, parses none
    records = [loaded.machines[machine_id_of(i)] for i in range(machines)]
    stored = sum(len(r.benchmarks) for r in records)
    figures = [Figure(
        f"reference: load_records, empty cache: {machines:,} files ({stored:,} records, {megabytes:.0f} MB)",
        reference_s, "s", f"{reference_s / machines * 1000:.2f} ms/file (read, parsed in full in one process, "
        "record objects built): how a first pass loaded before it went through the index; measured once")]
    cold: list[Figure] = []
    warm: list[Figure] = []
    for size in sizes:
        runs = _warm_passes(spec, spec_dir, cache, records, size, *STEADY, repeats)
        cold += [_cold_figure(size, stored, first[case], case, machines, runs) for case in first]
        name = f"warm pass, steady state: {size:,} instances, {stored:,} stored records"
        warm.append(_warm_figure(name, size, machines, runs, repeats))
    runs = _warm_passes(spec, spec_dir, cache, records, sizes[-1], *STRESS, repeats)
    name = f"warm pass, decide stress model: {sizes[-1]:,} instances, {stored:,} stored records"
    warm.append(_warm_figure(name, sizes[-1], machines, runs, repeats))
    steady = next(f for f in warm if f.name.startswith(f"warm pass, steady state: {sizes[-1]:,} instances"))
    return figures + cold + warm + store_figures(sizes[-1], steady.value, repeats)


def _warm_passes(spec: FleetSpec, spec_dir: Path, cache: RecordCache, records: list[MachineRecord], size: int,
                 new_fraction: float, since_t0: timedelta, repeats: int) -> list[PassTime]:
    """`repeats` loop passes over `size` instances. Before each, the records this pass model changes are
    rewritten (new content, new files), as the previous pass's commit leaves them in the synced tree."""
    reports = pass_reports(records, size, new_fraction=new_fraction)
    now = T0 + since_t0
    current = load_records(spec_dir, cache)
    changed = sorted(decide(spec, reports, current, frozenset(), None, now).machine_records)
    out = []
    for rep in range(repeats):
        for machine_id in changed:
            note = f"bench: rewritten before pass {rep} over {size} instances"
            write_text_atomic(machine_record_path(spec_dir, machine_id),
                              render_machine_record(replace(current.machines[machine_id], note=note)))
        c0, t0 = time.process_time(), time.perf_counter()
        loaded = load_records(spec_dir, cache)
        t1 = time.perf_counter()
        decision = decide(spec, reports, loaded, frozenset(), None, now)
        t2 = time.perf_counter()
        request = commit_request(decision)
        t3, c3 = time.perf_counter(), time.process_time()
        written = len(request.changes) if request is not None else 0
        out.append(PassTime(t1 - t0, t2 - t1, t3 - t2, len(changed), cache.parsed, len(decision.verdicts), written,
                            c3 - c0))
    return out


def _median(runs: list[PassTime], attr: str) -> float:
    return statistics.median(getattr(r, attr) for r in runs)


def _cold_figure(size: int, stored: int, load_s: float, case: str, machines: int, runs: list[PassTime]) -> Figure:
    decide_s, render_s = _median(runs, "decide_s"), _median(runs, "render_s")
    total = load_s + decide_s + render_s
    target = size == SIZES[-1]
    how = ("no index yet: every file parsed (two processes) and the index written" if case == "no index" else
           "after a restart: the index as the last run left it")
    return Figure(
        f"cold pass ({case}), steady state: {size:,} instances, {stored:,} stored records", total, "s",
        f"first pass of a process (or --once), {how}: load {load_s:.2f} s (all {machines:,} records built) + "
        f"decide {decide_s:.3f} s + render {render_s:.3f} s ({runs[0].records_written} records written); measured "
        "once", target=f"< {TARGET_S:g} s" if target else None, passed=total < TARGET_S if target else None)


def _warm_figure(name: str, size: int, machines: int, runs: list[PassTime], repeats: int) -> Figure:
    total = _median(runs, "total_s")
    first = runs[0]
    target = size == SIZES[-1]
    return Figure(
        name, total, "s",
        f"median of {repeats}; {first.changed_files} record files changed since the last pass, {first.parsed} "
        f"parsed, the other {machines - first.parsed:,} from the cache: load_records {_median(runs, 'load_s'):.3f} s "
        f"+ decide {_median(runs, 'decide_s'):.3f} s + render {_median(runs, 'render_s'):.3f} s (CPU "
        f"{_median(runs, 'cpu_s'):.3f} s); {first.verdicts} new verdicts, {first.records_written} records written",
        target=f"< {TARGET_S:g} s" if target else None, passed=total < TARGET_S if target else None)


# --- the store's part of a pass, SQLite vs PostgreSQL ---------------------------------------------------------

#: Issue 24: a pass at 10,000 machines on PostgreSQL within this factor of the same pass on SQLite.
TARGET_POSTGRES_PASS_RATIO = 1.5


def _store_pass_s(store: ControllerStore, instances: int, repeats: int) -> tuple[float, float, float]:
    """Median seconds of the store's part of a pass: read every report, then store every directive (the loop
    recomputes them all each pass; after the first, none changed). (total, read, directives)."""
    directives = {f"rtx4090-{i % 50}-s{i:06x}": {"protocol": 1, "action": "serve", "heartbeat_minutes": 5}
                  for i in range(instances)}
    store.set_directives(directives, T0)  # as the first pass left them
    reads, writes = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        reports = store.reports()
        t1 = time.perf_counter()
        store.set_directives(directives, T0)
        t2 = time.perf_counter()
        if len(reports) != instances or len(reports[0].log_tail) != REPORT_TAIL_LINES:
            raise RuntimeError(f"store bench read {len(reports)} reports")
        reads.append(t1 - t0)
        writes.append(t2 - t1)
    read, write = statistics.median(reads), statistics.median(writes)
    return read + write, read, write


def store_figures(instances: int, rest_of_pass_s: float, repeats: int = 3) -> list[Figure]:
    """The store's part of a pass over `instances` on each adapter, and the whole pass (that part + load, decide
    and render as measured above, `rest_of_pass_s`) on PostgreSQL against SQLite."""
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        server = PostgresServer(settings=POSTGRES_SETTINGS)
        server.start()
        try:
            stores: dict[str, ControllerStore] = {"SQLite": SqliteStore(Path(tmp) / "controller.db"),
                                                  "PostgreSQL": PostgresStore(server.create_database("bench_pass"))}
            measured = {}
            try:
                for name, store in stores.items():
                    fill(store, instances)
                    measured[name] = _store_pass_s(store, instances, repeats)
            finally:
                for store in stores.values():
                    store.close()
        finally:
            server.destroy()
    figures = []
    what = (f"{instances:,} instances, each {STORE_EVENTS} events, a ring of {STORE_LOG_LINES} log lines (the last "
            f"{REPORT_TAIL_LINES} read), a result")
    for name, (total, read, write) in measured.items():
        figures.append(Figure(f"store part of a pass on {name}: {instances:,} instances", total, "s",
                              f"median of {repeats}; reports() {read:.3f} s + set_directives {write:.3f} s "
                              f"(none changed); {what}; 1-min load average {os.getloadavg()[0]:.1f}"))
    sqlite_pass = measured["SQLite"][0] + rest_of_pass_s
    postgres_pass = measured["PostgreSQL"][0] + rest_of_pass_s
    ratio = postgres_pass / sqlite_pass
    figures.append(Figure(
        f"warm pass on PostgreSQL vs SQLite: {instances:,} instances", ratio, "x",
        f"{postgres_pass:.3f} s vs {sqlite_pass:.3f} s: the store part above + load, decide and render of the "
        f"warm steady-state pass ({rest_of_pass_s:.3f} s, the same on both)",
        target=f"<= {TARGET_POSTGRES_PASS_RATIO}x", passed=ratio <= TARGET_POSTGRES_PASS_RATIO))
    return figures

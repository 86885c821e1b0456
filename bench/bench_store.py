"""The controller store's part of a reconcile pass at fleet size, on SQLite and on PostgreSQL (a server this bench
starts) in the same run, over the same stored instances (each registered, STORE_EVENTS events, a ring of
STORE_LOG_LINES log lines of which a report carries the last 50, a result; every directive stored once):

- warm pass, 1% changed: since the previous pass, 1% of the live instances reported (each an event batch and a log
  batch) and their directives changed. The store part of the pass: `changes_since` (which instances changed),
  `reports_of` them (one bulk read), `set_directives` of every instance (the pass recomputes them all; only the
  changed ones are written). Target (issue 33): <= 0.3 s at 10,000 live instances on both adapters.
- cold: what a new leader or `fleet reconcile --once` reads before its first decision: `changes_since(0)` and
  `reports_of` every instance, one bulk read.
- growth: the warm store part at 1,000 and at 10,000 live instances with the same 100 changed.
- reference, how every pass read the store until the change sequence: `reports()`, every instance's report.

Figures are medians of REPEATS, with the 1-minute load average and the process CPU time (the machine is shared:
wall time moves with the load, CPU time much less).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import POSTGRES_SETTINGS, Figure
from bench.data import T0
from reconciler.adapters.store.port import REPORT_TAIL_LINES, ControllerStore, PreparedWrite
from reconciler.adapters.store.postgres import PostgresStore
from reconciler.adapters.store.sqlite import SqliteStore
from tests.postgres_server import PostgresServer

LIVE = 10_000
SMALL = 1_000
CHANGED = 100
REPEATS = 5
#: Issue 33: the store part of a warm pass with 1% of 10,000 live instances changed.
TARGET_WARM_S = 0.3
#: What each stored instance holds: events (a benchmark's phases and progress), log lines (more than the 50 a
#: report carries), a result.
STORE_EVENTS = 12
STORE_LOG_LINES = 200


def instance_id_of(i: int) -> str:
    return f"rtx4090-{i % 50}-s{i:06x}"


def store_docs(i: int) -> tuple[str, dict[str, object], list[dict[str, object]], list[str], dict[str, object]]:
    """Instance `i`: its id, registration, events, log lines and result, as a worker sends them."""
    iid = instance_id_of(i)
    register = {"protocol": 1, "instance_id": iid, "at": "2026-12-02T17:59:00Z", "pool": "rtx4090",
                "slot": f"rtx4090-{i % 50}", "machine_id": str(100_000 + i), "host_id": str(7000 + i % 997),
                "contract_id": str(9_000_000 + i), "gpu_name": "RTX 4090", "image_digest": "sha256:" + "ab" * 32,
                "hostname": f"c.{i}", "gpus": ["NVIDIA GeForce RTX 4090, 24564 MiB, 550.54"]}
    events: list[dict[str, object]] = [
        {"protocol": 1, "phase": "params", "status": "progress", "at": f"2026-12-02T18:{k:02d}:00Z",
         "message": f"{k * 5} of 56 GiB", "details": {"done_bytes": k * 5 << 30}} for k in range(STORE_EVENTS - 2)]
    events += [{"protocol": 1, "phase": "params", "status": "done", "at": "2026-12-02T18:20:00Z"},
               {"protocol": 1, "phase": "benchmark", "status": "started", "at": "2026-12-02T18:21:00Z"}]
    lines = [f"  [{k % 10 + 1}/10] ok — 37.{k % 10}s (prove=36100 ms, queue=0 ms)" for k in range(STORE_LOG_LINES)]
    result = {"protocol": 1, "outcome": "completed", "at": "2026-12-02T19:00:00Z",
              "started_at": "2026-12-02T18:21:00Z", "exit_code": 0, "requested": 10, "completed": 10, "failed": 0,
              "proofs_per_hour": 94.7, "seconds_per_proof": 38.0, "proof_type": "porep", "concurrency": 2,
              "image_digest": "sha256:" + "ab" * 32, "log_tail": lines[-14:]}
    return iid, register, events, lines, result


def fill(store: ControllerStore, instances: int) -> None:
    """Every instance registered, its events, log lines and result stored (500 writes per transaction)."""
    writes: list[PreparedWrite[Any]] = []
    for i in range(instances):
        iid, register, events, lines, result = store_docs(i)
        writes += [store.prepare_register(iid, register), store.prepare_events(iid, events),
                   store.prepare_logs(iid, lines), store.prepare_result(iid, result)]
        if len(writes) >= 500 or i == instances - 1:
            for error, _ in store.write_all(writes):
                if error is not None:
                    raise error
            writes = []


def directives_of(instances: int) -> dict[str, dict[str, Any]]:
    """The directive of every instance as a first pass computes it."""
    return {instance_id_of(i): {"protocol": 1, "action": "serve", "heartbeat_minutes": 5} for i in range(instances)}


@dataclass(frozen=True)
class Timed:
    wall_s: float
    cpu_s: float


def timed(fn: Callable[[], object]) -> Timed:
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return Timed(time.perf_counter() - t0, time.process_time() - c0)


def median(runs: list[Timed]) -> Timed:
    return Timed(statistics.median(r.wall_s for r in runs), statistics.median(r.cpu_s for r in runs))


@dataclass(frozen=True)
class StoreRun:
    warm: Timed
    warm_parts: tuple[float, float, float]  # changes_since, reports_of, set_directives (median wall s)
    cold: Timed
    reference: Timed
    load: float


def _warm(store: ControllerStore, instances: int, repeats: int) -> tuple[Timed, tuple[float, float, float]]:
    """`repeats` warm passes, each after CHANGED instances reported (spread over the fleet) and got a new
    directive."""
    directives = directives_of(instances)
    store.set_directives(directives, T0)
    since = store.changes_since(0).sequence
    runs, parts = [], []
    step = instances // CHANGED
    for rep in range(1, repeats + 1):
        changed = range(rep % step, instances, step)
        writes: list[PreparedWrite[Any]] = []
        for i in changed:
            iid = instance_id_of(i)
            writes += [store.prepare_events(iid, [{"protocol": 1, "phase": "serve", "status": "progress",
                                                   "at": f"2026-12-02T20:{rep:02d}:00Z", "message": "heartbeat"}]),
                       store.prepare_logs(iid, [f"pass {rep}: proof ok"])]
        for error, _ in store.write_all(writes):
            if error is not None:
                raise error
        directives = {**directives, **{instance_id_of(i): {"protocol": 1, "action": "serve", "heartbeat_minutes": 5,
                                                           "note": f"pass {rep}"} for i in changed}}
        c0, t0 = time.process_time(), time.perf_counter()
        changes = store.changes_since(since)
        t1 = time.perf_counter()
        reports = store.reports_of(changes.instance_ids)
        t2 = time.perf_counter()
        written = store.set_directives(directives, T0)
        t3, c3 = time.perf_counter(), time.process_time()
        runs.append(Timed(t3 - t0, c3 - c0))
        parts.append((t1 - t0, t2 - t1, t3 - t2))
        if len(reports) != CHANGED or written != CHANGED:
            raise RuntimeError(f"warm pass read {len(reports)} reports, wrote {written} directives")
        since = changes.sequence
    return median(runs), tuple(statistics.median(p[k] for p in parts) for k in range(3))  # type: ignore[return-value]


def _cold(store: ControllerStore, instances: int, repeats: int) -> Timed:
    def read() -> None:
        reports = store.reports_of(store.changes_since(0).instance_ids)
        if len(reports) != instances or len(reports[0].log_tail) != REPORT_TAIL_LINES:
            raise RuntimeError(f"cold read gave {len(reports)} reports")

    return median([timed(read) for _ in range(repeats)])


def measure(store: ControllerStore, instances: int, repeats: int, *, cold: bool) -> StoreRun:
    fill(store, instances)
    warm, parts = _warm(store, instances, repeats)
    if not cold:
        return StoreRun(warm, parts, Timed(0, 0), Timed(0, 0), os.getloadavg()[0])
    cold_read = _cold(store, instances, max(1, repeats // 2))
    reference = median([timed(store.reports) for _ in range(max(1, repeats // 2))])
    return StoreRun(warm, parts, cold_read, reference, os.getloadavg()[0])


def run(repeats: int = REPEATS) -> list[Figure]:
    measured: dict[tuple[str, int], StoreRun] = {}
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        server = PostgresServer(settings=POSTGRES_SETTINGS)
        server.start()
        try:
            for size in (LIVE, SMALL):
                opened: dict[str, ControllerStore] = {
                    "SQLite": SqliteStore(Path(tmp) / f"controller-{size}.db"),
                    "PostgreSQL": PostgresStore(server.create_database(f"bench_store_{size}"))}
                try:
                    for name, store in opened.items():
                        started = time.perf_counter()
                        measured[(name, size)] = measure(store, size, repeats, cold=size == LIVE)
                        print(f"    {name}, {size:,} instances: {time.perf_counter() - started:.0f} s", flush=True)
                finally:
                    for store in opened.values():
                        store.close()
        finally:
            server.destroy()
    what = (f"{STORE_EVENTS} events, a ring of {STORE_LOG_LINES} log lines (the last {REPORT_TAIL_LINES} read) and a "
            "result per instance")
    figures = []
    for name in ("SQLite", "PostgreSQL"):
        big, small = measured[(name, LIVE)], measured[(name, SMALL)]
        changes_s, reports_s, directives_s = big.warm_parts
        figures.append(Figure(
            f"store part of a warm pass on {name}: {LIVE:,} live, {CHANGED} changed", big.warm.wall_s, "s",
            f"median of {repeats} (CPU {big.warm.cpu_s:.3f} s); changes_since {changes_s:.3f} s + reports_of "
            f"{CHANGED} {reports_s:.3f} s + set_directives {LIVE:,} ({CHANGED} changed) {directives_s:.3f} s; "
            f"{what}; 1-min load average {big.load:.1f}",
            target=f"<= {TARGET_WARM_S} s", passed=big.warm.wall_s <= TARGET_WARM_S))
        figures.append(Figure(
            f"cold read on {name}: every report of {LIVE:,} instances", big.cold.wall_s, "s",
            f"median of {max(1, repeats // 2)} (CPU {big.cold.cpu_s:.3f} s); changes_since(0) + reports_of all, one "
            f"bulk read: what a new leader or `fleet reconcile --once` reads before its first decision; {what}"))
        figures.append(Figure(
            f"reference: reports() on {name}, {LIVE:,} instances (how every pass read the store before)",
            big.reference.wall_s, "s", f"median of {max(1, repeats // 2)} (CPU {big.reference.cpu_s:.3f} s)"))
        figures.append(Figure(
            f"store part of a warm pass on {name}: growth {SMALL:,} -> {LIVE:,} live, {CHANGED} changed",
            big.warm.wall_s / small.warm.wall_s, "x",
            f"{small.warm.wall_s:.3f} s -> {big.warm.wall_s:.3f} s (CPU {small.warm.cpu_s:.3f} s -> "
            f"{big.warm.cpu_s:.3f} s): set_directives compares every instance's directive; the reads grow with "
            f"what changed, not with the fleet"))
    return figures

"""The reconcile pass at fleet size (issue 33): the whole pass as the loop runs it (`flows.judge.run_pass`: observe,
load, evidence, decide, capacity, directives, render, publish), on SQLite and on PostgreSQL (a server this bench
starts) in the same run, over a year-old fleet's records (MACHINES machine files x 10 entries, ~190 MB of YAML).

The controller store holds one instance per machine, written as the worker protocol delivers them
(bench/shapes.py `fill_fleet`): ~10,000 live (serving with a heartbeat every 5 minutes, failed, still
benchmarking, gone silent), the others destroyed. The tree is the spec directory without git (`DirectoryTree`: the
same view and loaders as a clone, trailers in memory; bench_git measures git's part, ~0.1-0.3 s a commit).

- first pass of a new leader (in-process): a new PassMemory: one bulk read, the records through their index, every
  instance judged, every directive written (what a restart or a takeover costs before its first decision);
- warm pass, 1% changed: since the previous pass 1% of the live instances reported (4 in 5 a heartbeat, 1 in 5
  a new worker whose benchmark finished: a verdict, a record written). Target: <= 1.0 s on SQLite, <= 1.5 s on
  PostgreSQL at 10,000 live instances;
- reference, the same pass without a memory: how every pass ran before (every report read, every instance
  judged, every directive written), side by side in the same run;
- decide stress model: 776 new workers' benchmarks finished since the last pass (776 verdicts, 776 records).
  Target <= 2 s;
- growth: the warm pass at ~1,000 and at ~10,000 live instances with the same 100 changed. Target <= 1.5x;
- `fleet reconcile --once` in a fresh process on a git clone of the records and a SQLite store of the fleet
  (current data: heartbeats of the last minutes): the record index built on the first run, present after.
  Target <= 3 s with the index present.

Figures are medians of REPEATS with the process CPU time and the 1-minute load average (the machine is shared).
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import GIT_ENV, POSTGRES_SETTINGS, Figure, git
from bench.data import DIGEST, POOLS, SLOTS_PER_POOL, T0, make_report, spec_yaml, write_records
from bench.shapes import fill_fleet, result_doc
from reconciler.adapters.atomic_files import write_text_atomic
from reconciler.adapters.fleet_tree import SPEC_FILE, TreeView
from reconciler.adapters.git import CommitRequest, PublishResult
from reconciler.adapters.record_files import RecordCache
from reconciler.adapters.record_index import load_indexed
from reconciler.adapters.store.copy_to_postgres import copy_store
from reconciler.adapters.store.port import ControllerStore, PreparedWrite
from reconciler.adapters.store.postgres import PostgresStore
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.domain.observations import format_time
from reconciler.domain.records import MachineRecord
from reconciler.flows.judge import FleetTreeView, PassMemory, PassResult, run_pass
from tests.postgres_server import PostgresServer

#: Machine records and store instances (one each): ~10,000 of them live (the others were destroyed: replaced
#: after a failed benchmark, most of them, or by the provisioner; bench/shapes.py keeps ~61% live), and a tenth.
MACHINES = 16_300
SMALL = 1_630
#: `fleet reconcile --once`: 10,000 records and a 10,000-instance store (issue 33).
ONCE = 10_000
ENTRIES_PER_MACHINE = 10
REPEATS = 3
CHANGED = 100  # 1% of ~10,000 live instances
FINISHED_SHARE = 0.2  # of the changed: new workers whose benchmark finished (the rest: a heartbeat)
STRESS = 776
TARGETS = {"SQLite": 1.0, "PostgreSQL": 1.5}
TARGET_STRESS_S = 2.0
TARGET_GROWTH = 1.5
TARGET_ONCE_S = 3.0
PASS_INTERVAL = timedelta(seconds=30)


class DirectoryTree:
    """The pass's FleetTree on a plain directory: the steps read it through the clone's view and loaders
    (adapters/fleet_tree.TreeView: spec, record index on the first pass then the RecordCache); a commit writes its
    files and keeps its trailers in memory (git's part is bench_git's)."""

    def __init__(self, workdir: Path, trailers: dict[str, set[str]]) -> None:
        self.workdir = workdir
        self.trailers = trailers
        self.cache = RecordCache()
        self.commits = 0

    def publish(self, build: Callable[[FleetTreeView], CommitRequest | None], *,
                before_push: Callable[[], None] | None = None) -> PublishResult:
        request = build(TreeView(self.workdir, SPEC_FILE, self.cache, lambda key: self.trailers.get(key, ())))
        if request is None:
            return PublishResult(None, 1, False)
        for change in request.changes:
            assert change.content is not None
            write_text_atomic(self.workdir / change.path, change.content, fsync=False)  # as the git adapter does
        for key, value in request.trailers:
            self.trailers.setdefault(key, set()).add(value)
        self.commits += 1
        return PublishResult(f"bench-{self.commits}", 1, True)


@dataclass
class Fleet:
    """One store of the fleet, its tree and the leader's memory, and the simulated clock of the passes."""

    name: str
    store: ControllerStore
    clock: list[datetime]
    tree: DirectoryTree
    serving: tuple[str, ...]
    live: int  # instances not destroyed
    now: datetime
    records: Sequence[MachineRecord]
    memory: PassMemory = field(default_factory=PassMemory)
    born: int = 0  # new workers so far
    rng: random.Random = field(default_factory=lambda: random.Random(29))

    def run(self, memory: PassMemory | None) -> tuple[float, float, PassResult]:
        self.now += PASS_INTERVAL
        c0, t0 = time.process_time(), time.perf_counter()
        result = run_pass(self.tree, self.store, self.now, desired_image_digest=DIGEST, directive_sink=self.store,
                          memory=memory)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if not result.ok:
            raise RuntimeError(f"bench pass on {self.name} failed: {result.headline()}")
        return wall, cpu, result

    def change(self, heartbeats: int, finished: int) -> None:
        """Since the previous pass: `heartbeats` serving workers reported, `finished` new workers' benchmarks
        ended (each on a machine of the fleet, as a replacement would be)."""
        writes: list[PreparedWrite[Any]] = []
        at = self.now + PASS_INTERVAL / 2
        for iid in self.rng.sample(self.serving, heartbeats):
            self.clock[0] = at
            writes.append(self.store.prepare_event(iid, {
                "protocol": 1, "phase": "serve", "status": "progress", "at": format_time(at),
                "details": {"heartbeat": {"seq": 99, "interval_s": 300, "completed": 4, "failed": 0, "busy": True,
                                          "recent_proof_s": 75.0}}}))
        for _ in range(finished):
            writes += self._finished(at)
        for error, _ in self.store.write_all(writes):
            if error is not None:
                raise error

    def _finished(self, at: datetime) -> list[PreparedWrite[Any]]:
        self.born += 1
        rec = self.records[self.rng.randrange(len(self.records))]
        pool = next(p for p in POOLS if p[0] == rec.benchmarks[-1].pool)
        iid = f"{pool[0]}-{self.born % SLOTS_PER_POOL}-n{self.born:06x}"
        kind = self.rng.choice(["ok"] * 7 + ["slow", "slow", "cuda-error"])
        start = at - timedelta(minutes=61)
        report = make_report(iid, rec.machine_id, pool, kind, pool[2] * (1.3 if kind == "ok" else 0.5), start)
        self.clock[0] = start
        writes: list[PreparedWrite[Any]] = [self.store.prepare_register(iid, {
            "protocol": 1, "instance_id": iid, "at": format_time(start), "pool": pool[0], "slot": report.slot,
            "machine_id": rec.machine_id, "host_id": report.host_id, "contract_id": report.contract_id,
            "gpu_name": pool[1], "image_digest": DIGEST}), self.store.prepare_logs(iid, list(report.log_tail))]
        self.clock[0] = at
        writes.append(self.store.prepare_events(iid, [
            {"protocol": 1, "phase": e.phase, "status": e.status, "at": format_time(e.at),
             **({"exit_code": e.exit_code} if e.exit_code is not None else {}),
             **({"log_tail": list(e.log_tail)} if e.log_tail else {}),
             **({"details": dict(e.details)} if e.details else {})} for e in report.events]))
        if report.result is not None:
            writes.append(self.store.prepare_result(iid, result_doc(report.result)))
        return writes


@dataclass(frozen=True)
class Timed:
    wall: float
    cpu: float
    steps: dict[str, float]

    @classmethod
    def median(cls, runs: Sequence[tuple[float, float, PassResult]]) -> Timed:
        names = [name for name, _ in runs[0][2].steps]
        return cls(statistics.median(w for w, _, _ in runs), statistics.median(c for _, c, _ in runs),
                   {n: statistics.median(dict(r.steps).get(n, 0.0) for _, _, r in runs) for n in names})

    def parts(self) -> str:
        return " + ".join(f"{name} {seconds:.3f}" for name, seconds in self.steps.items())


def _load() -> float:
    return os.getloadavg()[0]


def run(repeats: int = REPEATS, machines: int = MACHINES, small: int = SMALL) -> list[Figure]:
    """`machines`/`small`: the two fleet sizes (smaller ones try the bench out quickly)."""
    with tempfile.TemporaryDirectory(prefix="bench-pass-") as tmp:
        root = Path(tmp)
        workdir = root / "fleet"
        started = time.perf_counter()
        records = write_records(workdir / "fleet-spec", machines, ENTRIES_PER_MACHINE)
        (workdir / SPEC_FILE).write_text(spec_yaml(), encoding="utf-8")
        megabytes = sum(f.stat().st_size for f in (workdir / "fleet-spec" / "machines").iterdir()) / 1e6
        print(f"    wrote {machines:,} record files ({megabytes:.0f} MB) in {time.perf_counter() - started:.0f} s",
              flush=True)
        cache_home = os.environ.get("XDG_CACHE_HOME")
        os.environ["XDG_CACHE_HOME"] = str(root / ".cache")  # the record index of a directory outside git
        try:
            figures = _adapters(root, workdir, records, repeats, (small, machines))
            figures += _once(root, workdir, records[:ONCE], repeats)
            return figures
        finally:
            if cache_home is None:
                os.environ.pop("XDG_CACHE_HOME", None)
            else:
                os.environ["XDG_CACHE_HOME"] = cache_home


def _trailers(records: Iterable[MachineRecord]) -> dict[str, set[str]]:
    """What the history's trailers say was judged: every recorded instance."""
    return {"Fleet-Instance": {b.instance_id for r in records for b in r.benchmarks}}


def _adapters(root: Path, workdir: Path, records: Sequence[MachineRecord], repeats: int,
              sizes: tuple[int, int]) -> list[Figure]:
    """Each size's store written once into SQLite and copied into PostgreSQL (`fleet db copy`: the same rows), then
    measured on each adapter."""
    server = PostgresServer(settings=POSTGRES_SETTINGS)
    server.start()
    figures: list[Figure] = []
    try:
        filled: dict[int, tuple[Path, tuple[str, ...], int, datetime]] = {}
        for instances in sizes:
            started = time.perf_counter()
            db = root / f"fleet-{instances}.db"
            clock = [T0]
            store = SqliteStore(db, now=lambda c=clock: c[0])
            try:
                shape = fill_fleet(store, clock, records, instances, start=T0 + timedelta(hours=2), hours=2.0)
            finally:
                store.close()
            filled[instances] = (db, shape.serving, instances - len(shape.destroyed), shape.now)
            print(f"    {instances:,} instances stored in {time.perf_counter() - started:.0f} s", flush=True)
        uris = {}
        for instances, (db, *_rest) in filled.items():
            started = time.perf_counter()
            uris[instances] = server.create_database(f"bench_pass_{instances}")
            copy_store(db, uris[instances])
            print(f"    {instances:,} instances copied into PostgreSQL in {time.perf_counter() - started:.0f} s",
                  flush=True)
        for adapter in ("SQLite", "PostgreSQL"):
            fleets = {}
            for instances, (db, serving, live, now) in filled.items():
                clock = [T0]
                store = _store(adapter, db, uris[instances], clock)
                tree = DirectoryTree(_copy_of(workdir, root / f"{adapter}-{instances}"), _trailers(records))
                fleets[instances] = Fleet(f"{adapter} store", store, clock, tree, serving, live, now,
                                          records[:instances])
            try:
                figures += _measure(adapter, fleets[sizes[1]], fleets[sizes[0]], repeats)
            finally:
                for fleet in fleets.values():
                    fleet.store.close()
    finally:
        server.destroy()
    return figures


def _copy_of(workdir: Path, where: Path) -> Path:
    """A copy of the records checkout for one fleet (hard links: a pass replaces a record file, never edits one),
    with its record index built (as any earlier command or run leaves it)."""
    subprocess.run(["cp", "-al", str(workdir), str(where)], check=True)
    load_indexed(where / "fleet-spec")
    return where


def _store(adapter: str, db: Path, uri: str, clock: list[datetime]) -> ControllerStore:
    def now() -> datetime:
        return clock[0]

    return SqliteStore(db, now=now) if adapter == "SQLite" else PostgresStore(uri, now=now)


def _settle(fleet: Fleet) -> tuple[float, float, PassResult]:
    """The first pass of a leader (a new memory): every report read, every instance judged."""
    first = fleet.run(fleet.memory)
    fleet.run(fleet.memory)  # the records the first pass wrote, read back once by the cache
    return first


def _warm(fleet: Fleet, repeats: int, changed: int, memory: bool = True) -> Timed:
    runs = []
    for _ in range(repeats):
        finished = round(changed * FINISHED_SHARE)
        fleet.change(changed - finished, finished)
        runs.append(fleet.run(fleet.memory if memory else None))
    return Timed.median(runs)


def _measure(adapter: str, big: Fleet, small: Fleet, repeats: int) -> list[Figure]:
    live = big.live
    wall, cpu, first = _settle(big)
    load = _load()
    figures = [Figure(
        f"first pass of a new leader ({adapter}, in-process): {live:,} live instances", wall, "s",
        f"a new memory: one bulk read, every instance judged ({len(first.verdicts)} verdicts), every directive "
        f"written; CPU {cpu:.2f} s; {_steps(first)}; load {load:.1f}")]
    warm = _warm(big, repeats, CHANGED)
    target = TARGETS[adapter]
    figures.append(Figure(
        f"warm pass, 1% changed ({adapter}): {live:,} live instances", warm.wall, "s",
        f"median of {repeats}; {CHANGED} changed since the last pass ({round(CHANGED * FINISHED_SHARE)} benchmarks "
        f"finished: verdicts, records written); CPU {warm.cpu:.3f} s; {warm.parts()}; load {_load():.1f}",
        target=f"<= {target:g} s", passed=warm.wall <= target))
    reference = _warm(big, repeats, CHANGED, memory=False)
    figures.append(Figure(
        f"reference: the same pass without a memory ({adapter}): {live:,} live instances", reference.wall, "s",
        f"median of {repeats}: every report read, every instance judged, every directive written (every pass "
        f"before issue 33); CPU {reference.cpu:.3f} s; {reference.parts()}; the warm pass is "
        f"{reference.wall / warm.wall:.0f}x faster; load {_load():.1f}"))
    big.run(big.memory)  # back to warm after the memory-less passes
    runs = []
    for _ in range(repeats):
        big.change(0, STRESS)
        runs.append(big.run(big.memory))
    stress = Timed.median(runs)
    figures.append(Figure(
        f"decide stress model ({adapter}): {STRESS} of {live:,} live instances finished", stress.wall, "s",
        f"median of {repeats}; {len(runs[-1][2].verdicts)} verdicts, records written; CPU {stress.cpu:.3f} s; "
        f"{stress.parts()}; load {_load():.1f}", target=f"<= {TARGET_STRESS_S:g} s",
        passed=stress.wall <= TARGET_STRESS_S))
    _settle(small)
    small_warm = _warm(small, repeats, CHANGED)
    ratio = warm.wall / small_warm.wall
    figures.append(Figure(
        f"pass cost growth ({adapter}): {small.live:,} -> {live:,} live instances, {CHANGED} changed", ratio, "x",
        f"warm pass {small_warm.wall:.3f} s -> {warm.wall:.3f} s (CPU {small_warm.cpu:.3f} -> {warm.cpu:.3f} s); "
        f"{small_warm.parts()}", target=f"<= {TARGET_GROWTH:g}x", passed=ratio <= TARGET_GROWTH))
    return figures


def _steps(result: PassResult) -> str:
    return " + ".join(f"{name} {seconds:.2f}" for name, seconds in result.steps)


# --- fleet reconcile --once, a fresh process ---------------------------------------------------------------------


def _once(root: Path, workdir: Path, records: Sequence[MachineRecord], repeats: int) -> list[Figure]:
    """`fleet reconcile --once` on a clone of the records and a SQLite store of the fleet written with current
    times (the command judges at the wall clock)."""
    origin, clone = root / "origin.git", root / "bot"
    started = time.perf_counter()
    keep = {f"{r.machine_id}.yaml" for r in records}
    for file in (workdir / "fleet-spec" / "machines").iterdir():  # the fleet of this figure: `records` only
        if file.name not in keep:
            file.unlink()
    git(workdir, "init", "--quiet", "--initial-branch=main")
    git(workdir, "add", "-A")
    git(workdir, "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", "commit", "--quiet", "-m",
        "records")
    git(root, "clone", "--quiet", "--bare", str(workdir), str(origin))
    git(root, "clone", "--quiet", str(origin), str(clone))
    db = root / "once.db"
    clock = [T0]
    store = SqliteStore(db, now=lambda: clock[0])
    try:
        fill_fleet(store, clock, records, len(records), start=datetime.now(UTC) - timedelta(hours=2), hours=2.0)
    finally:
        store.close()
    print(f"    --once: clone and store written in {time.perf_counter() - started:.0f} s", flush=True)
    args = [sys.executable, "-m", "reconciler.cli", "reconcile", "--once", "--json", "--repo", str(origin),
            "--workdir", str(clone), "--controller-db", str(db), "--image-digest", DIGEST]
    runs = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        proc = subprocess.run(args, capture_output=True, check=False, env={**os.environ, **GIT_ENV})
        runs.append((time.perf_counter() - t0, proc))
        if proc.returncode != 0:
            raise RuntimeError(f"fleet reconcile --once failed: {proc.stderr.decode()[-2000:]}")
    first, *later = runs
    walls = [w for w, _ in later]
    return [Figure(
        f"fleet reconcile --once, cold ({len(records):,} records, {len(records):,}-instance SQLite store)",
        statistics.median(walls), "s",
        f"a fresh process, the record index present (a restart): median of {len(walls)} ({_shown(walls)} s); "
        f"the first run, with no index yet and {_verdicts(first[1])} verdicts to commit and push: {first[0]:.2f} s; "
        f"load {_load():.1f}", target=f"<= {TARGET_ONCE_S:g} s", passed=statistics.median(walls) <= TARGET_ONCE_S)]


def _shown(walls: Sequence[float]) -> str:
    return ", ".join(f"{w:.2f}" for w in walls)


def _verdicts(proc: subprocess.CompletedProcess[bytes]) -> int:
    import json

    lines = [line for line in proc.stdout.decode().splitlines() if line.startswith("{")]
    return len(json.loads(lines[-1]).get("verdicts", [])) if lines else 0


"""Operator views at fleet size (issue 25), side by side with the shapes the other benchmarks use:

- `fleet why` on the watched machine of a records history (bench/shapes.py): today's shape (1,200 commits,
  600 verdicts) and a year-old fleet's (20,000 commits, 500 verdicts of one machine, 10,000 other records),
  each without and with git's commit-graph (changed-path Bloom filters), default page and `--all`;
- `fleet status --controller-db` in a fresh process (the record index present, as after any earlier command)
  with a store of 100 instances (the records bench's shape) and of 10,000, text and `-o json`;
- the live page (`GET /`) and `GET /metrics` at 10,000 instances through the real routes, served as
  `fleet reconcile --listen` serves them (a request past the TTL is answered from the last state while the
  next one loads in the background), and what that background load costs.

Each figure is the median of 3; CPU time (user + system, git's included) is shown beside wall time, because
the machine is shared and wall time moves with everyone else's load.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC
from pathlib import Path

from bench.common import GIT_ENV, Figure, git
from bench.data import spec_yaml, write_records
from bench.shapes import write_fleet_store, write_why_history

REPEATS = 3
WHY_TARGET_S = 0.5
STATUS_TARGET_S = 1.0
PAGE_TARGET_S = 0.2
#: (commits, verdicts of the watched machine, other machines): today's bench shape and a year-old fleet's.
WHY_SHAPES = ((1_200, 600, 500), (20_000, 500, 10_000))
#: Instances in the controller store: the records bench's status shape and a 10,000-instance fleet.
STORE_SHAPES = (100, 10_000)
MACHINES = 10_000
ENTRIES_PER_MACHINE = 10


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _fleet_runs(args: list[str], cwd: Path) -> tuple[list[float], float, str]:
    """REPEATS fresh `fleet` processes: wall times, median CPU time, the last stderr."""
    walls, cpus, err = [], [], ""
    env = {**os.environ, **GIT_ENV}
    for _ in range(REPEATS):
        cpu, start = _cpu(), time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "reconciler.cli", *args], cwd=cwd, env=env, capture_output=True,
                              check=False)
        walls.append(time.perf_counter() - start)
        cpus.append(_cpu() - cpu)
        if proc.returncode != 0:
            raise RuntimeError(f"fleet {' '.join(args)} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
        err = proc.stderr.decode()
    return walls, statistics.median(cpus), err


def _shown(walls: list[float]) -> str:
    return ", ".join(f"{t:.2f}" for t in walls)


def _why_figures(tmp: Path) -> list[Figure]:
    figures = []
    for commits, verdicts, machines in WHY_SHAPES:
        repo = tmp / f"why-{commits}"
        started = time.perf_counter()
        machine, _ = write_why_history(repo, commits, verdicts, machines)
        print(f"    history of {commits:,} commits written in {time.perf_counter() - started:.0f} s", flush=True)
        for graph in (False, True):
            if graph:
                started = time.perf_counter()
                git(repo, "commit-graph", "write", "--reachable", "--changed-paths")
                print(f"    commit-graph written in {time.perf_counter() - started:.1f} s", flush=True)
            for paging in ([], ["--all"]):
                walls, cpu, err = _fleet_runs(["why", machine, *paging], repo)
                median = statistics.median(walls)
                hint = "hint printed" if "hint:" in err else "no hint"
                figures.append(Figure(
                    f"fleet why, {verdicts} verdicts in {commits:,} commits, {'with' if graph else 'no'} "
                    f"commit-graph, {'--all' if paging else 'newest 20'}", median, "s",
                    f"median of {REPEATS} processes ({_shown(walls)} s), CPU {cpu:.2f} s; {hint}",
                    target=f"<= {WHY_TARGET_S:g} s", passed=median <= WHY_TARGET_S))
    return figures


def _status_figures(tmp: Path) -> tuple[list[Figure], Path, object]:
    root = tmp / "fleet"
    spec_dir = root / "fleet-spec"
    spec_dir.mkdir(parents=True)
    git(root, "init", "--quiet", "--initial-branch=main")
    (spec_dir / "fleet.yaml").write_text(spec_yaml(), encoding="utf-8")
    started = time.perf_counter()
    records = write_records(spec_dir, MACHINES, ENTRIES_PER_MACHINE)
    print(f"    {MACHINES:,} records written in {time.perf_counter() - started:.0f} s", flush=True)
    figures = []
    shape = None
    for instances in STORE_SHAPES:
        db = root / f"controller-{instances}.db"
        started = time.perf_counter()
        shape = write_fleet_store(db, records, instances)
        print(f"    store of {instances:,} instances written in {time.perf_counter() - started:.0f} s", flush=True)
        at = shape.now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        base = ["status", "--spec-dir", "fleet-spec", "--controller-db", db.name, "--at", at]
        _fleet_runs(["records", "--spec-dir", "fleet-spec"], root)  # the index, as any earlier command leaves it
        for fmt in ([], ["-o", "json"]):
            walls, cpu, _ = _fleet_runs(base + fmt, root)
            median = statistics.median(walls)
            figures.append(Figure(
                f"fleet status {'-o json ' if fmt else ''}(fresh process), {instances:,} instances, "
                f"{MACHINES:,} records", median, "s",
                f"median of {REPEATS} processes ({_shown(walls)} s), CPU {cpu:.2f} s; needing the operator: "
                f"{len(shape.failed) + len(shape.benchmarking) + len(shape.silent):,} (50 shown)",
                target=f"<= {STATUS_TARGET_S:g} s", passed=median <= STATUS_TARGET_S))
    return figures, root, shape


def _page_figures(root: Path, shape: object) -> list[Figure]:
    from starlette.testclient import TestClient

    from reconciler.adapters.store.sqlite import SqliteStore
    from reconciler.flows.live_status import LiveStatusSource
    from reconciler.render.live import ReadAccess, StatusRoutes, status_app
    from reconciler.render.metrics import fleet_metrics

    now = shape.now  # type: ignore[attr-defined]
    store = SqliteStore(root / f"controller-{STORE_SHAPES[-1]}.db")
    clock = [0.0]
    # As `fleet reconcile --listen` serves it (build_surfaces): a request past the TTL is answered from the last
    # state while one background thread loads the next.
    source = LiveStatusSource(root / "fleet-spec", store, now=lambda: now, monotonic=lambda: clock[0], ttl_s=2.0,
                              refresh_in_background=True)
    routes = StatusRoutes(source.snapshot, ReadAccess((), open_reads=True), metrics=fleet_metrics(source.metrics_state),
                          metrics_open=True)
    figures = []
    started = time.perf_counter()
    source.state()  # the first load parses every record file once (the loop's RecordCache), then only changes
    first = time.perf_counter() - started
    loads = []
    for _ in range(REPEATS):  # what each background load costs (in the request path only without a state yet)
        clock[0] += 10.0
        start = time.perf_counter()
        source._load()  # the bench times the load itself
        loads.append(time.perf_counter() - start)
    load_s = statistics.median(loads)
    figures.append(Figure(f"live state load at {STORE_SHAPES[-1]:,} instances (background, once per TTL)", load_s, "s",
                          f"median of {REPEATS} ({_shown(loads)} s): stat the records, summaries of every instance, "
                          f"verdicts, triage, the shown page in full; the first load (every record parsed) "
                          f"{first:.1f} s"))
    with TestClient(status_app(routes)) as client:
        for path in ("/", "/metrics"):
            for stale in (False, True):
                def request(path: str = path, stale: bool = stale) -> float:
                    if stale:
                        clock[0] += 10.0  # past the TTL: this request starts the next load in the background
                    start = time.perf_counter()
                    reply = client.get(path)
                    elapsed = time.perf_counter() - start
                    assert reply.status_code == 200, reply.text[:500]
                    while source._refreshing:  # let that load finish before the next request
                        time.sleep(0.05)
                    return elapsed

                request()
                times = [request() for _ in range(REPEATS)]
                median = statistics.median(times)
                what = "past the TTL (answered from the last state, the next loads in the background)" if stale \
                    else "state fresh (TTL 2 s)"
                figures.append(Figure(f"GET {path} at {STORE_SHAPES[-1]:,} instances, {what}", median, "s",
                                      f"median of {REPEATS} requests ({_shown(times)} s)",
                                      target=f"<= {PAGE_TARGET_S:g} s", passed=median <= PAGE_TARGET_S))
    store.close()
    return figures


def run() -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="bench-views-") as tmp:
        figures = _why_figures(Path(tmp))
        status, root, shape = _status_figures(Path(tmp))
        return figures + status + _page_figures(root, shape)


if __name__ == "__main__":
    for f in run():
        print(f.name, "|", f.shown(), "|", f.detail, f.verdict())

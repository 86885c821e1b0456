"""Failover without loss (issue 24 items 2, 3 and 6): REAL `fleet reconcile --listen` replica processes on one
real PostgreSQL, a real bare git origin, worker traffic over HTTP through every replica.

The test holds the lease itself while the workers' traffic goes in through every replica, then releases it:
one replica takes it (epoch 2) and judges everything in one pass. That leader is SIGKILLed at a named point of
the pass (every replica gets FLEET_TEST_PAUSE_AT; the first to reach the point announces "<point> <pid>" on a
FIFO and stops itself with SIGSTOP; the test then removes the FIFO, so no later leader stops; no sleeps):
- `write`: while writing the record files, before anything was committed;
- `push`: after the commit, before the lease check and the push;
- `pushed`: after the push, before the directives were stored.
Another replica takes over once the lease lapses (epoch 3), commits what was pending exactly once (or nothing, when the
dead leader had pushed it) and stores the directives; every report and log line posted through any replica,
before or after the kill, is in the store.

A stale leader (paused at the point, the lease lapsing meanwhile, resumed after the new leader pushed) never
pushes: stopped right before the lease check, the check refuses; stopped right after it (`fenced`), git refuses
its non-fast-forward push and its retry, recomputed on the new tip, has nothing left to write.
Waiting for the lease to lapse is real time (`--lease 2`): the database's clock decides, as in production.
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from reconciler.adapters.lease import LeaseKeeper, PostgresLease, holder_id
from reconciler.domain.leadership import LEADER_EPOCH_TRAILER
from reconciler.domain.tokens import instance_token, machine_claim
from tests.gitrepos import git, make_origin, origin_file
from tests.loop_support import trailers
from tests.scenarios import SPEC_YAML

SECRET = "failover-test-controller-secret-0123"
ADMIN = "failover-test-admin-token-0123456789"
LEASE_S, INTERVAL_S = 2.0, 0.5
WAIT_S = 120.0  # generous: 2 cores shared with other engineers; never a speed assertion
#: One benchmark per pool, each below its pool's minimum: two verdicts (each pool's kill budget allows one).
WORKERS = {"rtx-pro-4000-0-fo1": ("61001", "rtx-pro-4000"), "rtx4090-0-fo2": ("61002", "rtx4090")}


@dataclass
class Replica:
    name: str
    proc: subprocess.Popen[str]
    workdir: Path
    url: str = ""
    lines: queue.Queue[str] = field(default_factory=queue.Queue)

    def passes(self) -> Iterator[dict[str, Any]]:
        """This replica's pass results (JSON lines) as they come; pytest.fail after WAIT_S of silence."""
        while True:
            try:
                line = self.lines.get(timeout=WAIT_S)
            except queue.Empty:
                pytest.fail(f"replica {self.name} printed nothing for {WAIT_S:g} s")
            if line is None:
                pytest.fail(f"replica {self.name} exited (rc {self.proc.poll()})")
            if line.startswith("{"):
                yield json.loads(line)


@dataclass
class Cluster:
    tmp: Path
    origin: Path
    db: str
    fifo: Path
    replicas: list[Replica] = field(default_factory=list)
    merged: queue.Queue[tuple[str, str | None]] = field(default_factory=queue.Queue)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
        return {**env, "FLEET_CONTROLLER_SECRET": SECRET, "FLEET_ADMIN_TOKEN": ADMIN,
                "FLEET_TEST_PAUSE_FIFO": str(self.fifo), **extra}

    def start(self, name: str, **extra: str) -> Replica:
        """A replica process; returns once it listens and said how it stands with the lease."""
        workdir = self.tmp / name
        cmd = [sys.executable, "-m", "reconciler.cli", "reconcile", "--repo", str(self.origin), "--workdir",
               str(workdir), "--controller-db", self.db, "--listen", "127.0.0.1:0", "--interval", str(INTERVAL_S),
               "--lease", str(LEASE_S), "--replica-name", name, "--json"]
        err = open(self.tmp / f"{name}.stderr", "w")  # noqa: SIM115 - closed when the process is gone
        proc = subprocess.Popen(cmd, env=self.env(**extra), stdout=subprocess.PIPE, stderr=err, text=True,
                                start_new_session=True)
        err.close()
        replica = Replica(name, proc, workdir)
        threading.Thread(target=self._pump, args=(replica, proc.stdout), daemon=True).start()
        self.replicas.append(replica)
        while not replica.url:
            try:
                line = replica.lines.get(timeout=WAIT_S)
            except queue.Empty:
                pytest.fail(f"replica {name} never started listening")
            if line is None:
                pytest.fail(f"replica {name} exited: {(self.tmp / f'{name}.stderr').read_text()}")
            if line.startswith("controller listening on "):
                replica.url = line.split()[3]
        return replica

    def _pump(self, replica: Replica, stream: IO[str] | None) -> None:
        assert stream is not None
        for raw in stream:
            line = raw.rstrip("\n")
            replica.lines.put(line)
            self.merged.put((replica.name, line))
        replica.lines.put(None)  # type: ignore[arg-type]  # end of output
        self.merged.put((replica.name, None))

    def first_pass_where(self, predicate: Callable[[dict[str, Any]], bool],
                         among: set[str]) -> tuple[str, dict[str, Any]]:
        """The first pass result of any replica in `among` that satisfies `predicate`."""
        while True:
            try:
                name, line = self.merged.get(timeout=WAIT_S)
            except queue.Empty:
                pytest.fail(f"no replica of {sorted(among)} passed the check within {WAIT_S:g} s")
            if name in among and line is not None and line.startswith("{"):
                doc = json.loads(line)
                if predicate(doc):
                    return name, doc

    def stop_all(self) -> None:
        for r in self.replicas:
            if r.proc.poll() is None:
                os.killpg(r.proc.pid, signal.SIGKILL)
            r.proc.wait(timeout=60)


@pytest.fixture
def cluster(tmp_path: Path, postgres_db: str) -> Iterator[Cluster]:
    origin, _ = make_origin(tmp_path, {"fleet-spec/fleet.yaml": SPEC_YAML, "README.md": "fleet\n"})
    fifo = tmp_path / "pause.fifo"
    os.mkfifo(fifo)
    c = Cluster(tmp_path, origin, postgres_db, fifo)
    yield c
    c.stop_all()


@pytest.fixture
def gate(postgres_db: str) -> Iterator[LeaseKeeper]:
    """The test holds the lease (epoch 1) until it releases it: no replica judges a half-posted benchmark."""
    keeper = LeaseKeeper(PostgresLease(postgres_db), holder_id("test-gate"), LEASE_S)
    keeper.start()
    assert keeper.term() == 1
    yield keeper
    keeper.stop(release=True)


def leads(doc: dict[str, Any]) -> bool:
    return doc.get("standby") is None


def post(url: str, iid: str, action: str, doc: dict[str, Any]) -> None:
    token = instance_token(SECRET.encode(), iid)
    r = httpx.post(f"{url}/api/v1/instances/{iid}/{action}", json=doc, timeout=30,
                   headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, (url, action, r.status_code, r.text)


def worker_traffic(replicas: list[Replica]) -> list[str]:
    """Register, log and report both benchmarks, spreading the requests over the replicas. Returns the lines."""
    lines = []
    for n, (iid, (machine, pool)) in enumerate(WORKERS.items()):
        via = [replicas[(n + k) % len(replicas)].url for k in range(3)]
        post(via[0], iid, "register", {
            "protocol": 1, "instance_id": iid, "at": "2026-12-02T18:00:00Z", "pool": pool, "slot": f"{pool}-0",
            "machine_id": machine, "machine_claim": machine_claim(SECRET.encode(), iid, machine), "host_id": "7781"})
        mine = [f"{iid} benchmark line {i}" for i in range(3)]
        post(via[1], iid, "logs", {"protocol": 1, "lines": mine})
        lines += mine
        post(via[2], iid, "result", {
            "protocol": 1, "outcome": "completed", "at": "2026-12-02T18:40:00Z", "started_at": "2026-12-02T18:20:00Z",
            "exit_code": 0, "requested": 10, "completed": 10, "failed": 0, "proofs_per_hour": 20.0,
            "seconds_per_proof": 180.0, "log_tail": ["throughput:    0.333 proofs/min (180.0s/proof)"]})
    return lines


def open_pause_fifo(c: Cluster) -> tuple[int, int]:
    rfd = os.open(c.fifo, os.O_RDONLY | os.O_NONBLOCK)
    return rfd, os.open(c.fifo, os.O_WRONLY)  # a writer of our own: no EOF before a replica writes


def paused_replica(c: Cluster, fds: tuple[int, int], step: str) -> Replica:
    """Block until a replica announces that it reached `step` (it then stops itself); remove the FIFO so no
    other replica stops there; the replica that announced."""
    rfd, keep = fds
    try:
        ready, _, _ = select.select([rfd], [], [], WAIT_S)
        if not ready:
            pytest.fail(f"no replica reached {step!r}")
        announced, pid = os.read(rfd, 200).decode().split()
    finally:
        os.close(keep)
        os.close(rfd)
        c.fifo.unlink()
    assert announced == step
    return next(r for r in c.replicas if r.proc.pid == int(pid))


def admin_get(url: str, path: str) -> Any:
    r = httpx.get(f"{url}{path}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def directive(url: str, iid: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/api/v1/instances/{iid}/directive", timeout=30,
                  headers={"Authorization": f"Bearer {instance_token(SECRET.encode(), iid)}"})
    assert r.status_code == 200, r.text
    return dict(r.json())


def assert_judged_exactly_once(c: Cluster, epoch: str) -> None:
    commits = git(c.origin, "log", "--format=%an|%s", "main").splitlines()
    assert len(commits) == 2 and commits[0].startswith("fleet-reconciler|fleet: ") and "2 verdicts" in commits[0], \
        commits
    assert sorted(trailers(c.origin, "Fleet-Instance")) == sorted(WORKERS)
    assert trailers(c.origin, LEADER_EPOCH_TRAILER) == [epoch]
    for machine, _ in WORKERS.values():
        record = origin_file(c.origin, f"fleet-spec/machines/{machine}.yaml")
        assert record is not None and "status: bad" in record


def assert_nothing_lost(survivor: Replica, posted_lines: list[str]) -> None:
    listing = admin_get(survivor.url, "/api/instances")["instances"]
    assert sorted(i["instance_id"] for i in listing) == sorted(WORKERS)
    assert all(i["result"]["proofs_per_hour"] == 20.0 for i in listing)
    stored = [line for iid in WORKERS for line in admin_get(survivor.url, f"/api/instance-logs/{iid}")["lines"]]
    assert sorted(stored) == sorted(posted_lines)
    for iid in WORKERS:  # the new leader stored the directives the dead one may never have written
        assert directive(survivor.url, iid)["action"] == "stop"


@pytest.mark.parametrize("step", ["write", "push", "pushed"])
def test_the_leader_killed_during_a_pass_is_replaced_and_nothing_is_lost_or_doubled(
        cluster: Cluster, gate: LeaseKeeper, step: str) -> None:
    replicas = [cluster.start(name, FLEET_TEST_PAUSE_AT=step) for name in ("r1", "r2", "r3")]
    for r in replicas:
        assert "replica test-gate~" in next(r.passes())["standby"]
    posted = worker_traffic(replicas)
    fds = open_pause_fifo(cluster)
    gate.stop(release=True)
    leader = paused_replica(cluster, fds, step)
    os.killpg(leader.proc.pid, signal.SIGKILL)
    assert leader.proc.wait(timeout=60) == -signal.SIGKILL
    followers = [r for r in replicas if r is not leader]
    after = [f"{iid} line after the failover" for iid in WORKERS]  # workers keep talking to the survivors
    for n, (iid, line) in enumerate(zip(WORKERS, after, strict=True)):
        post(followers[n % 2].url, iid, "logs", {"protocol": 1, "lines": [line]})
    name, doc = cluster.first_pass_where(leads, {f.name for f in followers})
    assert doc["ok"], doc
    if step == "pushed":  # the dead leader's commit reached origin: the new leader has nothing to add
        assert doc["commit"] is None, doc
        assert_judged_exactly_once(cluster, epoch="2")
    else:
        assert doc["commit"] and doc["pushed"], doc
        assert_judged_exactly_once(cluster, epoch="3")
    survivor = next(f for f in followers if f.name == name)
    assert_nothing_lost(survivor, posted + after)
    health = httpx.get(f"{survivor.url}/healthz", timeout=30).json()["leadership"]
    assert health["leading"] and health["leader"]["epoch"] == 3 and health["leader"]["holder"].startswith(name)
    other = next(f for f in followers if f.name != name)
    seen_by_other = httpx.get(f"{other.url}/healthz", timeout=30).json()["leadership"]
    assert not seen_by_other["leading"]
    assert seen_by_other["leader"]["holder"] == health["leader"]["holder"]


def test_a_stale_leader_resumed_before_the_new_leader_pushed_is_stopped_by_the_lease_check(
        cluster: Cluster, gate: LeaseKeeper) -> None:
    """The case git cannot catch: the old leader (epoch 2) stopped right before its lease check, past its lease;
    the new leader (epoch 3) has committed locally but not pushed yet, so origin has not moved and a push of the
    old leader would fast-forward. Resumed now, the old leader's check refuses: origin does not move."""
    replicas = [cluster.start(name, FLEET_TEST_PAUSE_AT="push") for name in ("r1", "r2")]
    worker_traffic(replicas)
    fds = open_pause_fifo(cluster)
    gate.stop(release=True)
    stale = paused_replica(cluster, fds, "push")  # stopped by itself: a paused VM, a long GC, a debugger
    os.mkfifo(cluster.fifo)
    new = paused_replica(cluster, open_pause_fifo(cluster), "push")  # took over and committed, not pushed
    assert new is not stale
    seed = git(cluster.origin, "rev-parse", "main")
    _drain(stale)
    os.kill(stale.proc.pid, signal.SIGCONT)
    resumed = next(stale.passes())  # the pass it was in when stopped
    assert not resumed["ok"] and resumed["condition"]["reason"] == "LeaseLost", resumed
    assert "epoch 2 is no longer held" in resumed["error"], resumed
    assert git(cluster.origin, "rev-parse", "main") == seed  # it did not push
    os.kill(new.proc.pid, signal.SIGCONT)
    cluster.first_pass_where(lambda d: bool(leads(d) and d.get("pushed")), {r.name for r in replicas})
    epochs = trailers(cluster.origin, LEADER_EPOCH_TRAILER)
    assert len(epochs) == 1 and int(epochs[0]) >= 3, epochs  # whoever leads by then; never the stale term
    assert sorted(trailers(cluster.origin, "Fleet-Instance")) == sorted(WORKERS)


def test_a_stale_leader_resumed_after_its_lease_check_is_stopped_by_git(cluster: Cluster, gate: LeaseKeeper) -> None:
    """The window after the check: the old leader stopped between its lease check and its push; the new leader
    pushed meanwhile. Resumed, its push is not a fast-forward: git refuses it, and the retry, recomputed on the
    new tip, has nothing left to commit."""
    replicas = [cluster.start(name, FLEET_TEST_PAUSE_AT="fenced") for name in ("r1", "r2")]
    worker_traffic(replicas)
    fds = open_pause_fifo(cluster)
    gate.stop(release=True)
    stale = paused_replica(cluster, fds, "fenced")
    other = next(r for r in replicas if r is not stale)
    cluster.first_pass_where(lambda d: bool(leads(d) and d.get("pushed")), {other.name})
    assert_judged_exactly_once(cluster, epoch="3")
    tip = git(cluster.origin, "rev-parse", "main")
    _drain(stale)
    os.kill(stale.proc.pid, signal.SIGCONT)
    resumed = next(stale.passes())
    assert resumed["ok"] and resumed["commit"] is None and not resumed["pushed"], resumed
    assert git(cluster.origin, "rev-parse", "main") == tip
    assert_judged_exactly_once(cluster, epoch="3")
    later = next(stale.passes())  # from now on it follows
    assert later["standby"] and f"replica {other.name}~" in later["standby"], later


def _drain(replica: Replica) -> list[dict[str, Any]]:
    out = []
    while True:
        try:
            line = replica.lines.get_nowait()
        except queue.Empty:
            return out
        if line and line.startswith("{"):
            out.append(json.loads(line))

"""Replicas of `fleet reconcile --listen` as REAL processes on one PostgreSQL and one bare git origin, with worker
traffic over HTTP: the harness of the failover test (tests/integration/test_failover.py) and of the failover
figure (bench/bench_failover.py).

Every replica prints each pass as a JSON line (`--json`); a reader thread per replica queues them, so the test
waits for a pass with a deadline instead of sleeping. A replica reaches a named point of a pass exactly when
FLEET_TEST_PAUSE_AT names it: it announces "<point> <pid>" on the FIFO and stops itself (SIGSTOP); removing the
FIFO afterwards keeps every later replica from stopping there (reconciler/adapters/git.py `_pause_point`).
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

from reconciler.adapters.lease import LeaseKeeper, PostgresLease, holder_id
from reconciler.adapters.stores import open_store
from reconciler.domain.tokens import instance_token, machine_claim

SECRET = "failover-test-controller-secret-0123"
ADMIN = "failover-test-admin-token-0123456789"
WAIT_S = 120.0  # generous: 2 cores shared with other engineers; a deadline, never a speed assertion
#: One benchmark per pool, each below its pool's minimum: two verdicts (each pool's kill budget allows one).
WORKERS = {"rtx-pro-4000-0-fo1": ("61001", "rtx-pro-4000"), "rtx4090-0-fo2": ("61002", "rtx4090")}


class ReplicaTimeout(AssertionError):
    """A replica did not do what was awaited within WAIT_S (or exited)."""


@dataclass
class Replica:
    name: str
    proc: subprocess.Popen[str]
    workdir: Path
    url: str = ""
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)

    def next_line(self) -> str:
        """The next line it prints; ReplicaTimeout after WAIT_S of silence or when it exited (with its stderr)."""
        try:
            line = self.lines.get(timeout=WAIT_S)
        except queue.Empty:
            raise ReplicaTimeout(f"replica {self.name} printed nothing for {WAIT_S:g} s") from None
        if line is None:
            stderr = self.workdir.with_name(f"{self.name}.stderr")
            raise ReplicaTimeout(f"replica {self.name} exited (rc {self.proc.poll()}): "
                                 f"{stderr.read_text() if stderr.exists() else ''}")
        return line

    def passes(self) -> Iterator[dict[str, Any]]:
        """This replica's pass results (JSON lines) as they come."""
        while True:
            line = self.next_line()
            if line.startswith("{"):
                yield json.loads(line)

    def drain(self) -> list[dict[str, Any]]:
        """The pass results printed so far and not read yet."""
        out: list[dict[str, Any]] = []
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return out
            if line and line.startswith("{"):
                out.append(json.loads(line))


@dataclass
class Cluster:
    tmp: Path
    origin: Path
    db: str
    fifo: Path
    lease_s: float = 2.0
    interval_s: float = 0.5
    replicas: list[Replica] = field(default_factory=list)
    merged: queue.Queue[tuple[str, str | None]] = field(default_factory=queue.Queue)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
        return {**env, "FLEET_CONTROLLER_SECRET": SECRET, "FLEET_ADMIN_TOKEN": ADMIN,
                "FLEET_TEST_PAUSE_FIFO": str(self.fifo), **extra}

    def start(self, name: str, **extra: str) -> Replica:
        """A replica process; returns once it listens."""
        workdir = self.tmp / name
        cmd = [sys.executable, "-m", "reconciler.cli", "reconcile", "--repo", str(self.origin), "--workdir",
               str(workdir), "--controller-db", self.db, "--listen", "127.0.0.1:0", "--interval",
               str(self.interval_s), "--lease", str(self.lease_s), "--replica-name", name, "--json"]
        with open(self.tmp / f"{name}.stderr", "w") as err:
            proc = subprocess.Popen(cmd, env=self.env(**extra), stdout=subprocess.PIPE, stderr=err, text=True,
                                    start_new_session=True)
        replica = Replica(name, proc, workdir)
        threading.Thread(target=self._pump, args=(replica, proc.stdout), daemon=True).start()
        self.replicas.append(replica)
        while not replica.url:
            line = replica.next_line()
            if line.startswith("controller listening on "):
                replica.url = line.split()[3]
        return replica

    def _pump(self, replica: Replica, stream: IO[str] | None) -> None:
        assert stream is not None
        for raw in stream:
            line = raw.rstrip("\n")
            replica.lines.put(line)
            self.merged.put((replica.name, line))
        replica.lines.put(None)  # end of output
        self.merged.put((replica.name, None))

    def first_pass_where(self, predicate: Callable[[dict[str, Any]], bool],
                         among: set[str]) -> tuple[str, dict[str, Any]]:
        """The first pass result, from now on, of any replica in `among` that satisfies `predicate`."""
        while True:
            try:
                name, line = self.merged.get(timeout=WAIT_S)
            except queue.Empty:
                raise ReplicaTimeout(f"no replica of {sorted(among)} passed the check within {WAIT_S:g} s") from None
            if name in among and line is not None and line.startswith("{"):
                doc = json.loads(line)
                if predicate(doc):
                    return name, doc

    def open_pause_fifo(self) -> tuple[int, int]:
        """Start listening for a pause announcement (before the replicas can reach the point)."""
        if not self.fifo.exists():
            os.mkfifo(self.fifo)
        rfd = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)
        return rfd, os.open(self.fifo, os.O_WRONLY)  # a writer of our own: no EOF before a replica writes

    def paused_replica(self, fds: tuple[int, int], step: str) -> Replica:
        """Block until a replica announces that it reached `step` (it then stops itself); remove the FIFO so no
        other replica stops there; return the replica that announced."""
        rfd, keep = fds
        try:
            ready, _, _ = select.select([rfd], [], [], WAIT_S)
            if not ready:
                raise ReplicaTimeout(f"no replica reached {step!r}")
            announced, pid = os.read(rfd, 200).decode().split()
        finally:
            os.close(keep)
            os.close(rfd)
            self.fifo.unlink()
        assert announced == step, announced
        return next(r for r in self.replicas if r.proc.pid == int(pid))

    def gate(self) -> LeaseKeeper:
        """The caller holds the lease (epoch 1 on a fresh database) until it stops this keeper: no replica
        judges a half-posted benchmark meanwhile."""
        # The store's schema (the lease table is part of it) first, as a replica opens the store before its lease.
        open_store(self.db).close()
        # A long lease of its own: renewals of a thread in a busy test process must not let it lapse early.
        keeper = LeaseKeeper(PostgresLease(self.db), holder_id("test-gate"), 60.0)
        keeper.start()
        return keeper

    def stop_all(self) -> None:
        for r in self.replicas:
            if r.proc.poll() is None:
                os.killpg(r.proc.pid, signal.SIGKILL)
            r.proc.wait(timeout=60)


def leads(doc: dict[str, Any]) -> bool:
    """A pass result of a replica that led (not a standby report)."""
    return doc.get("standby") is None


def post(url: str, iid: str, action: str, doc: dict[str, Any]) -> None:
    token = instance_token(SECRET.encode(), iid)
    r = httpx.post(f"{url}/api/v1/instances/{iid}/{action}", json=doc, timeout=30,
                   headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, (url, action, r.status_code, r.text)


def worker_traffic(replicas: list[Replica]) -> list[str]:
    """Register, log and report both benchmarks, spreading the requests over the replicas; the lines logged."""
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


def admin_get(url: str, path: str) -> Any:
    r = httpx.get(f"{url}{path}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def directive(url: str, iid: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/api/v1/instances/{iid}/directive", timeout=30,
                  headers={"Authorization": f"Bearer {instance_token(SECRET.encode(), iid)}"})
    assert r.status_code == 200, r.text
    return dict(r.json())

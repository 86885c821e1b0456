"""Failover: the leader killed -> the next pass committed by another replica (issue 24, figure 3).

Each round: a fresh database on a PostgreSQL server this bench starts (tests/postgres_server.py) and a fresh
bare origin; two `fleet reconcile --listen` replicas (`--lease 2 --interval 0.5`); the bench holds the lease
while two below-minimum benchmarks are reported through the replicas, then releases it. The replica that takes
it judges both, commits and stops itself right before its lease check and push (FLEET_TEST_PAUSE_AT=push, see
tests/replica_support.py); the bench SIGKILLs it there: the verdicts are pending, committed only in the dead
replica's clone. Measured: from the SIGKILL to the other replica's pass line saying it pushed them (the time
the JSON line reaches the bench).

What bounds it: the dead leader's lease runs out at most `--lease` after its last renewal (renewals every
lease/3, so 2/3 to 1 lease after the kill), the follower tries to take it every min(lease/3, interval), then
runs a pass at once (fetch, judge, commit, lease check, push). Target: <= lease + interval + 2 s.
"""

from __future__ import annotations

import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import Figure
from tests.gitrepos import make_origin
from tests.postgres_server import PostgresServer
from tests.replica_support import Cluster, leads, worker_traffic
from tests.scenarios import SPEC_YAML

LEASE_S, INTERVAL_S = 2.0, 0.5
ROUNDS = 5


def one_round(server: PostgresServer, tmp: Path) -> float:
    origin, _ = make_origin(tmp, {"fleet-spec/fleet.yaml": SPEC_YAML, "README.md": "fleet\n"})
    cluster = Cluster(tmp, origin, server.create_database(), tmp / "pause.fifo", lease_s=LEASE_S,
                      interval_s=INTERVAL_S)
    gate = cluster.gate()
    try:
        replicas = [cluster.start(name, FLEET_TEST_PAUSE_AT="push") for name in ("r1", "r2")]
        worker_traffic(replicas)
        fds = cluster.open_pause_fifo()
        gate.stop(release=True)
        leader = cluster.paused_replica(fds, "push")
        killed = time.monotonic()
        os.killpg(leader.proc.pid, signal.SIGKILL)
        survivor = {r.name for r in replicas if r is not leader}
        cluster.first_pass_where(lambda d: bool(leads(d) and d.get("pushed")), survivor)
        return time.monotonic() - killed
    finally:
        gate.stop(release=False)
        cluster.stop_all()


def run() -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        server = PostgresServer()  # its own directory under the system temp dir, which the postgres user can reach
        server.start()
        try:
            times = []
            for n in range(ROUNDS):
                round_dir = Path(tmp) / f"round-{n}"
                round_dir.mkdir()
                times.append(one_round(server, round_dir))
        finally:
            server.stop()
            server.destroy()
    median = statistics.median(times)
    budget = LEASE_S + INTERVAL_S + 2.0
    return [Figure("failover: leader killed -> next pass committed by another replica", median, "s",
                   f"median of {ROUNDS} (each {', '.join(f'{t:.2f}' for t in times)} s); --lease {LEASE_S:g} "
                   f"--interval {INTERVAL_S:g}; killed after its commit, before its push; 2 replicas on one "
                   "PostgreSQL on this machine",
                   target=f"<= {budget:g} s (lease + interval + 2 s)", passed=median <= budget)]

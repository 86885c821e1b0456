"""A real `fleet reconcile` loop (a subprocess, passes every 0.5 s) follows demand with short timings.

The fleet repo is a bare git origin; the controller store is the real SQLite store the loop reads; two
serving workers send heartbeats to it (a thread plays them, through the store's API, as the controller
would store them); curio's queue is a REAL PostgreSQL with curio's harmony_task tables and a read-only role.
Short timings: 3 s windows and cooldown, heartbeats every 0.5 s, and a pool minimum of 2400 proofs/h so a
machine clears 2 tasks in a window. Shown, each change a commit with its reason in a Fleet-Capacity trailer:
- a growing queue scales up (2 -> 4, then 4 -> 6 = max; the spend cap $3/h holds 6 x $0.50),
- idle scales down to min by releasing the slots without an instance and DRAINING the worse $/proof
  machine (directive `drain` in the store), and the slot is released only after its worker stopped.
Waits poll the origin and the store with a deadline (no fixed sleeps).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.cli import main
from tests.gitrepos import git, make_origin, origin_file
from tests.postgres_server import PostgresServer
from tests.scenarios import DIGEST

DDL = (Path(__file__).parent.parent / "fixtures" / "curio" / "harmony_task.sql").read_text()

SPEC = """\
version: 1
image: {repository: ghcr.io/example/cuzk-worker}
controller: {url: http://127.0.0.1:8080}
max_total_dph: 3.0
pools:
  - name: rtx4090
    gpu_name: RTX 4090
    count: {min: 1, max: 6}
    min_rate_proofs_per_hour: 2400
    max_price_usd_per_hour: 0.5
    scaling: {target_utilization: 0.8, scale_up_after_minutes: 0.05, scale_down_after_minutes: 0.05,
              cooldown_minutes: 0.05}
    queue: {url_env: CURIO_DB_URL, task_types: [PoRep]}
"""
#: The leader's earlier decision: two slots, both serving.
CAPACITY = ('"rtx4090": {"desired": 2, "slots": [0, 1], "draining": [], "changed_at": "2026-01-01T00:00:00Z", '
            '"direction": "up", "reason": "earlier", "signals": {}}\n')
WORKERS = {"rtx4090-0-aaaaaa": ("rtx4090-0", "m-100", 3000.0, 2), "rtx4090-1-bbbbbb": ("rtx4090-1", "m-101", 2500.0, 1)}


class Heartbeats(threading.Thread):
    """Two serving workers' heartbeats every 0.5 s (busy or idle as the test says), through the store."""

    def __init__(self, db: Path):
        super().__init__(daemon=True)
        self.store = SqliteStore(db)
        self.busy = True
        self.stopped: set[str] = set()
        self.halt = threading.Event()

    def run(self) -> None:
        seq = 0
        while not self.halt.wait(0.5):
            seq += 1
            for iid, (_slot, _machine, _rate, per_beat) in WORKERS.items():
                if iid in self.stopped:
                    continue
                self.store.add_event(iid, {"protocol": 1, "phase": "serve", "status": "progress",
                                           "at": _now(), "message": f"heartbeat {seq}",
                                           "details": {"heartbeat": {"seq": seq, "interval_s": 0.5,
                                                                     "completed": per_beat if self.busy else 0,
                                                                     "failed": 0, "busy": self.busy}}})

    def stop_worker(self, iid: str) -> None:
        """What serve.sh sends once drained."""
        self.stopped.add(iid)
        self.store.add_event(iid, {"protocol": 1, "phase": "serve", "status": "done", "at": _now(),
                                   "message": "drained: no proofs left in progress"})


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _seed(db: Path) -> None:
    store = SqliteStore(db)
    try:
        for iid, (slot, machine, rate, _) in WORKERS.items():
            store.register(iid, {"protocol": 1, "instance_id": iid, "at": _now(), "pool": "rtx4090", "slot": slot,
                                 "machine_id": machine, "host_id": "h-1", "gpu_name": "RTX 4090",
                                 "image_digest": DIGEST})
            for phase, status in (("params", "started"), ("params", "done"), ("benchmark", "started")):
                store.add_event(iid, {"protocol": 1, "phase": phase, "status": status, "at": _now()})
            store.set_result(iid, {"protocol": 1, "outcome": "completed", "at": _now(), "requested": 10,
                                   "completed": 10, "failed": 0, "exit_code": 0, "proofs_per_hour": rate,
                                   "seconds_per_proof": round(3600 / rate, 3), "image_digest": DIGEST})
            store.add_event(iid, {"protocol": 1, "phase": "serve", "status": "started", "at": _now()})
    finally:
        store.close()


@pytest.fixture
def curio(postgres_server: PostgresServer) -> Iterator[tuple[PostgresServer, str, str]]:
    uri = postgres_server.create_database()
    db = uri.rsplit("/", 1)[1]
    postgres_server.execute(DDL, db)
    postgres_server.execute(
        "INSERT INTO harmony_machines (host_and_port, cpu, ram, gpu) VALUES ('10.0.0.7:1', 1, 1, 1)", db)
    role, password = f"r_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    postgres_server.create_role(role, password)
    postgres_server.execute(f'GRANT CONNECT ON DATABASE "{db}" TO "{role}"')
    postgres_server.execute(f'GRANT USAGE ON SCHEMA public TO "{role}"; GRANT SELECT ON harmony_task TO "{role}"', db)
    yield postgres_server, db, postgres_server.uri(db, role, password)


def _add_tasks(server: PostgresServer, db: str, n: int) -> None:
    for _ in range(n):
        server.execute("INSERT INTO harmony_task (posted_time, added_by, name) VALUES "
                       "(now() - interval '10 minutes', 1, 'PoRep')", db)


def _capacity_trailers(origin: Path) -> list[str]:
    out = git(origin, "log", "--reverse", "--format=%(trailers:key=Fleet-Capacity,valueonly)", "main")
    return [line for line in out.splitlines() if line.strip()]


def _wait(what: str, predicate: Callable[[], bool], proc: subprocess.Popen[str], log: Path,
          timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    assert predicate(), f"{what}: not within {timeout_s:.0f}s\n{log.read_text()[-4000:]}"


def test_fleet_reconcile_scales_up_on_a_growing_queue_and_down_by_draining_on_idle(
        tmp_path: Path, curio: tuple[PostgresServer, str, str], capsys: pytest.CaptureFixture[str]) -> None:
    server, db, reader_url = curio
    origin, _ = make_origin(tmp_path, {"fleet-spec/fleet.yaml": SPEC, "fleet-spec/capacity.yaml": CAPACITY})
    store_path = tmp_path / "controller.db"
    _seed(store_path)
    beats = Heartbeats(store_path)
    beats.start()
    _add_tasks(server, db, 2)
    log = tmp_path / "reconcile.log"
    env = {**os.environ, "CURIO_DB_URL": reader_url}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reconciler.cli", "reconcile", "--repo", str(origin), "--workdir",
             str(tmp_path / "bot"), "--controller-db", str(store_path), "--interval", "0.5",
             "--image-digest", DIGEST], stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        # 2 machines busy + 2 tasks (a machine clears 2 in the 3 s window) = 3 machine-equivalents / 0.8 -> 4.
        _wait("scale-up 2 -> 4", lambda: len(_capacity_trailers(origin)) >= 1, proc, log)
        assert _capacity_trailers(origin)[0] == (
            "rtx4090 2 -> 4 (the oldest of 2 waiting PoRep tasks has waited 10 min (scale_up_after 3 s): 2.0 busy + "
            "1.0 to clear the waiting tasks need 4 machines at target 0.80)")
        _add_tasks(server, db, 4)  # the queue grows: 2 + 3 machines' worth -> 6.25, held at max 6
        _wait("scale-up 4 -> 6", lambda: len(_capacity_trailers(origin)) >= 2, proc, log)
        assert _capacity_trailers(origin)[1].startswith(
            "rtx4090 4 -> 6 (the oldest of 6 waiting PoRep tasks has waited 10 min (scale_up_after 3 s): 2.0 busy + "
            "3.0 to clear the waiting tasks need 7 machines at target 0.80 (max 6)")
        capacity = origin_file(origin, "fleet-spec/capacity.yaml") or ""
        assert '"desired": 6, "slots": [0, 1, 2, 3, 4, 5], "draining": []' in capacity
        # Demand ends: the tasks are claimed, the machines go idle.
        server.execute("UPDATE harmony_task SET owner_id = 1", db)
        beats.busy = False
        # Down to min 1 (in one step, or two when the window still held a busy heartbeat: 6 -> 2 -> 1).
        _wait("scale-down to 1", lambda: '"desired": 1, "slots": [0, 1], "draining": [1]' in (
            origin_file(origin, "fleet-spec/capacity.yaml") or ""), proc, log)
        downs = _capacity_trailers(origin)[2:]
        assert downs[0].startswith("rtx4090 6 -> ") and downs[-1].split(" (")[0].endswith(" -> 1")
        assert all(" over 3 s with no task waiting: " in d for d in downs), downs
        bodies = git(origin, "log", "--format=%B%x00", "main")
        assert "draining rtx4090-1-bbbbbb" in bodies
        assert "released rtx4090-2, rtx4090-3, rtx4090-4, rtx4090-5" in bodies
        # The worse $/proof machine (2500/h) drains; the other keeps serving. Nothing is stopped mid-proof:
        # its slot stays until the worker says it has finished.
        reader = SqliteStore(store_path)
        try:
            _wait("drain directive", lambda: (reader.directive("rtx4090-1-bbbbbb") or {}).get("action") == "drain",
                  proc, log)
            assert (reader.directive("rtx4090-0-aaaaaa") or {}).get("action") == "serve"
            assert "finish the current proofs, take no new work, then stop" in \
                (reader.directive("rtx4090-1-bbbbbb") or {})["reason"]
        finally:
            reader.close()
        beats.stop_worker("rtx4090-1-bbbbbb")
        _wait("drained slot released", lambda: '"slots": [0], "draining": []' in (
            origin_file(origin, "fleet-spec/capacity.yaml") or ""), proc, log)
        subjects = git(origin, "log", "-1", "--format=%s", "main").strip()
        assert subjects == ("fleet capacity: rtx4090 released rtx4090-1 (drained: nothing proves there any "
                            "more)")
    finally:
        beats.halt.set()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        finally:
            beats.join(timeout=5)
            beats.store.close()
    assert proc.returncode == 0, log.read_text()[-3000:]
    # Every capacity change is a commit whose trailer carries its reason; bounds and the cap held.
    trailers = [t.split(" (")[0] for t in _capacity_trailers(origin)]
    assert trailers[:2] == ["rtx4090 2 -> 4", "rtx4090 4 -> 6"] and trailers[-1] == "rtx4090 released rtx4090-1"
    assert trailers[2:-1] in (["rtx4090 6 -> 1"], ["rtx4090 6 -> 2", "rtx4090 2 -> 1"]), trailers

    # `fleet why --pool` reads the decisions back from git; `fleet status` shows the pool's capacity.
    assert main(["why", "--pool", "rtx4090", "--repo", str(tmp_path / "bot")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "capacity decisions for pool rtx4090, newest first (git log of fleet-spec/capacity.yaml):"
    assert [line.split("  ")[3].split(" (")[0] for line in lines[1:]] == trailers[::-1]
    assert main(["status", "--workdir", str(tmp_path / "bot"), "--controller-db", str(store_path)]) == 0
    status = capsys.readouterr().out
    assert "capacity (autoscaled pools; bounds in fleet.yaml, decisions in capacity.yaml):" in status
    assert "  rtx4090: desired 1 of 1..6 (1 slot(s); 1 serving, 0 on the way)" in status
    assert "$0.50/h at min, $3.00/h at max (max price)" in status

"""Several controller processes on one port (`fleet controller serve --workers N`): real worker processes,
real HTTP on 127.0.0.1, one SQLite store. Both processes serve; a batch replayed at the same time through
both is stored once; a killed worker is replaced; stopping (or losing) the parent ends the workers; the
store's write lock makes concurrent writers take turns and times out as "database is locked"."""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from reconciler.adapters.controller.processes import ControllerProcesses, ServeConfig, backoff_delay
from reconciler.adapters.controller.server import EdgeLimits
from reconciler.adapters.store import ControllerStore, WriteLock
from tests.controller_support import ADMIN, SECRET, auth, register_doc

WORKERS = 2


def progress(k: int) -> dict[str, object]:
    return {"protocol": 1, "phase": "params", "status": "progress", "at": f"2026-12-02T18:{k // 60 % 60:02d}:"
            f"{k % 60:02d}Z", "message": f"{k} of 56 GiB", "details": {"done_bytes": k}}


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[ControllerProcesses]:
    db = tmp_path / "controller.db"
    store = ControllerStore(db)
    processes = ControllerProcesses(ServeConfig(db, SECRET, ADMIN, log_level="WARNING"), store, WORKERS,
                                    restart_delay=lambda quick_failures: 0.0).start()
    yield processes
    processes.stop()
    store.close()


def post_fresh(url: str, path: str, iid: str, doc: object) -> httpx.Response:
    """One request on its own connection: the kernel picks the process (SO_REUSEPORT) per connection."""
    with httpx.Client(base_url=url, timeout=30) as client:
        return client.post(path, json=doc, headers=auth(iid))


def test_two_processes_share_the_port_and_the_store(controller: ControllerProcesses) -> None:
    ids = [f"p-{i}-multi0" for i in range(8)]
    for iid in ids:
        registered = post_fresh(controller.url, f"/api/v1/instances/{iid}/register", iid, register_doc(iid))
        assert registered.status_code == 200
    jobs = [(iid, k) for iid in ids for k in range(12)]
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda job: post_fresh(controller.url, f"/api/v1/instances/{job[0]}/events", job[0],
                                                        progress(job[1])).status_code, jobs))
    assert statuses == [200] * len(jobs)
    served_here = controller.server.commits.writes
    assert 0 < served_here < len(jobs) + len(ids), "both processes took connections"
    assert len(controller.pids()) == WORKERS
    stats = controller.store.stats()
    assert (stats["instances"], stats["events"]) == (8, len(jobs))
    for iid in ids:
        report = controller.store.report(iid)
        assert report is not None  # sent concurrently: any order, each once
        assert sorted(int(str(e.message).split()[0]) for e in report.events) == list(range(12))
    assert controller.store.integrity_check() == ["ok"]


def test_a_batch_replayed_through_both_processes_at_once_is_stored_once(controller: ControllerProcesses) -> None:
    iid = "p-0-replay0"
    assert post_fresh(controller.url, f"/api/v1/instances/{iid}/register", iid, register_doc(iid)).status_code == 200
    batch = {"protocol": 1, "events": [progress(k) for k in range(20)]}
    start = threading.Barrier(16)

    def replay(_: int) -> dict[str, int]:
        with httpx.Client(base_url=controller.url, timeout=30) as client:
            start.wait()
            response = client.post(f"/api/v1/instances/{iid}/events", json=batch, headers=auth(iid))
            assert response.status_code == 200, response.text
            return response.json()

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(replay, range(16)))
    assert sum(a["stored"] for a in answers) == 20
    assert sum(a["duplicates"] for a in answers) == 15 * 20
    report = controller.store.report(iid)
    assert report is not None and len(report.events) == 20


def test_a_killed_worker_process_is_replaced(controller: ControllerProcesses) -> None:
    victim = controller.pids()[1]
    with controller.restarted:
        os.kill(victim, signal.SIGKILL)
        assert controller.restarted.wait_for(lambda: controller.restarts == 1, timeout=60)
    pids = controller.pids()
    assert len(pids) == WORKERS and victim not in pids
    iid = "p-0-after00"
    assert post_fresh(controller.url, f"/api/v1/instances/{iid}/register", iid, register_doc(iid)).status_code == 200
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda k: post_fresh(controller.url, f"/api/v1/instances/{iid}/events", iid,
                                                      progress(k)).status_code, range(24)))
    assert statuses == [200] * 24  # no connection went to the dead process's socket


def test_stop_ends_the_worker_processes(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    store = ControllerStore(db)
    processes = ControllerProcesses(ServeConfig(db, SECRET, None), store, 3).start()
    workers = processes.pids()[1:]
    handles = [os.pidfd_open(pid) for pid in workers]
    processes.stop()
    store.close()
    try:
        assert all(select.select([fd], [], [], 0)[0] for fd in handles), "every worker exited"
    finally:
        for fd in handles:
            os.close(fd)


SERVE_BOOTSTRAP = """
import argparse, sys
from reconciler.cli import controller
parser = argparse.ArgumentParser()
controller.register(parser.add_subparsers(dest="command", required=True))
args = parser.parse_args(sys.argv[1:])
sys.exit(args.func(args))
"""


def test_cli_workers_serve_and_outlive_nothing_when_the_parent_is_killed(tmp_path: Path) -> None:
    env = {**os.environ, "FLEET_CONTROLLER_SECRET": SECRET.decode(), "FLEET_ADMIN_TOKEN": ADMIN}
    proc = subprocess.Popen([sys.executable, "-c", SERVE_BOOTSTRAP, "controller", "serve", "--db",
                             str(tmp_path / "c.db"), "--port", "0", "--workers", "2", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("controller listening on http://127.0.0.1:") and "2 processes" in line, line
        url = line.split()[3]
        iid = "p-0-cli000"
        assert post_fresh(url, f"/api/v1/instances/{iid}/register", iid, register_doc(iid)).status_code == 200
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        workers = [int(pid) for pid in children]
        assert len(workers) == 1
        handle = os.pidfd_open(workers[0])
        proc.kill()  # SIGKILL: no chance to stop its workers; their stdin (the lease) closes
        proc.wait()
        try:
            assert select.select([handle], [], [], 60)[0], "the worker noticed its parent is gone and exited"
        finally:
            os.close(handle)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def test_cli_refuses_a_bad_worker_count(tmp_path: Path) -> None:
    env = {**os.environ, "FLEET_CONTROLLER_SECRET": SECRET.decode()}
    done = subprocess.run([sys.executable, "-c", SERVE_BOOTSTRAP, "controller", "serve", "--db", str(tmp_path / "c.db"),
                           "--workers", "0"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2
    assert "--workers must be between 1 and 64, got 0" in done.stderr


def test_the_unauthenticated_cap_is_shared_out(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    store = ControllerStore(db)
    try:
        config = ServeConfig(db, SECRET, None, limits=EdgeLimits(max_unauthenticated=512))
        assert ControllerProcesses(config, store, 4).config.limits.max_unauthenticated == 128
        assert ControllerProcesses(config, store, 1).config.limits.max_unauthenticated == 512
        with pytest.raises(ValueError, match="routes beside the controller API"):
            ControllerProcesses(config, store, 2, extra_routes=[object()])
    finally:
        store.close()


def test_restart_backoff_grows_only_for_quick_failures() -> None:
    assert [backoff_delay(n) for n in (1, 2, 3, 4, 20)] == [0.0, 0.5, 1.0, 2.0, 30.0]


LOCK_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def test_write_lock_waits_for_another_process_then_gives_up_as_locked(tmp_path: Path) -> None:
    path = tmp_path / "c.db.write-lock"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdin is not None
    try:
        assert holder.stdout.readline().strip() == "held"
        now = [0.0]
        slept: list[float] = []

        def sleep(seconds: float) -> None:  # a fake clock: the wait is simulated, nothing really sleeps
            slept.append(seconds)
            now[0] += seconds

        lock = WriteLock(path, timeout_s=0.01, sleep=sleep, monotonic=lambda: now[0])
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            lock.acquire()
        assert not lock.held and slept[:4] == [20e-6, 40e-6, 80e-6, 160e-6] and max(slept) == 1e-3
        holder.stdin.close()  # the other process lets go
        holder.wait(timeout=30)
        lock.acquire()
        assert lock.held
        other = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            lock.release()
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
        lock.close()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        holder.stdout.close()


def test_write_lock_helper_waits_in_the_kernel_and_hands_the_lock_over(tmp_path: Path) -> None:
    """wait_in_background: a helper thread blocks in flock until the other process lets go, then holds the lock
    for this process; the next try_acquire takes it over without the lock ever being free in between."""
    path = tmp_path / "c.db.write-lock"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdin is not None
    lock = WriteLock(path)
    other = os.open(path, os.O_RDWR)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert not lock.try_acquire()
        free = threading.Event()
        lock.wait_in_background(free.set)
        lock.wait_in_background(free.set)  # a second request while one is under way starts no second wait
        assert not free.is_set() and not lock.granted()
        holder.stdin.close()  # the other process lets go: the kernel wakes the helper
        holder.wait(timeout=30)
        assert free.wait(timeout=30)
        assert lock.granted() and not lock.held
        with pytest.raises(BlockingIOError):  # held for us by the helper: nobody else gets it
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert lock.try_acquire() and lock.held and lock.adopted == 1 and not lock.granted()
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.release()
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released for real
        # Busy again: the helper waits on its own descriptor, so it is not fooled by this process's own lock.
        again = threading.Event()
        assert not lock.try_acquire()
        lock.wait_in_background(again.set)
        fcntl.flock(other, fcntl.LOCK_UN)
        assert again.wait(timeout=30)
        lock.acquire()  # the blocking path takes a granted lock over as well
        assert lock.held and lock.adopted == 2
        lock.release()
    finally:
        os.close(other)
        lock.close()
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        holder.stdout.close()


def test_background_checkpoints_copy_the_wal_off_the_request_path(tmp_path: Path) -> None:
    """A checkpoint round copies the WAL while writers go on and finishes under the write lock, so the WAL
    starts over (SQLite only restarts a WAL that a checkpoint copied whole) instead of growing to the
    backstop; the background thread runs rounds until the store is closed."""
    db = tmp_path / "c.db"
    store = ControllerStore(db)
    iid = "p-0-ckpt0"
    store.register(iid, register_doc(iid))
    for k in range(100):
        store.add_event(iid, progress(k))
    lock_fd = os.open(f"{db}.write-lock", os.O_RDWR)
    try:
        store.checkpoint_round(lock_fd=lock_fd)
        assert store.write_lock is not None and store.write_lock.try_acquire()  # the round let go of the lock
        store.write_lock.release()
    finally:
        os.close(lock_fd)
    store.add_event(iid, progress(100))
    frames, copied = store.checkpoint() or (-1, -1)
    assert 0 < frames < 20 and copied == frames  # the WAL started over: one event's pages, not 101 events'
    store.checkpoint_in_background(interval_s=0.001)
    store.checkpoint_in_background()  # once only
    store.checkpointed.clear()
    assert store.checkpointed.wait(timeout=30)
    store.close()  # stops the thread
    reopened = ControllerStore(db)
    assert reopened.stats()["events"] == 101 and reopened.integrity_check() == ["ok"]
    reopened.close()


WRITER = """
import sys
from reconciler.adapters.store import ControllerStore
store = ControllerStore(sys.argv[1])
iid, first = sys.argv[2], int(sys.argv[3])
for k in range(first, first + 150):
    store.add_events(iid, [{"protocol": 1, "phase": "params", "status": "progress", "at": "2026-12-02T18:00:00Z",
                            "message": f"{k} of 56 GiB", "details": {}}])
store.close()
"""


def test_two_writer_processes_on_one_store_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    store = ControllerStore(db)
    iid = "p-0-writer0"
    store.register(iid, register_doc(iid))
    # Overlapping ranges: events 100..149 are sent by both processes and must be stored once.
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(db), iid, str(first)]) for first in (0, 100)]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    report = store.report(iid)
    assert report is not None
    assert sorted(int(e.message.split()[0]) for e in report.events if e.message) == list(range(250))
    assert store.integrity_check() == ["ok"]
    store.close()


def test_a_busy_write_lock_defers_the_flush_instead_of_blocking_the_loop(tmp_path: Path) -> None:
    """Another process holds the store's write lock: the report waits (the loop keeps answering others, here
    /healthz), is stored once the lock is free, and with no time left to wait it is answered 503."""
    db = tmp_path / "c.db"
    store = ControllerStore(db)
    processes = ControllerProcesses(ServeConfig(db, SECRET, ADMIN, log_level="WARNING"), store, 1).start()
    iid = "p-0-locked"
    holder = None
    try:
        assert post_fresh(processes.url, f"/api/v1/instances/{iid}/register", iid, register_doc(iid)).status_code == 200
        holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, f"{db}.write-lock"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "held"
        host, port = processes.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            body = json.dumps(progress(1)).encode()
            sock.sendall(f"POST /api/v1/instances/{iid}/events HTTP/1.1\r\nHost: x\r\nAuthorization: "
                         f"{auth(iid)['Authorization']}\r\nContent-Type: application/json\r\nContent-Length: "
                         f"{len(body)}\r\n\r\n".encode() + body)
            for _ in range(400):  # wait for the deferral on the socket itself: no answer may come meanwhile
                if processes.server.commits.deferred:
                    break
                assert not select.select([sock], [], [], 0.05)[0], "answered while another process held the lock"
            assert processes.server.commits.deferred > 0
            with httpx.Client(base_url=processes.url, timeout=10) as client:  # the loop is not blocked
                assert client.get("/healthz").status_code == 200
            holder.stdin.close()
            holder.wait(timeout=30)
            answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 OK"), answer
        assert store.stats()["events"] == 1
        # No time left to wait: 503, nothing stored.
        holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, f"{db}.write-lock"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        processes.server.commits.lock_timeout_s = 0.0
        refused = post_fresh(processes.url, f"/api/v1/instances/{iid}/events", iid, progress(2))
        assert refused.status_code == 503 and refused.json()["error"] == "store unavailable"
        assert store.stats()["events"] == 1
        # The helper thread still waits for the lock; when it gets it nobody wants it any more: it is let go.
        holder.stdin.close()
        holder.wait(timeout=30)
        processes.server.commits.lock_timeout_s = 10.0
        assert post_fresh(processes.url, f"/api/v1/instances/{iid}/events", iid, progress(3)).status_code == 200
        other = WriteLock(Path(f"{db}.write-lock"))
        other.acquire()  # another process can write: the controller holds no lock it does not use
        other.close()
        assert store.write_lock is not None and store.write_lock.adopted >= 1
    finally:
        if holder is not None:
            if holder.stdin is not None and not holder.stdin.closed:
                holder.stdin.close()
            holder.wait(timeout=30)
            if holder.stdout is not None:
                holder.stdout.close()
        processes.stop()
        store.close()

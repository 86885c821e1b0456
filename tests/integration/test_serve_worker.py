"""The serve phase of the real worker (worker-image/serve.sh via entrypoint.sh) against the real controller.

The controller (HTTP + SQLite) answers the directive; stand-in listeners on free 127.0.0.1 ports play the
proving cluster's Lotus API (HTTP JSON-RPC), YugabyteDB YSQL (Postgres SSLRequest -> 'N') and YCQL (CQL
OPTIONS -> SUPPORTED); a fake `ssh` on PATH really forwards `-L 127.0.0.1:LOCAL:HOST:PORT` (TCP relay), so
the worker's probes go through the forward to the service; a fake `nvidia-smi` prints the query CSV.
Checked: every forward is reported up, a dead service is noticed and its forward restarted (reported down,
then up again), heartbeats carry the daemon's counters and GPU temperature/clock in event batches, and a
`stop` directive ends serving cleanly. Waits are bounded and poll the store (no fixed sleeps).
"""

from __future__ import annotations

import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from reconciler.adapters.controller.server import ControllerServer
from reconciler.adapters.store.sqlite import SqliteStore
from tests.worker_support import (
    INSTANCE_ID,
    SECRET,
    ParamsMirror,
    WorkerProcess,
    sample_params,
    worker_env,
    write_fakes,
)

FAKE_SSH_FORWARDER = """#!{python}
# FAKE ssh for tests: honours `-L [bind:]LOCAL:HOST:PORT` by relaying TCP like ssh's local forward;
# logs each start. Other options are accepted and ignored.
import os, socket, sys, threading
args = sys.argv[1:]
with open(os.environ.get("FAKE_SSH_LOG", "/dev/null"), "a") as log:
    log.write(" ".join(args) + "\\n")
spec = args[args.index("-L") + 1].split(":")
bind, local, host, port = (spec if len(spec) == 4 else ["127.0.0.1", *spec])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((bind, int(local)))
server.listen(16)
def pump(a, b):
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
def serve(client):
    try:
        upstream = socket.create_connection((host, int(port)), timeout=5)
    except OSError:
        client.close()  # ssh accepts, then closes the channel when the far side refuses
        return
    threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
    pump(upstream, client)
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""

FAKE_NVIDIA_SMI = """#!/usr/bin/env bash
# FAKE nvidia-smi for tests: answers the worker's --query-gpu calls like one RTX 4090.
case "$*" in
  *temperature.gpu*) echo "0, 71, 2520, 2820, 305.12, 100" ;;
  *) echo "0, NVIDIA GeForce RTX 4090, 24564 MiB, 550.54.14, 00000000:01:00.0" ;;
esac
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Tcp(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


class StandInService:
    """One cluster service on 127.0.0.1:port answering its protocol's probe; can be stopped and restarted."""

    def __init__(self, kind: str, port: int | None = None) -> None:
        self.kind = kind
        self.port = port or free_port()
        self.server: socketserver.BaseServer | None = None

    def start(self) -> StandInService:
        if self.kind == "http":
            class Lotus(BaseHTTPRequestHandler):
                def log_message(self, format: str, *args: Any) -> None:
                    pass

                def do_POST(self) -> None:
                    self.rfile.read(int(self.headers.get("Content-Length") or 0))
                    body = b'{"jsonrpc":"2.0","result":{"Version":"1.28.0+mainnet"},"id":1}'
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            server: socketserver.BaseServer = ThreadingHTTPServer(("127.0.0.1", self.port), Lotus)
        else:
            answer = b"N" if self.kind == "pg" else bytes([0x84, 0, 0, 1, 6, 0, 0, 0, 2, 0, 0])
            expect = 8 if self.kind == "pg" else 9

            class Db(socketserver.BaseRequestHandler):
                def handle(self) -> None:
                    got = b""
                    while len(got) < expect and (chunk := self.request.recv(expect - len(got))):
                        got += chunk
                    self.request.sendall(answer)

            server = _Tcp(("127.0.0.1", self.port), Db)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        self.server = server
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


@pytest.fixture
def services() -> Iterator[dict[str, StandInService]]:
    found = {"lotus": StandInService("http").start(), "yb": StandInService("pg").start(),
             "cql": StandInService("cql").start()}
    yield found
    for s in found.values():
        s.stop()


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[tuple[SqliteStore, ControllerServer]]:
    store = SqliteStore(tmp_path / "controller.db")
    server = ControllerServer(store, SECRET, "admin-token-0123456789abcdef", require_machine_claim=True).start()
    yield store, server
    server.stop()
    store.close()


def serve_events(store: SqliteStore) -> list[Any]:
    reports = [r for r in store.reports() if r.instance_id == INSTANCE_ID]
    return [e for e in reports[0].events if e.phase == "serve"] if reports else []


def wait_for(what: str, predicate: Callable[[], bool], worker: WorkerProcess, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        if worker.poll() is not None:
            break
        time.sleep(0.1)
    assert predicate(), f"{what}: not within {timeout_s:.0f}s\n" + worker.out_path.read_text(errors="replace")[-5000:]


def forward_states(store: SqliteStore, name: str) -> list[str]:
    return [e.details["forward"]["state"] for e in serve_events(store)
            if isinstance(e.details.get("forward"), dict) and e.details["forward"]["name"] == name]


def test_serving_keeps_health_checked_forwards_and_sends_heartbeats(
        tmp_path: Path, services: dict[str, StandInService],
        controller: tuple[SqliteStore, ControllerServer]) -> None:
    store, server = controller
    write_fakes(tmp_path / "bin", ssh=False)
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "ssh").write_text(FAKE_SSH_FORWARDER.replace("{python}", sys.executable))
    (fakes / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    # curio as the serve command: it records the node name it runs under, then plays the proving load.
    (fakes / "curio-run").write_text(f'#!/usr/bin/env bash\necho "$CURIO_NODE_NAME" > {tmp_path / "node-name"}\n'
                                     'exec proving-load "$@"\n')
    for f in fakes.iterdir():
        f.chmod(0o755)
    local = {name: free_port() for name in services}
    forwards = " ".join(f"{name}={local[name]}:127.0.0.1:{svc.port}" for name, svc in services.items())
    store.set_directives({INSTANCE_ID: {"protocol": 1, "action": "serve", "verdict": "ok",
                                        "reason": "ok: 50.0/h >= 40/h", "heartbeat_s": 0.5}},
                         store.clock())
    mirror = ParamsMirror(sample_params()).start()
    env = worker_env(tmp_path, server.url, mirror.url, FLEET_AFTER_BENCH="serve", FLEET_FORWARDS=forwards,
                     FLEET_TUNNEL_SSH="fleet@bastion.invalid", FLEET_FORWARD_CHECK_S="0.3",
                     FLEET_FORWARD_RETRY_S="0.3", FLEET_FORWARD_FAILURES="2", FLEET_DIRECTIVE_POLL_S="0.3",
                     FLEET_SERVE_CMD="curio-run", STANDIN_SERVE_SECONDS_PER_PROOF="0.1",
                     FAKE_SSH_LOG=str(tmp_path / "forward.log"))
    env["PATH"] = f"{fakes}:{env['PATH']}"
    worker = WorkerProcess(env, tmp_path / "run")
    try:
        wait_for("every forward up", lambda: all("up" in forward_states(store, n) for n in services), worker)
        wait_for("heartbeats with proofs", lambda: sum(
            1 for e in serve_events(store) if (e.details.get("heartbeat") or {}).get("completed")) >= 2, worker)
        beats = [e.details["heartbeat"] for e in serve_events(store) if "heartbeat" in e.details]
        assert beats[-1]["busy"] is True and beats[-1]["completed_total"] >= beats[-1]["completed"] > 0
        assert beats[-1]["gpus"] == [{"index": 0, "temperature_c": 71, "sm_clock_mhz": 2520,
                                      "max_sm_clock_mhz": 2820, "power_w": 305.12, "utilization_pct": 100}]
        assert beats[-1]["recent_proof_s"] is not None and beats[-1]["interval_s"] > 0
        # curio's node runs under the instance id: its Snark Market runs name this machine (docs/capacity.md).
        assert (tmp_path / "node-name").read_text().strip() == INSTANCE_ID
        # The database goes away: its forward is found dead (probe through it), restarted, and up again.
        port = services["yb"].port
        services["yb"].stop()
        wait_for("yb forward reported down", lambda: "down" in forward_states(store, "yb"), worker)
        services["yb"] = StandInService("pg", port).start()
        wait_for("yb forward up again", lambda: forward_states(store, "yb")[-1] == "up", worker)
        assert forward_states(store, "lotus") == ["up"]  # the others were never disturbed
        starts = (tmp_path / "forward.log").read_text().splitlines()
        assert sum(f":{local['yb']}:" in line for line in starts) >= 2
        # The reconciler decides the machine degraded: the directive says stop, the worker stops serving.
        store.set_directives({INSTANCE_ID: {"protocol": 1, "action": "stop", "verdict": "degraded",
                                            "reason": "degraded: serving: 20.0/h < 36.0/h"}}, store.clock())
        wait_for("worker exits", lambda: worker.poll() is not None, worker, timeout_s=60)
    finally:
        proc = worker.finish(timeout_s=30)
        mirror.stop()
    assert proc.returncode == 0, proc.stdout[-4000:]
    done = [e for e in serve_events(store) if e.status == "done"]
    assert done and done[-1].message == "stopped by the controller: degraded: degraded: serving: 20.0/h < 36.0/h"
    started = next(e for e in serve_events(store) if e.status == "started")
    assert started.details["verdict"] == "serve" and len(started.details["forwards"]) == 3


def test_a_stop_verdict_means_no_serving(tmp_path: Path,
                                         controller: tuple[SqliteStore, ControllerServer]) -> None:
    store, server = controller
    write_fakes(tmp_path / "bin", ssh=False)
    mirror = ParamsMirror(sample_params()).start()
    env = worker_env(tmp_path, server.url, mirror.url, FLEET_AFTER_BENCH="serve", FLEET_DIRECTIVE_POLL_S="0.2")
    worker = WorkerProcess(env, tmp_path / "run")
    try:
        # No directive yet: the worker benchmarks, reports, then waits for its verdict.
        wait_for("result reported", lambda: any(
            e.phase == "report" and e.status == "done" for r in store.reports() for e in r.events), worker)
        assert worker.poll() is None
        store.set_directives({INSTANCE_ID: {"protocol": 1, "action": "stop", "verdict": "below-min-rate",
                                            "reason": "below-min-rate: 20.0/h < 40/h"}}, store.clock())
        wait_for("worker exits", lambda: worker.poll() is not None, worker, timeout_s=90)
    finally:
        proc = worker.finish(timeout_s=30)
        mirror.stop()
    assert proc.returncode == 0, proc.stdout[-4000:]
    (done,) = [e for e in serve_events(store) if e.status == "done"]
    assert done.message == "not serving: controller verdict below-min-rate: below-min-rate: 20.0/h < 40/h"
    assert not [e for e in serve_events(store) if e.status == "started"]


def test_a_stop_directive_during_the_benchmark_ends_it_early(
        tmp_path: Path, controller: tuple[SqliteStore, ControllerServer]) -> None:
    store, server = controller
    write_fakes(tmp_path / "bin", ssh=False)
    mirror = ParamsMirror(sample_params()).start()
    # 50 proofs of 0.4 s: 20 s of benchmark unless the controller ends it.
    env = worker_env(tmp_path, server.url, mirror.url, FLEET_AFTER_BENCH="serve", FLEET_DIRECTIVE_POLL_S="0.2",
                     FLEET_BENCH_PROOFS="50", STANDIN_SECONDS_PER_PROOF="0.4")
    worker = WorkerProcess(env, tmp_path / "run")
    try:
        wait_for("benchmark started", lambda: any(
            e.phase == "benchmark" and e.status == "started" for r in store.reports() for e in r.events), worker)
        store.set_directives({INSTANCE_ID: {"protocol": 1, "action": "stop", "verdict": "early-below-min-rate",
                                            "reason": "best case 20.0/h < 40/h"}}, store.clock())
        wait_for("worker exits", lambda: worker.poll() is not None, worker, timeout_s=60)
    finally:
        proc = worker.finish(timeout_s=30)
        mirror.stop()
    assert proc.returncode == 0, proc.stdout[-4000:]
    (report,) = store.reports()
    done = [e for e in report.events if e.phase == "benchmark" and e.status == "done"]
    assert done and done[-1].message == ("ended early by the controller: early-below-min-rate: best case 20.0/h "
                                         "< 40/h")
    assert report.result is None and not [e for e in report.events if e.status == "failed"]
    assert "[50/50]" not in proc.stdout  # it did not run to the end


def test_a_drain_directive_finishes_the_proof_in_progress_takes_no_new_work_then_stops(
        tmp_path: Path, controller: tuple[SqliteStore, ControllerServer]) -> None:
    """Capacity shrinks the pool: `drain` cordons the cluster's client (the proving-load stand-in plays
    `curio cli cordon`), the daemon finishes the proof it holds, and only then does the worker stop."""
    store, server = controller
    write_fakes(tmp_path / "bin", ssh=False)
    store.set_directives({INSTANCE_ID: {"protocol": 1, "action": "serve", "verdict": "ok",
                                        "reason": "ok: 50.0/h >= 40/h", "heartbeat_s": 0.3}}, store.clock())
    mirror = ParamsMirror(sample_params()).start()
    env = worker_env(tmp_path, server.url, mirror.url, FLEET_AFTER_BENCH="serve", FLEET_DIRECTIVE_POLL_S="0.2",
                     FLEET_SERVE_CMD="proving-load", FLEET_DRAIN_CMD="proving-load cordon",
                     STANDIN_SERVE_SECONDS_PER_PROOF="1.5")
    worker = WorkerProcess(env, tmp_path / "run")
    served = tmp_path / "standin"
    try:
        wait_for("a served proof", lambda: any(
            (e.details.get("heartbeat") or {}).get("completed") for e in serve_events(store)), worker)
        store.set_directives({INSTANCE_ID: {"protocol": 1, "action": "drain", "reason": "capacity: pool rtx4090 "
                                            "3 -> 2 (utilization 0.31 for 30 min; no task waiting)"}},
                             store.clock())
        wait_for("worker exits", lambda: worker.poll() is not None, worker, timeout_s=60)
    finally:
        proc = worker.finish(timeout_s=30)
        mirror.stop()
    assert proc.returncode == 0, proc.stdout[-4000:]
    events = serve_events(store)
    (drain,) = [e for e in events if (e.details.get("drain") or {}).get("state") == "started"]
    assert drain.details["drain"]["how"] == "ran 'proving-load cordon'"
    done = [e for e in events if e.status == "done"]
    assert done[-1].message == ("drained: no proofs left in progress (capacity: pool rtx4090 3 -> 2 (utilization "
                                "0.31 for 30 min; no task waiting))")
    # The proof in progress when the drain began was finished (COMPLETED after the drain started), and no
    # proof was begun after it: the daemon was idle when the worker stopped.
    (served_file,) = served.glob("daemon-*.served")
    proofs = [line.split() for line in served_file.read_text().splitlines()]
    assert all(label == "COMPLETED" for _, _, label in proofs)
    drain_epoch = int((drain.worker_at or drain.at).timestamp())
    after = [p for p in proofs if int(p[0]) >= drain_epoch]
    assert 1 <= len(after) <= 2, (drain_epoch, proofs)  # the one in progress (its second may equal the drain's)
    last = [e.details["heartbeat"] for e in events if "heartbeat" in e.details][-1]
    assert last["busy"] is False


def test_a_serve_directive_while_draining_resumes_work(
        tmp_path: Path, controller: tuple[SqliteStore, ControllerServer]) -> None:
    """The pool grows again before the drain finished: `serve` uncordons the client and proving goes on."""
    store, server = controller
    write_fakes(tmp_path / "bin", ssh=False)
    store.set_directives({INSTANCE_ID: {"protocol": 1, "action": "serve", "verdict": "ok",
                                        "reason": "ok: 50.0/h >= 40/h", "heartbeat_s": 0.3}}, store.clock())
    mirror = ParamsMirror(sample_params()).start()
    env = worker_env(tmp_path, server.url, mirror.url, FLEET_AFTER_BENCH="serve", FLEET_DIRECTIVE_POLL_S="0.2",
                     FLEET_SERVE_CMD="proving-load", FLEET_DRAIN_CMD="proving-load cordon",
                     FLEET_UNDRAIN_CMD="proving-load uncordon", STANDIN_SERVE_SECONDS_PER_PROOF="8")
    worker = WorkerProcess(env, tmp_path / "run")

    def drain_states() -> list[str]:
        return [e.details["drain"]["state"] for e in serve_events(store) if isinstance(e.details.get("drain"), dict)]

    try:
        wait_for("a proof in progress", lambda: any(
            (e.details.get("heartbeat") or {}).get("busy") for e in serve_events(store)), worker)
        store.set_directives({INSTANCE_ID: {"protocol": 1, "action": "drain", "reason": "capacity: 3 -> 2"}},
                             store.clock())
        wait_for("draining", lambda: "started" in drain_states(), worker)
        # The proof in progress (8 s) is not done yet: the pool grows again.
        store.set_directives({INSTANCE_ID: {"protocol": 1, "action": "serve", "verdict": "ok",
                                            "reason": "ok: 50.0/h >= 40/h", "heartbeat_s": 0.3}}, store.clock())
        wait_for("drain cancelled", lambda: drain_states()[-1:] == ["cancelled"], worker)
        assert worker.poll() is None  # it did not stop
        def proofs() -> int:
            return sum(len(f.read_text().splitlines()) for f in (tmp_path / "standin").glob("daemon-*.served"))

        before = proofs()
        # The proof in progress finishes and another one starts and finishes: the client took new work again.
        wait_for("proving again after the cancel", lambda: proofs() >= before + 2, worker, timeout_s=60)
        store.set_directives({INSTANCE_ID: {"protocol": 1, "action": "stop", "verdict": "degraded",
                                            "reason": "degraded"}}, store.clock())
        wait_for("worker exits", lambda: worker.poll() is not None, worker, timeout_s=60)
    finally:
        proc = worker.finish(timeout_s=30)
        mirror.stop()
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert not [e for e in serve_events(store) if e.status == "done" and (e.message or "").startswith("drained")]

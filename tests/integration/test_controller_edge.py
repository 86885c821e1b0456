"""The controller's HTTP edge (uvicorn + Starlette) over real sockets on 127.0.0.1: slow and idle clients do
not lock workers out, head and body deadlines, the cap on unauthenticated connections, a real listen backlog,
TLS, and the extension point for extra routes. No sleeps: waits are socket waits with bounded loops."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from reconciler.adapters.controller.server import ControllerServer, EdgeLimits
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.domain.tokens import instance_token
from tests.controller_support import ADMIN, ADMIN_AUTH, SECRET, StepClock, auth, register_doc, stop_serving

SLOW_HEAD = b"POST /api/v1/instances/p-0-slow00/logs HTTP/1.1\r\nHost: x\r\n"


class Edge:
    """A controller with chosen edge limits over a fresh store."""

    def __init__(self, path: Path, limits: EdgeLimits, **options: object):
        self.store = SqliteStore(path, now=StepClock())
        self.server = ControllerServer(self.store, SECRET, ADMIN, "127.0.0.1", 0, limits=limits,
                                       **options).start()  # type: ignore[arg-type]
        host, port = self.server.url.rsplit("/", 1)[1].split(":")
        self.address = (host, int(port))

    def close(self) -> None:
        self.server.stop()
        self.store.close()


@pytest.fixture
def tmp_db(tmp_path: Path) -> Path:
    return tmp_path / "c.db"


def open_slow(address: tuple[str, int], n: int) -> list[socket.socket]:
    """n connections that each sent the start of a request head and nothing more (slowloris)."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(address, timeout=10)
        s.sendall(SLOW_HEAD)
        socks.append(s)
    return socks


def trickle(socks: list[socket.socket], k: int) -> None:
    """One more header byte on each still-open slow connection."""
    for s in socks:
        with contextlib.suppress(OSError):  # closed by the server (evicted): that is the point
            s.send(b"X-Slow-%d: a\r\n" % k)


def still_open(s: socket.socket) -> bool:
    """True when the server has neither closed nor answered this connection (no data, no EOF)."""
    readable, _, _ = select.select([s], [], [], 0)
    if not readable:
        return True
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except OSError:
        return False


def worker_round(url: str, iid: str, n: int) -> list[int]:
    """n authenticated log posts, each on a fresh connection (as curl in the worker does)."""
    statuses = []
    for i in range(n):
        with httpx.Client(base_url=url, timeout=10) as client:
            r = client.post(f"/api/v1/instances/{iid}/logs", json={"protocol": 1, "lines": [f"line {i}"]},
                            headers=auth(iid))
            statuses.append(r.status_code)
    return statuses


def test_256_slow_unauthenticated_connections_do_not_lock_workers_out(tmp_db: Path) -> None:
    # Deadlines out of the picture, and every connection from one address allowed: only the total counts.
    edge = Edge(tmp_db, EdgeLimits(head_timeout_s=120, max_unauthenticated_per_address=1024))
    slow: list[socket.socket] = []
    try:
        with httpx.Client(base_url=edge.server.url, timeout=10) as client:
            assert client.post("/api/v1/instances/p-0-work00/register", json=register_doc("p-0-work00"),
                               headers=auth("p-0-work00")).status_code == 200
        slow = open_slow(edge.address, 256)
        for k in range(3):
            trickle(slow, k)
            assert worker_round(edge.server.url, "p-0-work00", 5) == [200] * 5
        assert sum(still_open(s) for s in slow) == 256  # the attack is in place, and workers were served
        assert len(edge.server.guard) == 256
        assert edge.store.tail("p-0-work00", 100) == [f"line {i}" for i in range(5)] * 3
    finally:
        for s in slow:
            s.close()
        edge.close()


def test_at_the_cap_the_oldest_unauthenticated_connection_makes_room(tmp_db: Path) -> None:
    edge = Edge(tmp_db, EdgeLimits(head_timeout_s=120, max_unauthenticated=64, max_unauthenticated_per_address=1024))
    slow: list[socket.socket] = []
    try:
        with httpx.Client(base_url=edge.server.url, timeout=10) as keeper:
            # An authenticated keep-alive connection is never evicted, however many slow ones arrive.
            assert keeper.post("/api/v1/instances/p-0-work00/register", json=register_doc("p-0-work00"),
                               headers=auth("p-0-work00")).status_code == 200
            slow = open_slow(edge.address, 256)
            trickle(slow, 0)
            assert worker_round(edge.server.url, "p-0-work00", 10) == [200] * 10
            r = keeper.post("/api/v1/instances/p-0-work00/logs", json={"protocol": 1, "lines": ["kept"]},
                            headers=auth("p-0-work00"))
            assert r.status_code == 200
            assert keeper.get("/api/instances", headers=ADMIN_AUTH).status_code == 200
        assert edge.server.guard.peak <= 64
        assert edge.server.guard.evicted >= 256 - 64
        open_now = sum(still_open(s) for s in slow)
        assert 0 < open_now <= 64
        assert not still_open(slow[0])  # the oldest went first
    finally:
        for s in slow:
            s.close()
        edge.close()


def read_reply(s: socket.socket, timeout_s: float = 10.0) -> bytes:
    s.settimeout(timeout_s)
    chunks = []
    while chunk := s.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_head_that_trickles_in_is_cut_at_the_head_deadline(tmp_db: Path) -> None:
    edge = Edge(tmp_db, EdgeLimits(head_timeout_s=0.3))
    try:
        with socket.create_connection(edge.address, timeout=10) as s:
            s.sendall(SLOW_HEAD)
            answered = False
            for _ in range(400):  # one header byte every 50 ms (a socket wait), far past the 0.3 s deadline
                readable, _, _ = select.select([s], [], [], 0.05)
                if readable:
                    answered = True
                    break
                s.send(b"X")
            assert answered, "the server never cut the trickling head"
            reply = read_reply(s)
        assert reply.startswith(b"HTTP/1.1 408 ")
        assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"] == "request timeout"
        # A connection that sends nothing at all is closed at the same deadline.
        with socket.create_connection(edge.address, timeout=10) as idle:
            assert read_reply(idle) == b""
    finally:
        edge.close()


def test_a_body_that_does_not_arrive_in_time_is_408_and_stores_nothing(tmp_db: Path) -> None:
    edge = Edge(tmp_db, EdgeLimits(body_timeout_s=0.3))
    try:
        iid = "p-0-body00"
        with httpx.Client(base_url=edge.server.url, timeout=10) as client:
            assert client.post(f"/api/v1/instances/{iid}/register", json=register_doc(iid),
                               headers=auth(iid)).status_code == 200
        before = edge.store.stats()
        with socket.create_connection(edge.address, timeout=10) as s:
            s.sendall((f"POST /api/v1/instances/{iid}/logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                       f"{instance_token(SECRET, iid)}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n"
                       "\r\n{\"protocol\": 1,").encode())
            reply = read_reply(s)
        assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]
        assert b"body not received" in reply
        assert edge.store.stats() == before
    finally:
        edge.close()


def test_the_listen_backlog_queues_a_burst_while_the_server_is_busy(tmp_db: Path) -> None:
    """With the event loop blocked, 400 connections wait in the kernel's accept queue (socketserver's
    backlog of 5 would have left all but a handful unanswered), and every one is served afterwards."""
    edge = Edge(tmp_db, EdgeLimits())
    iid = "p-0-back00"
    socks: list[socket.socket] = []
    try:
        with httpx.Client(base_url=edge.server.url, timeout=10) as client:
            assert client.post(f"/api/v1/instances/{iid}/register", json=register_doc(iid),
                               headers=auth(iid)).status_code == 200
        blocker = socket.create_connection(edge.address, timeout=10)
        body = b'{"protocol": 1, "lines": ["x"]}'
        with edge.store._lock:  # the next store write blocks the server's event loop: it accepts nothing
            blocker.sendall((f"POST /api/v1/instances/{iid}/logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                             f"{instance_token(SECRET, iid)}\r\nContent-Type: application/json\r\nConnection: close\r\n"
                             f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
            for _ in range(400):
                s = socket.socket()
                s.settimeout(5)
                s.connect(edge.address)  # completes only if the kernel queues it (backlog)
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                socks.append(s)
        replies = [read_reply(s) for s in socks]
        assert all(r.startswith(b"HTTP/1.1 200 ") for r in replies), [r[:40] for r in replies if b" 200 " not in r][:3]
        assert read_reply(blocker).startswith(b"HTTP/1.1 200 ")
        blocker.close()
    finally:
        for s in socks:
            s.close()
        edge.close()


def test_tls_serves_the_api_and_refuses_plain_http(tmp_db: Path, tmp_path: Path) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    for pem in cert.cert_chain_pems[1:]:
        pem.write_to_path(str(cert_file), append=True)
    cert.private_key_pem.write_to_path(str(key_file))
    edge = Edge(tmp_db, EdgeLimits(), tls_cert=cert_file, tls_key=key_file)
    try:
        assert edge.server.url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context()
        ca.configure_trust(context)
        with httpx.Client(base_url=edge.server.url, timeout=10, verify=context) as client:
            iid = "p-0-tls000"
            assert client.post(f"/api/v1/instances/{iid}/register", json=register_doc(iid),
                               headers=auth(iid)).status_code == 200
            assert client.get("/api/instances", headers=ADMIN_AUTH).json()["instances"][0]["instance_id"] == iid
        with pytest.raises(httpx.HTTPError), httpx.Client(timeout=5) as plain:
            plain.get(edge.server.url.replace("https://", "http://") + "/healthz")
    finally:
        edge.close()
    with pytest.raises(ValueError, match="cannot use TLS certificate"):
        ControllerServer(edge.store, SECRET, ADMIN, tls_cert=key_file, tls_key=cert_file)


def test_extra_routes_are_served_before_the_api(tmp_db: Path) -> None:
    def live(request: Request) -> PlainTextResponse:
        return PlainTextResponse("live page")

    edge = Edge(tmp_db, EdgeLimits(), extra_routes=[Route("/", live), Route("/metrics", live)])
    try:
        with httpx.Client(base_url=edge.server.url, timeout=10) as client:
            assert client.get("/").text == "live page"
            assert client.get("/metrics").text == "live page"
            assert client.get("/healthz").json()["status"] == "ok"
            r = client.get("/nope")
            assert (r.status_code, r.json()["error"]) == (404, "not found")
    finally:
        edge.close()


@pytest.fixture
def edge(tmp_db: Path) -> Iterator[Edge]:
    e = Edge(tmp_db, EdgeLimits())
    yield e
    e.close()


def test_oversized_heads_are_431_with_json(edge: Edge) -> None:
    with socket.create_connection(edge.address, timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"a" * 60000) for i in range(3)))
        reply = read_reply(s)
    assert reply.startswith(b"HTTP/1.1 431 ")
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]


def write_tls_files(tmp_path: Path) -> tuple[object, Path, Path]:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(b"".join(pem.bytes() for pem in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(key_file))
    return ca, cert_file, key_file


def test_fleet_controller_serve_with_tls_flags(tmp_path: Path) -> None:
    ca, cert_file, key_file = write_tls_files(tmp_path)
    env = {**os.environ, "FLEET_CONTROLLER_SECRET": SECRET.decode(), "FLEET_ADMIN_TOKEN": ADMIN}
    serve = [sys.executable, "-m", "reconciler.cli", "controller", "serve", "--db", str(tmp_path / "c.db"),
             "--port", "0", "--log-level", "warning"]
    half = subprocess.run([*serve, "--tls-cert", str(cert_file)], capture_output=True, text=True, env=env, timeout=60)
    assert half.returncode == 2 and "--tls-cert and --tls-key go together" in half.stderr
    swapped = subprocess.run([*serve, "--tls-cert", str(key_file), "--tls-key", str(cert_file)],
                             capture_output=True, text=True, env=env, timeout=60)
    assert swapped.returncode == 2 and "cannot use TLS certificate" in swapped.stderr
    assert str(key_file) in swapped.stderr
    proc = subprocess.Popen([*serve, "--tls-cert", str(cert_file), "--tls-key", str(key_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("controller listening on https://127.0.0.1:"), line
        url = line.split()[3]
        context = ssl.create_default_context()
        ca.configure_trust(context)  # type: ignore[attr-defined]
        with httpx.Client(base_url=url, timeout=10, verify=context) as client:
            assert client.post("/api/v1/instances/p-0-tls001/register", json=register_doc("p-0-tls001"),
                               headers=auth("p-0-tls001")).status_code == 200
    finally:
        stop_serving(proc)


def test_fleet_reconcile_refuses_tls_flags_without_listen(tmp_path: Path) -> None:
    _, cert_file, key_file = write_tls_files(tmp_path)
    done = subprocess.run([sys.executable, "-m", "reconciler.cli", "reconcile", "--repo", str(tmp_path / "r"),
                           "--workdir", str(tmp_path / "w"), "--controller-db", str(tmp_path / "c.db"), "--once",
                           "--tls-cert", str(cert_file), "--tls-key", str(key_file)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "needs --listen" in done.stderr


def test_fleet_reconcile_listen_serves_https_with_the_tls_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from reconciler.cli import main
    from tests.gitrepos import make_origin
    from tests.scenarios import SPEC_YAML

    _, cert_file, key_file = write_tls_files(tmp_path)
    origin, _ = make_origin(tmp_path, {"fleet-spec/fleet.yaml": SPEC_YAML})
    monkeypatch.setenv("FLEET_CONTROLLER_SECRET", SECRET.decode())
    argv = ["reconcile", "--repo", str(origin), "--workdir", str(tmp_path / "w"), "--controller-db",
            str(tmp_path / "c.db"), "--once", "--listen", "127.0.0.1:0"]
    assert main([*argv, "--tls-cert", str(cert_file), "--tls-key", str(key_file)]) == 0
    assert "controller listening on https://127.0.0.1:" in capsys.readouterr().out
    assert main([*argv, "--tls-cert", str(key_file), "--tls-key", str(cert_file)]) == 2
    assert "cannot use TLS certificate" in capsys.readouterr().err

"""Controller API over real HTTP on 127.0.0.1: every endpoint's success path lands in the store as the right
InstanceReport; every rejection (token, size, JSON, schema, unknown instance) is a clear 4xx that stores
nothing; logs stay readable after destroy; restarts and SIGKILL mid-ingest lose no acknowledged report;
fuzzed bodies and paths never produce a 5xx or a stray row."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.adapters.controller.protocol import MAX_BODY_BYTES, _protocol_validator, fast_valid
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.domain.observations import BenchmarkResult, PhaseEvent
from reconciler.domain.tokens import instance_token
from tests.controller_support import (
    ADMIN,
    ADMIN_AUTH,
    DIGEST,
    SECRET,
    T0,
    Harness,
    auth,
    raw_exchange,
    register_doc,
    stop_serving,
)

VAST_KEY = "3f1c9a0e7b2d4c6a8e0f1b3d5c7a9e2f4b6d8c0a1e3f5b7d9c2a4e6f8b0d1c3a"
RESULT = {"protocol": 1, "outcome": "completed", "at": "2026-12-02T18:40:00Z", "started_at": "2026-12-02T18:20:00Z",
          "exit_code": 0, "requested": 10, "completed": 10, "failed": 0, "proofs_per_hour": 94.7,
          "seconds_per_proof": 38.0, "proof_type": "porep", "concurrency": 2, "image_digest": DIGEST,
          "log_tail": ["=== Batch Summary ===", "throughput:    1.579 proofs/min (38.0s/proof)"]}


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path / "controller.db")
    yield harness
    harness.close()


def assert_error(response: httpx.Response, status: int, error: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["error"] == error, body
    return body


# --- success paths ------------------------------------------------------------------------------------


def test_worker_lifecycle_over_http_becomes_the_instance_report(h: Harness) -> None:
    iid = "rtx4090-0-3f9a1c"
    r = h.post(iid, "register", register_doc(iid))
    assert (r.status_code, r.json()) == (200, {"status": "registered"})
    for phase, status, at in [("params", "started", "18:00:10"), ("params", "done", "18:10:00"),
                              ("benchmark", "started", "18:20:00")]:
        r = h.post(iid, "events", {"protocol": 1, "phase": phase, "status": status, "at": f"2026-12-02T{at}Z"})
        assert (r.status_code, r.json()) == (200, {"status": "stored"})
    r = h.post(iid, "events", {"protocol": 1, "phase": "benchmark", "status": "progress", "at": "2026-12-02T18:30:00Z",
                               "details": {"completed": 5, "failed": 0, "requested": 10}})
    assert r.status_code == 200
    r = h.post(iid, "logs", {"protocol": 1, "lines": ["  [1/10] ok — 38.1s", f"VAST_API_KEY={VAST_KEY}"], "dropped": 4})
    assert (r.status_code, r.json()) == (200, {"status": "stored", "lines": 2, "evicted": 0})
    r = h.post(iid, "result", RESULT)
    assert (r.status_code, r.json()) == (200, {"status": "stored"})

    [report] = h.store.reports()
    assert report.instance_id == iid and report.registered_at == T0 + timedelta(seconds=1)
    assert (report.pool, report.slot, report.machine_id, report.host_id, report.gpu_name, report.image_digest) == (
        "rtx4090", "rtx4090-0", "4242", "77", "RTX 4090", DIGEST)
    assert [(e.phase, e.status) for e in report.events] == [
        ("params", "started"), ("params", "done"), ("benchmark", "started"), ("benchmark", "progress")]
    # One clock: times are arrivals on the controller's clock (StepClock, +1 s per store write); the worker's
    # own times are kept as evidence and its skew is known.
    assert report.events[3] == PhaseEvent("benchmark", "progress", T0 + timedelta(seconds=5),
                                          details={"completed": 5, "failed": 0, "requested": 10},
                                          worker_at=datetime(2026, 12, 2, 18, 30, tzinfo=UTC))
    received = T0 + timedelta(seconds=6)
    shift = datetime(2026, 12, 2, 18, 40, tzinfo=UTC) - received
    assert report.result == BenchmarkResult(
        outcome="completed", at=received, requested=10, completed=10, failed=0,
        started_at=datetime(2026, 12, 2, 18, 20, tzinfo=UTC) - shift, exit_code=0, proofs_per_hour=94.7,
        seconds_per_proof=38.0, proof_type="porep", concurrency=2, image_digest=DIGEST,
        log_tail=tuple(RESULT["log_tail"]), worker_at=datetime(2026, 12, 2, 18, 40, tzinfo=UTC))
    assert report.clock_skew_s == shift.total_seconds()
    assert report.log_tail == ("  [1/10] ok — 38.1s", "VAST_API_KEY=[REDACTED]")
    assert report.dropped_log_lines == 4

    # Read API (admin token).
    listing = h.client.get("/api/instances", headers=ADMIN_AUTH).json()["instances"]
    assert [(i["instance_id"], i["last_event"]["status"], i["result"]["proofs_per_hour"]) for i in listing] == [
        (iid, "progress", 94.7)]
    detail = h.client.get(f"/api/instances/{iid}", headers=ADMIN_AUTH).json()
    assert detail["timeline"] == {"registered": "2026-12-02T18:00:01Z", "params-started": "2026-12-02T18:00:02Z",
                                  "params-done": "2026-12-02T18:00:03Z", "benchmark-started": "2026-12-02T18:00:04Z",
                                  "benchmark-progress": "2026-12-02T18:00:05Z", "result": "2026-12-02T18:00:06Z"}
    assert detail["clock"] == "controller" and detail["worker_clock_skew_s"] == shift.total_seconds()
    assert [e["worker_at"] for e in detail["events"]] == ["2026-12-02T18:00:10Z", "2026-12-02T18:10:00Z",
                                                        "2026-12-02T18:20:00Z", "2026-12-02T18:30:00Z"]
    assert detail["worker_registered_at"] == "2026-12-02T17:59:30Z" and detail["worker_dropped"] == 4
    assert detail["result"]["outcome"] == "completed" and detail["gpus"] == ["NVIDIA GeForce RTX 4090, 24564 MiB"]
    logs = h.client.get(f"/api/instance-logs/{iid}?tail=1", headers=ADMIN_AUTH).json()
    assert logs == {"instance_id": iid, "lines": ["VAST_API_KEY=[REDACTED]"], "dropped": 4, "destroyed_at": None}
    # Alive to anyone; what the fleet holds only with the admin token.
    assert h.client.get("/healthz").json() == {"status": "ok"}
    assert h.client.get("/healthz", headers=ADMIN_AUTH).json() == {"status": "ok", "instances": 1}
    assert h.client.get("/healthz", headers=auth(iid)).status_code == 403


def test_logs_are_readable_after_destroy_and_the_token_stops_writing(h: Harness) -> None:
    iid = "p-0-aaaaaa"
    h.register(iid)
    h.post(iid, "logs", {"protocol": 1, "lines": [f"line {i}" for i in range(300)]})
    assert_error(h.client.post(f"/api/v1/instances/{iid}/destroyed", headers=auth(iid)), 403, "forbidden")
    r = h.client.post(f"/api/v1/instances/{iid}/destroyed", headers=ADMIN_AUTH)
    assert r.status_code == 200 and r.json()["status"] == "destroyed"
    before = h.store.stats()
    body = assert_error(h.post(iid, "logs", {"protocol": 1, "lines": ["late"]}), 410, "instance destroyed")
    assert "destroyed at" in body["detail"]
    assert h.store.stats() == before
    logs = h.client.get(f"/api/instance-logs/{iid}", params={"tail": 3}, headers=ADMIN_AUTH).json()
    assert logs["lines"] == ["line 297", "line 298", "line 299"] and logs["destroyed_at"] is not None
    assert len(h.client.get(f"/api/instance-logs/{iid}", headers=ADMIN_AUTH).json()["lines"]) == 200  # default
    assert_error(h.client.post("/api/v1/instances/never-seen/destroyed", headers=ADMIN_AUTH), 404, "unknown instance")


def test_replays_register_and_result_are_idempotent(h: Harness) -> None:
    iid = "p-0-bbbbbb"
    h.register(iid)
    r = h.post(iid, "register", register_doc(iid))
    assert (r.status_code, r.json()["status"]) == (200, "already-registered")
    event = {"protocol": 1, "phase": "daemon", "status": "failed", "at": "2026-12-02T18:05:00Z", "exit_code": 127,
             "log_tail": ["entrypoint.sh: line 12: cuzk-daemon: command not found"]}
    assert h.post(iid, "events", event).json()["status"] == "stored"
    assert h.post(iid, "events", event).json()["status"] == "duplicate"
    assert h.post(iid, "result", RESULT).json()["status"] == "stored"
    assert h.post(iid, "result", RESULT).json()["status"] == "duplicate"
    before = h.store.stats()
    body = assert_error(h.post(iid, "result", {**RESULT, "proofs_per_hour": 500.0}), 409, "result conflict")
    assert "accepted once" in body["detail"]
    assert h.store.stats() == before == {"instances": 1, "events": 1, "results": 1, "log_lines": 0}


# --- rejections: each one clear, none stores anything ---------------------------------------------------


def test_token_problems_are_401_or_403_and_store_nothing(h: Harness) -> None:
    iid, other = "p-0-cccccc", "p-1-dddddd"
    h.register(iid)
    h.register(other)
    before = h.store.stats()
    event = {"protocol": 1, "phase": "params", "status": "started", "at": "2026-12-02T18:00:00Z"}
    assert_error(h.post(iid, "events", event, headers={}), 401, "unauthorized")
    assert_error(h.post(iid, "events", event, headers={"Authorization": "Basic dXNlcjpwdw=="}), 401, "unauthorized")
    assert_error(h.post(iid, "events", event, headers={"Authorization": "Bearer not-hex"}), 401, "unauthorized")
    forged = {"Authorization": "Bearer " + instance_token(b"some-other-secret-0123456789", iid)}
    body = assert_error(h.post(iid, "events", event, headers=forged), 403, "forbidden")
    assert iid in body["detail"]
    assert_error(h.post(iid, "events", event, headers=auth(other)), 403, "forbidden")
    assert_error(h.post(iid, "register", register_doc(iid), headers=auth(other)), 403, "forbidden")
    assert_error(h.post(iid, "events", event, headers={"Authorization": f"Bearer {ADMIN}"}), 401, "unauthorized")
    assert h.store.stats() == before


def test_read_api_needs_the_admin_token(h: Harness) -> None:
    h.register("p-0-eeeeee")
    for path in ("/api/instances", "/api/instances/p-0-eeeeee", "/api/instance-logs/p-0-eeeeee"):
        assert_error(h.client.get(path), 401, "unauthorized")
        assert_error(h.client.get(path, headers={"Authorization": "Bearer wrong-admin-token"}), 403, "forbidden")
        assert_error(h.client.get(path, headers=auth("p-0-eeeeee")), 403, "forbidden")
        assert h.client.get(path, headers=ADMIN_AUTH).status_code == 200
    assert_error(h.client.get("/api/instances/nope", headers=ADMIN_AUTH), 404, "unknown instance")
    assert_error(h.client.get("/api/instance-logs/nope", headers=ADMIN_AUTH), 404, "unknown instance")
    assert_error(h.client.get("/api/instance-logs/p-0-eeeeee?tail=-1", headers=ADMIN_AUTH), 400, "bad query")


def test_open_reads_flag_serves_reads_without_a_token(tmp_path: Path) -> None:
    harness = Harness(tmp_path / "c.db", allow_open_reads=True)
    try:
        harness.register("p-0-ffffff")
        assert harness.client.get("/api/instances").status_code == 200
        assert harness.client.get("/api/instance-logs/p-0-ffffff").json()["lines"] == []
        # Writes and admin actions still need their tokens.
        assert_error(harness.client.post("/api/v1/instances/p-0-ffffff/destroyed"), 401, "unauthorized")
    finally:
        harness.close()


def test_oversized_body_is_413_and_not_stored(h: Harness) -> None:
    iid = "p-0-gggggg"
    h.register(iid)
    before = h.store.stats()
    lines = ["x" * 4000] * ((MAX_BODY_BYTES // 4000) + 2)
    body = json.dumps({"protocol": 1, "lines": lines}).encode()
    assert len(body) > MAX_BODY_BYTES
    r = h.client.post(f"/api/v1/instances/{iid}/logs", content=body,
                      headers={**auth(iid), "Content-Type": "application/json"})
    detail = assert_error(r, 413, "body too large")["detail"]
    assert str(MAX_BODY_BYTES) in detail
    assert h.store.stats() == before
    # The client is fine afterwards (the server closed that connection; httpx opens a new one).
    assert h.post(iid, "logs", {"protocol": 1, "lines": ["ok"]}).status_code == 200


def test_malformed_json_and_wrong_content_type_are_rejected(h: Harness) -> None:
    iid = "p-0-hhhhhh"
    h.register(iid)
    before = h.store.stats()
    url = f"/api/v1/instances/{iid}/events"
    json_headers = {**auth(iid), "Content-Type": "application/json"}
    body = assert_error(h.client.post(url, content=b'{"protocol": 1, "phase": ', headers=json_headers), 400,
                        "malformed JSON")
    assert "line 1 column" in body["detail"]
    assert "UTF-8" in assert_error(h.client.post(url, content=b'{"a": "\xff"}', headers=json_headers), 400,
                                   "malformed JSON")["detail"]
    assert "NaN" in assert_error(h.client.post(url, content=b'{"protocol": NaN}', headers=json_headers), 400,
                                 "malformed JSON")["detail"]
    assert_error(h.client.post(url, content=b"[" * 5000 + b"]" * 5000, headers=json_headers), 400, "malformed JSON")
    assert_error(h.client.post(url, content=b"protocol=1", headers={**auth(iid), "Content-Type": "text/plain"}),
                 415, "unsupported media type")
    assert h.store.stats() == before


@pytest.mark.parametrize(("action", "doc", "path", "fragment"), [
    ("events", {"protocol": 1, "phase": "mining", "status": "started", "at": "2026-12-02T18:00:00Z"},
     "$.phase", "is not one of"),
    ("events", {"protocol": 1, "phase": "params", "status": "done"}, "$", "'at' is a required property"),
    ("events", {"protocol": 2, "phase": "params", "status": "done", "at": "2026-12-02T18:00:00Z"}, "$.protocol", "1"),
    ("events", {"protocol": 1, "phase": "params", "status": "done", "at": "2026-13-45T18:00:00Z"}, "$.at",
     "not a valid time"),
    ("events", {"protocol": 1, "phase": "params", "status": "done", "at": "0001-01-01T00:00:00+05:00"}, "$.at",
     "not a valid time"),
    ("events", {"protocol": 1, "phase": "params", "status": "failed", "at": "2026-12-02T18:00:00Z",
                "exit_code": 2**70}, "$.exit_code", "out of range"),
    ("events", {"protocol": 1, "phase": "params", "status": "failed", "at": "2026-12-02T18:00:00Z",
                "details": {"a": "\ud800"}}, "$.details.a", "Unicode"),
    ("logs", {"protocol": 1, "lines": ["ok", 5]}, "$.lines[1]", "is not of type 'string'"),
    ("logs", {"protocol": 1, "lines": [], "dropped": -1}, "$.dropped", "minimum"),
    ("logs", {"protocol": 1, "lines": [], "extra": True}, "$", "Additional properties"),
    ("result", {**RESULT, "outcome": "great"}, "$.outcome", "is not one of"),
    ("result", {**RESULT, "log_tail": ["x"] * 501}, "$.log_tail", "too long"),
    ("register", {**register_doc("p-0-iiiiii"), "instance_id": "p-9-zzzzzz"}, "$.instance_id", "does not match"),
    ("register", [], "$", "is not of type 'object'"),
])
def test_schema_violations_name_the_path(h: Harness, action: str, doc: Any, path: str, fragment: str) -> None:
    iid = "p-0-iiiiii"
    h.register(iid)
    before = h.store.stats()
    raw = json.dumps(doc, ensure_ascii=True)
    r = h.client.post(f"/api/v1/instances/{iid}/{action}", content=raw,
                      headers={**auth(iid), "Content-Type": "application/json"})
    problems = assert_error(r, 400, "schema violation")["detail"]
    assert any(p["path"] == path and fragment in p["message"] for p in problems), problems
    assert h.store.stats() == before


def test_unknown_instance_is_404_and_stores_nothing(h: Harness) -> None:
    iid = "p-0-jjjjjj"  # valid token, never registered
    docs = {"events": {"protocol": 1, "phase": "params", "status": "started", "at": "2026-12-02T18:00:00Z"},
            "logs": {"protocol": 1, "lines": ["hello"]}, "result": RESULT}
    for action, doc in docs.items():
        body = assert_error(h.post(iid, action, doc), 404, "unknown instance")
        assert "never registered" in body["detail"] and "register first" in body["detail"]
    assert h.store.stats() == {"instances": 0, "events": 0, "results": 0, "log_lines": 0}


def test_bad_paths_and_methods(h: Harness) -> None:
    assert_error(h.client.get("/nope"), 404, "not found")
    assert_error(h.client.get("/api/v1/instances/p-0-a/events"), 405, "method not allowed")
    assert_error(h.client.put("/api/instances"), 405, "method not allowed")
    assert_error(h.client.post("/api/v1/instances/..%2Fx/events", json={}), 400, "invalid instance id")
    assert h.client.head("/healthz").status_code == 405


def test_keep_alive_serves_several_requests_on_one_connection(h: Harness) -> None:
    iid = "p-0-kkkkkk"
    h.register(iid)
    body = json.dumps({"protocol": 1, "lines": ["a"]}).encode()
    one = (f"POST /api/v1/instances/{iid}/logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
           f"{instance_token(SECRET, iid)}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
           ).encode() + body
    reply = raw_exchange(h.server.url, one * 3 + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert reply.count(b"HTTP/1.1 200 OK") == 4
    assert h.store.tail(iid, 10) == ["a", "a", "a"]


def _read_one_answer(sock: socket.socket) -> bytes:
    """One HTTP answer (head and its Content-Length body) off a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection without an answer (got {data!r})"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection in the middle of an answer"
        body += chunk
    return head


def test_an_answer_given_before_its_body_arrived_says_the_connection_closes(h: Harness) -> None:
    """A route that answers from the head alone (the admin's `destroyed`, a refused token) may answer before the
    client's body is in: the connection then cannot carry another request, and the answer must say so. An
    answer that looked kept-alive and a close after it is what a client reusing the connection meets as
    "Server disconnected without sending a response" (CI: httpx's third POST in test_controller_client)."""
    iid = "p-0-dddddd"
    h.register(iid)
    host, port = h.server.url.removeprefix("http://").split(":")
    head = (f"POST /api/v1/instances/{iid}/destroyed HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\n"
            "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head)  # the body `{}` is not sent yet: the answer comes from the head alone
        answer = _read_one_answer(sock)
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        assert b"connection: close" in answer.lower(), answer
    report = h.store.report(iid)
    assert report is not None and report.destroyed_at is not None
    # Head and body together: the answer keeps the connection, and the next request on it is answered.
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + b"{}")
        answer = _read_one_answer(sock)
        assert answer.startswith(b"HTTP/1.1 200 ") and b"connection: close" not in answer.lower(), answer
        sock.sendall(head + b"{}")
        assert _read_one_answer(sock).startswith(b"HTTP/1.1 200 ")


def test_lying_or_chunked_lengths_are_refused(h: Harness) -> None:
    iid = "p-0-llllll"
    h.register(iid)
    before = h.store.stats()
    head = (f"POST /api/v1/instances/{iid}/logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            f"{instance_token(SECRET, iid)}\r\nContent-Type: application/json\r\n")
    assert b" 413 " in raw_exchange(h.server.url, (head + "Content-Length: 999999999\r\n\r\n{}").encode())
    assert b" 411 " in raw_exchange(h.server.url, (head + "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
                                                   ).encode())
    assert b" 400 " in raw_exchange(h.server.url, (head + "Content-Length: 50\r\n\r\n{}").encode())  # short body
    assert b" 400 " in raw_exchange(h.server.url, (head + "Content-Length: -5\r\n\r\n").encode())
    assert b"Bad request syntax" in raw_exchange(h.server.url, b"GARBAGE\r\n\r\n")
    assert b" 405 " in raw_exchange(h.server.url, b"BREW /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert h.store.stats() == before


# --- durability -----------------------------------------------------------------------------------------


def test_store_survives_a_controller_restart(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    first = Harness(path)
    first.register("p-0-mmmmmm")
    first.post("p-0-mmmmmm", "logs", {"protocol": 1, "lines": ["before restart"]})
    first.post("p-0-mmmmmm", "result", RESULT)
    before = first.store.report("p-0-mmmmmm")
    first.close()
    second = Harness(path)
    try:
        assert second.store.report("p-0-mmmmmm") == before
        assert second.post("p-0-mmmmmm", "logs", {"protocol": 1, "lines": ["after restart"]}).status_code == 200
        assert second.post("p-0-mmmmmm", "result", RESULT).json()["status"] == "duplicate"
        assert second.store.tail("p-0-mmmmmm", 5) == ["before restart", "after restart"]
    finally:
        second.close()


SERVE_BOOTSTRAP = """
import argparse, sys
from reconciler.cli import controller
parser = argparse.ArgumentParser()
controller.register(parser.add_subparsers(dest="command", required=True))
args = parser.parse_args(sys.argv[1:])
sys.exit(args.func(args))
"""


def start_serve_process(db: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-c", SERVE_BOOTSTRAP, "controller", "serve", "--db", str(db),
                             "--port", "0", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("controller listening on http://127.0.0.1:"), line + (proc.stderr.read() if proc.stderr
                                                                               else "")
    return proc, line.split()[3]


def test_sigkill_mid_ingest_loses_no_acknowledged_report(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    env = {**os.environ, "FLEET_CONTROLLER_SECRET": SECRET.decode(), "FLEET_ADMIN_TOKEN": ADMIN}
    proc, url = start_serve_process(db, env)
    ids = [f"p-{i}-kill00" for i in range(4)]
    acked: dict[str, list[str]] = {iid: [] for iid in ids}
    enough = threading.Event()
    try:
        with httpx.Client(base_url=url, timeout=10) as client:
            for iid in ids:
                assert client.post(f"/api/v1/instances/{iid}/register", json=register_doc(iid),
                                   headers=auth(iid)).status_code == 200

        def worker(iid: str) -> None:
            with httpx.Client(base_url=url, timeout=10) as client:
                for n in range(100_000):
                    line = f"{iid} line {n}"
                    try:
                        r = client.post(f"/api/v1/instances/{iid}/logs", json={"protocol": 1, "lines": [line]},
                                        headers=auth(iid))
                    except httpx.HTTPError:
                        return  # the server died under us: this line was never acknowledged
                    if r.status_code != 200:
                        return
                    acked[iid].append(line)
                    if sum(len(v) for v in acked.values()) >= 400:
                        enough.set()

        threads = [threading.Thread(target=worker, args=(iid,)) for iid in ids]
        for t in threads:
            t.start()
        assert enough.wait(timeout=120), "workers never got 400 acknowledgements"
        proc.send_signal(signal.SIGKILL)
        for t in threads:
            t.join(timeout=30)
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()

    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.close()
    store = SqliteStore(db)
    for iid in ids:
        stored = store.tail(iid, 5000)
        assert stored[:len(acked[iid])] == acked[iid]  # every acknowledged line, in order
        assert len(stored) <= len(acked[iid]) + 1  # at most the one in flight when it died
    store.close()

    proc, url = start_serve_process(db, env)
    try:
        with httpx.Client(base_url=url, timeout=10) as client:
            r = client.post(f"/api/v1/instances/{ids[0]}/result", json=RESULT, headers=auth(ids[0]))
            assert (r.status_code, r.json()["status"]) == (200, "stored")
            r = client.post(f"/api/v1/instances/{ids[1]}/logs", json={"protocol": 1, "lines": ["after"]},
                            headers=auth(ids[1]))
            assert r.status_code == 200
            assert client.get(f"/api/instance-logs/{ids[1]}?tail=1", headers=ADMIN_AUTH).json()["lines"] == ["after"]
    finally:
        stop_serving(proc)


def test_serve_refuses_to_start_without_a_secret(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("FLEET_CONTROLLER_SECRET", "FLEET_ADMIN_TOKEN")}
    done = subprocess.run([sys.executable, "-c", SERVE_BOOTSTRAP, "controller", "serve", "--db",
                           str(tmp_path / "c.db"), "--port", "0"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 2
    assert "no controller secret" in done.stderr and "FLEET_CONTROLLER_SECRET" in done.stderr
    assert not (tmp_path / "c.db").exists()
    short = subprocess.run([sys.executable, "-c", SERVE_BOOTSTRAP, "controller", "serve", "--db",
                            str(tmp_path / "c.db")], capture_output=True, text=True,
                           env={**env, "FLEET_CONTROLLER_SECRET": "hunter2"}, timeout=60)
    assert short.returncode == 2 and "at least 16" in short.stderr and "hunter2" not in short.stderr


# --- fuzz: no 5xx, nothing stored unless valid ------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    harness = Harness(tmp_path_factory.mktemp("fuzz") / "c.db", ring_lines=50)
    harness.register("fuzz-0-aaaaaa")
    yield harness
    harness.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)
times = st.sampled_from(["2026-12-02T18:00:00Z", "2026-12-02T18:00:00.5+02:00", "2026-02-30T00:00:00Z", "yesterday"])
near_valid = {
    "events": st.fixed_dictionaries(
        {"protocol": st.sampled_from([1, 1, 2]), "phase": st.sampled_from(["params", "benchmark", "bogus"]),
         "status": st.sampled_from(["started", "progress", "done", "failed"]), "at": times},
        optional={"exit_code": st.one_of(st.none(), st.integers()), "message": st.one_of(st.none(), st.text()),
                  "log_tail": st.lists(st.text(max_size=50), max_size=3), "details": json_values,
                  "surprise": json_values}),
    "logs": st.fixed_dictionaries(
        {"protocol": st.just(1), "lines": st.lists(st.text(max_size=80), max_size=5) | json_values},
        optional={"dropped": st.integers(min_value=-2, max_value=2**60)}),
    "result": st.fixed_dictionaries(
        {"protocol": st.just(1), "outcome": st.sampled_from(["completed", "error", "lost"]), "at": times,
         "requested": st.integers(-1, 20), "completed": st.integers(0, 20), "failed": st.integers(0, 20)},
        optional={"proofs_per_hour": st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
                  "log_tail": st.lists(st.text(max_size=50), max_size=3)}),
    "register": st.fixed_dictionaries(
        {"protocol": st.just(1), "instance_id": st.sampled_from(["fuzz-0-aaaaaa", "other"]), "at": times},
        optional={"pool": st.one_of(st.none(), st.text(max_size=70)), "gpus": json_values}),
}
KIND = {"events": "event", "logs": "log_batch", "result": "result", "register": "register"}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_bodies_never_5xx_and_store_only_valid_reports(fuzz: Harness, data: st.DataObject) -> None:
    action = data.draw(st.sampled_from(sorted(near_valid)))
    body_kind = data.draw(st.sampled_from(["near-valid", "any-json", "bytes"]))
    if body_kind == "bytes":
        doc, raw = None, data.draw(st.binary(max_size=300))
    else:
        doc = data.draw(near_valid[action] if body_kind == "near-valid" else json_values)
        raw = json.dumps(doc).encode()
    before = fuzz.store.stats()
    r = fuzz.client.post(f"/api/v1/instances/fuzz-0-aaaaaa/{action}", content=raw,
                         headers={**auth("fuzz-0-aaaaaa"), "Content-Type": "application/json"})
    assert r.status_code < 500, r.text
    assert isinstance(r.json()["error"] if r.status_code >= 400 else r.json()["status"], str)
    if r.status_code >= 400:
        assert fuzz.store.stats() == before
    else:
        assert doc is not None and (_protocol_validator(KIND[action]).is_valid(doc)
                                    or (action == "events" and _protocol_validator("event_batch").is_valid(doc)))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]),
       segments=st.lists(st.text(min_size=0, max_size=20), max_size=5),
       prefix=st.sampled_from(["", "api", "api/v1/instances", "api/instances", "api/instance-logs"]),
       query=st.text(max_size=20), with_token=st.booleans(), body=st.binary(max_size=50))
def test_fuzzed_paths_never_5xx_and_store_nothing(fuzz: Harness, method: str, segments: list[str], prefix: str,
                                                   query: str, with_token: bool, body: bytes) -> None:
    path = "/" + "/".join([prefix, *[quote(s, safe="") for s in segments]]).strip("/")
    before = fuzz.store.stats()
    headers = {"Content-Type": "application/json", **(ADMIN_AUTH if with_token else {})}
    r = fuzz.client.request(method, path + "?" + quote(query, safe="=&"), content=body, headers=headers)
    assert r.status_code < 500, (path, r.text)
    assert fuzz.store.stats() == before


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_hot_path_check_accepts_only_schema_valid_documents(data: st.DataObject) -> None:
    action = data.draw(st.sampled_from(["events", "logs"]))
    doc = data.draw(near_valid[action] | json_values | st.fixed_dictionaries(
        {"protocol": st.sampled_from([1, True, 1.0]), "lines": st.lists(st.text(max_size=5), max_size=3)},
        optional={"dropped": st.sampled_from([0, 3, -1, True, 2.0])}))
    if fast_valid(KIND[action], doc):
        assert _protocol_validator(KIND[action]).is_valid(doc), doc


def test_hot_path_check_recognises_ordinary_reports() -> None:
    assert fast_valid("log_batch", {"protocol": 1, "lines": ["a", "b"], "dropped": 3})
    assert fast_valid("event", {"protocol": 1, "phase": "params", "status": "progress", "at": "2026-12-02T18:00:00Z",
                                "exit_code": None, "message": "ok", "log_tail": ["x"], "details": {"n": 1}})
    assert not fast_valid("log_batch", {"protocol": True, "lines": []})
    assert not fast_valid("event", {"protocol": 1, "phase": "params", "status": "done", "at": "now"})

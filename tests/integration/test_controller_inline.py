"""Worker reports whose body is complete are answered inline by the HTTP edge (no ASGI task); a body still
arriving takes the ASGI path. Both give the same answers over real HTTP on 127.0.0.1, in order for pipelined
requests; the group commit stores every write of a turn in one transaction, and a write that fails
unexpectedly fails alone."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.adapters.store.port import PreparedWrite, SqlConnection, UnknownInstance
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.domain.tokens import instance_token
from tests.controller_support import SECRET, Harness, register_doc


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path / "controller.db")
    yield harness
    harness.close()


def event_request(iid: str, k: int, extra_headers: str = "") -> tuple[bytes, bytes]:
    body = json.dumps({"protocol": 1, "phase": "params", "status": "progress", "at": "2026-12-02T18:00:00Z",
                       "message": f"{k} of 56 GiB"}).encode()
    head = (f"POST /api/v1/instances/{iid}/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            f"{instance_token(SECRET, iid)}\r\nContent-Type: application/json\r\n{extra_headers}"
            f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1")
    return head, body


def read_answers(sock: socket.socket) -> list[tuple[int, dict[str, Any], bytes]]:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    answers = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status == 100:
            data = rest
            continue
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(
            b"content-length:"))
        answers.append((status, json.loads(rest[:length]), head))
        data = rest[length:]
    return answers


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def test_pipelined_reports_are_answered_in_order_with_uvicorns_headers(h: Harness) -> None:
    iid = "p-0-pipe00"
    h.register(iid)
    with connect(h.server.url) as sock:
        sock.sendall(b"".join(b"".join(event_request(iid, k)) for k in range(3))
                     + b"".join(event_request(iid, 0, "Connection: close\r\n")))  # the last repeats the first
        answers = read_answers(sock)
    assert [(status, body["status"]) for status, body, _ in answers] == [
        (200, "stored"), (200, "stored"), (200, "stored"), (200, "duplicate")]
    first_head, last_head = answers[0][2].lower(), answers[-1][2].lower()
    for name in (b"server: fleet-controller/1", b"date: ", b"content-type: application/json",
                 b"cache-control: no-store"):
        assert name in first_head
    assert b"connection: close" not in first_head and last_head.count(b"connection: close") == 1
    report = h.store.report(iid)
    assert report is not None and [e.message for e in report.events] == [f"{k} of 56 GiB" for k in range(3)]
    assert h.server.commits.writes >= 4


def test_a_body_that_arrives_later_takes_the_asgi_path_with_the_same_answer(h: Harness) -> None:
    iid = "p-0-later0"
    h.register(iid)
    head, body = event_request(iid, 7, "Expect: 100-continue\r\nConnection: close\r\n")
    with connect(h.server.url) as sock:
        sock.sendall(head)
        interim = sock.recv(64)  # the server asks for the body: the head was accepted, the body is not here
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        answers = read_answers(sock)
    assert [(status, body["status"]) for status, body, _ in answers] == [(200, "stored")]
    report = h.store.report(iid)
    assert report is not None and [e.message for e in report.events] == ["7 of 56 GiB"]


def test_a_refused_report_is_answered_inline_and_closes(h: Harness) -> None:
    iid = "p-0-refuse"
    head, body = event_request(iid, 1)  # never registered: 404 from the store, after the token check
    with connect(h.server.url) as sock:
        sock.sendall(head + body)
        sock.shutdown(socket.SHUT_WR)
        answers = read_answers(sock)
    assert [(status, body["error"]) for status, body, _ in answers] == [(404, "unknown instance")]
    assert h.store.stats()["events"] == 0


def test_write_all_stores_each_write_alone(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "c.db")
    try:
        store.register("p-0-aaaaaa", register_doc("p-0-aaaaaa"))

        def broken(conn: SqlConnection) -> None:
            conn.execute("INSERT INTO log_lines (instance_id, seq, line) VALUES ('p-0-aaaaaa', 999, 'half')")
            raise RuntimeError("a bug after a statement")

        event = {"protocol": 1, "phase": "params", "status": "progress", "at": "2026-12-02T18:00:00Z"}
        outcomes = store.write_all([store.prepare_event("p-0-aaaaaa", event), PreparedWrite(broken),
                                    store.prepare_event("p-0-nobody", event), store.prepare_logs("p-0-aaaaaa", ["x"])])
        assert outcomes[0] == (None, "stored") and outcomes[3] == (None, 0)
        assert isinstance(outcomes[1][0], RuntimeError) and isinstance(outcomes[2][0], UnknownInstance)
        assert store.tail("p-0-aaaaaa", 5) == ["x"]  # the broken write's row was rolled back, the others kept
        assert store.stats()["events"] == 1
    finally:
        store.close()

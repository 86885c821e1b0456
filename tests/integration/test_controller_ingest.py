"""Controller ingest over real HTTP on 127.0.0.1, beyond test_controller_http: the request-head parser that
replaced the email package (same answers to bad heads, stricter on malformed header lines) and event batches
(protocol v1, additive): all-or-nothing, the bad event's index named, size limit, replay without duplicates."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.store import ControllerStore
from reconciler.tokens import instance_token

SECRET = b"test-controller-secret-0123456789"
T0 = datetime(2026, 12, 2, 18, 0, tzinfo=UTC)


class StepClock:
    def __init__(self) -> None:
        self.value = T0

    def __call__(self) -> datetime:
        self.value += timedelta(seconds=1)
        return self.value


def auth(instance_id: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {instance_token(SECRET, instance_id)}"}


class Harness:
    def __init__(self, path: Path, **store_options: Any):
        from reconciler.controller import ControllerServer

        self.store = ControllerStore(path, now=StepClock(), **store_options)
        self.server = ControllerServer(self.store, SECRET, None, "127.0.0.1", 0).start()
        self.client = httpx.Client(base_url=self.server.url, timeout=10.0)

    def post(self, instance_id: str, action: str, doc: Any) -> httpx.Response:
        return self.client.post(f"/api/v1/instances/{instance_id}/{action}", json=doc, headers=auth(instance_id))

    def register(self, instance_id: str) -> None:
        doc = {"protocol": 1, "instance_id": instance_id, "at": "2026-12-02T17:59:30Z", "pool": "rtx4090"}
        assert self.post(instance_id, "register", doc).status_code == 200

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        self.store.close()


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path / "controller.db")
    yield harness
    harness.close()


def raw_exchange(url: str, payload: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def json_of(reply: bytes) -> Any:
    return json.loads(reply.split(b"\r\n\r\n", 1)[1])


# --- request heads -----------------------------------------------------------------------------------


def logs_request(iid: str, extra_headers: str = "", version: str = "HTTP/1.1") -> bytes:
    body = json.dumps({"protocol": 1, "lines": ["a"]}).encode()
    return (f"POST /api/v1/instances/{iid}/logs {version}\r\nHost: x\r\nAuthorization: Bearer "
            f"{instance_token(SECRET, iid)}\r\nContent-Type: application/json\r\n{extra_headers}"
            f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1") + body


def test_ordinary_heads_are_parsed_case_insensitively_with_optional_whitespace(h: Harness) -> None:
    iid = "p-0-hhhhhh"
    h.register(iid)
    body = json.dumps({"protocol": 1, "lines": ["spaced"]}).encode()
    head = (f"POST /api/v1/instances/{iid}/logs HTTP/1.1\nhost:x\nAUTHORIZATION:   Bearer "
            f"{instance_token(SECRET, iid)}  \ncontent-type:application/json; charset=utf-8\t\n"
            f"content-length: {len(body)}\nConnection: close\n\n").encode()
    reply = raw_exchange(h.server.url, head + body)
    assert status_of(reply) == 200, reply
    assert b"\r\nDate: " in reply and b"\r\nServer: fleet-controller/1" in reply
    assert h.store.tail(iid, 5) == ["spaced"]


@pytest.mark.parametrize(("extra", "status", "fragment"), [
    ("X-Folded: one\r\n  two\r\n", 400, b"Bad header line"),  # obsolete line folding
    ("No colon here\r\n", 400, b"Bad header line"),
    ("Bad Name: x\r\n", 400, b"Bad header line"),
    ("Content-Length : 5\r\n", 400, b"Bad header line"),  # whitespace before the colon (smuggling trick)
    ("X-Long: " + "a" * 70_000 + "\r\n", 431, b"Line too long"),
    ("".join(f"X-{i}: {i}\r\n" for i in range(101)), 431, b"Too many headers"),
])
def test_malformed_heads_are_refused_and_store_nothing(h: Harness, extra: str, status: int, fragment: bytes) -> None:
    iid = "p-0-mmmmmm"
    h.register(iid)
    before = h.store.stats()
    reply = raw_exchange(h.server.url, logs_request(iid, extra))
    assert status_of(reply) == status, reply[:300]
    assert fragment in reply and b"Connection: close" in reply
    assert json_of(reply)["error"]
    assert h.store.stats() == before


@pytest.mark.parametrize(("version", "fragment"), [
    ("HTTP/1.\u00b2", b"Bad request version"),  # a latin-1 digit that int() refuses
    ("HTTP/1", b"Bad request version"),
    ("HTTPS/1.1", b"Bad request version"),
    ("HTTP/2.0", b"Invalid HTTP version"),
])
def test_bad_request_versions_get_the_http_server_answers(h: Harness, version: str, fragment: bytes) -> None:
    iid = "p-0-vvvvvv"
    h.register(iid)
    before = h.store.stats()
    reply = raw_exchange(h.server.url, logs_request(iid, version=version))
    # As http.server: a request whose version is unreadable is answered HTTP/0.9 style, the body alone.
    assert json.loads(reply)["error"].encode().startswith(fragment), reply[:300]
    assert h.store.stats() == before


def test_http_1_0_closes_and_keep_alive_header_keeps_the_connection(h: Harness) -> None:
    iid = "p-0-kkkkkk"
    h.register(iid)
    one_zero = raw_exchange(h.server.url, logs_request(iid, version="HTTP/1.0") * 2)
    assert one_zero.count(b" 200 OK") == 1  # HTTP/1.0 without keep-alive: one answer, then close
    kept = raw_exchange(h.server.url, logs_request(iid, "Connection: keep-alive\r\n", version="HTTP/1.0") * 2
                        + b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert kept.count(b" 200 OK") == 3
    assert h.store.tail(iid, 10) == ["a", "a", "a"]


def test_expect_100_continue_is_answered_before_the_body(h: Harness) -> None:
    iid = "p-0-cccccc"
    h.register(iid)
    reply = raw_exchange(h.server.url, logs_request(iid, "Expect: 100-continue\r\nConnection: close\r\n"))
    assert reply.startswith(b"HTTP/1.1 100 Continue\r\n")
    assert b"HTTP/1.1 200 OK" in reply

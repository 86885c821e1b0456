"""Shared test helpers for the controller: a stepping store clock, worker auth, a live server harness and a
raw-socket exchange for what httpx will not send (malformed heads, pipelining)."""

from __future__ import annotations

import signal
import socket
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from reconciler.adapters.controller.server import ControllerServer
from reconciler.adapters.store.sql import SqlStore
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.domain.tokens import instance_token, machine_claim

SECRET = b"test-controller-secret-0123456789"
ADMIN = "test-admin-token-abcdefghijklmnop"
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}
T0 = datetime(2026, 12, 2, 18, 0, tzinfo=UTC)
DIGEST = "sha256:" + "ab" * 32


class StepClock:
    """The controller store's clock: each call returns a time one second later than the previous one."""

    def __init__(self, start: datetime = T0) -> None:
        self.value = start

    def __call__(self) -> datetime:
        self.value += timedelta(seconds=1)
        return self.value


def auth(instance_id: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {instance_token(SECRET, instance_id)}"}


def register_doc(instance_id: str) -> dict[str, Any]:
    return {"protocol": 1, "instance_id": instance_id, "at": "2026-12-02T17:59:30Z", "pool": "rtx4090",
            "slot": "rtx4090-0", "machine_id": "4242", "machine_claim": machine_claim(SECRET, instance_id, "4242"),
            "host_id": "77", "contract_id": "9001",
            "gpu_name": "RTX 4090", "image_digest": DIGEST, "image_version": "v1", "hostname": "c.9001",
            "gpus": ["NVIDIA GeForce RTX 4090, 24564 MiB"]}


class Harness:
    """A controller on 127.0.0.1:<free port> over a fresh store (a SQLite file, or a `postgresql://` URI), and an
    httpx client for it."""

    def __init__(self, path: Path | str, *, allow_open_reads: bool = False, **store_options: Any):
        self.path = path
        self.store: SqlStore
        if isinstance(path, str):
            from reconciler.adapters.store.postgres import PostgresStore

            self.store = PostgresStore(path, now=StepClock(), **store_options)
        else:
            self.store = SqliteStore(path, now=StepClock(), **store_options)
        self.server = ControllerServer(self.store, SECRET, ADMIN, "127.0.0.1", 0,
                                       allow_open_reads=allow_open_reads).start()
        self.client = httpx.Client(base_url=self.server.url, timeout=10.0)

    def post(self, instance_id: str, action: str, doc: Any, headers: dict[str, str] | None = None) -> httpx.Response:
        return self.client.post(f"/api/v1/instances/{instance_id}/{action}", json=doc,
                                headers=auth(instance_id) if headers is None else headers)

    def register(self, instance_id: str) -> None:
        assert self.post(instance_id, "register", register_doc(instance_id)).status_code == 200

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        self.store.close()


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


def stop_serving(proc: subprocess.Popen[str]) -> None:
    """SIGTERM a `fleet ... serve` subprocess, require a clean exit, and close its pipes."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    for stream in (proc.stdout, proc.stderr):
        if stream:
            stream.close()

"""Webhooks over real HTTP on 127.0.0.1: a receiver that is down when the events happen gets each event once
when it comes back; the worker thread delivers without the caller waiting."""

from __future__ import annotations

import json
import random
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from reconciler.adapters.webhooks import WebhookNotifier, WebhookTarget
from reconciler.domain.events import breaker_event, orphan_destroyed_event, spend_cap_event

AT = datetime(2026, 12, 3, 7, 0, tzinfo=UTC)


class Receiver:
    def __init__(self, port: int) -> None:
        self.got: list[tuple[str, dict]] = []
        self.arrived = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.got.append((self.headers["Idempotency-Key"], json.loads(body)))
                receiver.arrived.set()
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Record:
    image_digest = "sha256:" + "cd" * 32
    signature = "no-kernel-image"
    pools = ("rtx4090",)
    machines = ("41001", "41002")
    tripped_at = "2026-12-03T06:59:00Z"
    reason = "same failure on 2 machines"


EVENTS = [breaker_event(Record(), AT), spend_cap_event(6.1, 6.0, AT), orphan_destroyed_event("991", AT)]


@pytest.fixture
def port() -> Iterator[int]:
    yield free_port()


def test_a_receiver_down_then_up_gets_each_event_once(port: int) -> None:
    clock = [0.0]
    url = f"http://127.0.0.1:{port}/hook"
    notifier = WebhookNotifier([WebhookTarget("ops", url, "generic")], clock=lambda: clock[0],
                               rng=random.Random(3), backoff_s=1.0)
    try:
        for e in [*EVENTS, EVENTS[0]]:  # the trip is derived twice (two passes): still one delivery
            assert notifier.notify(e)
        assert notifier.deliver_due() == 0  # nobody listens: connection refused, all scheduled again
        assert notifier.stats.retried == 3 and notifier.pending() == 3
        receiver = Receiver(port)
        try:
            while (due := notifier.next_due()) is not None:
                clock[0] = due
                notifier.deliver_due()
            keys = [k for k, _ in receiver.got]
            assert sorted(keys) == sorted(e.idempotency_key for e in EVENTS)
            assert {doc["kind"] for _, doc in receiver.got} == {"breaker-trip", "spend-cap", "orphan-destroyed"}
            assert notifier.stats.delivered == 3 and notifier.stats.skipped_duplicate == 1
        finally:
            receiver.close()
    finally:
        notifier.stop()


def test_the_worker_thread_delivers_while_the_caller_goes_on(port: int) -> None:
    receiver = Receiver(port)
    notifier = WebhookNotifier([WebhookTarget("slack", f"http://127.0.0.1:{port}/services/x", "slack")]).start()
    try:
        assert notifier.notify(EVENTS[0])  # returns at once; delivery happens on the worker thread
        assert receiver.arrived.wait(30), "the worker thread did not deliver"
        (key, doc), = receiver.got
        assert key == EVENTS[0].idempotency_key and "circuit breaker tripped" in doc["text"]
    finally:
        notifier.stop()
        receiver.close()

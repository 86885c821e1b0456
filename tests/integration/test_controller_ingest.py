"""Controller ingest over real HTTP on 127.0.0.1, beyond test_controller_http: the request-head parser that
replaced the email package (same answers to bad heads, stricter on malformed header lines) and event batches
(protocol v1, additive): all-or-nothing, the bad event's index named, size limit, replay without duplicates."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.adapters.controller.protocol import _protocol_validator
from reconciler.adapters.controller.server import ControllerServer
from reconciler.domain.tokens import instance_token, machine_claim
from tests.controller_support import SECRET, Harness, auth, raw_exchange, status_of


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path / "controller.db")
    yield harness
    harness.close()


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
    head = (f"POST /api/v1/instances/{iid}/logs HTTP/1.1\r\nhost:x\r\nAUTHORIZATION:   Bearer "
            f"{instance_token(SECRET, iid)}  \r\ncontent-type:application/json; charset=utf-8\t\r\n"
            f"content-length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    reply = raw_exchange(h.server.url, head + body)
    assert status_of(reply) == 200, reply
    assert b"\r\ndate: " in reply.lower() and b"\r\nserver: fleet-controller/1" in reply.lower()
    assert h.store.tail(iid, 5) == ["spaced"]
    # Bare LF line ends (RFC 9112 allows a server to refuse them; llhttp does: a smuggling vector) are refused.
    before = h.store.stats()
    reply = raw_exchange(h.server.url, head.replace(b"\r\n", b"\n") + body)
    assert status_of(reply) == 400 and b"CRLF" in reply
    assert h.store.stats() == before


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
    # The wording of http.server, in an HTTP/1.1 answer (http.server answered these HTTP/0.9 style, body alone).
    assert status_of(reply) in (400, 505) and b"Connection: close" in reply
    assert json_of(reply)["error"].encode().startswith(fragment), reply[:300]
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


# --- event batches ---------------------------------------------------------------------------------


def progress(i: int, **extra: Any) -> dict[str, Any]:
    return {"protocol": 1, "phase": "params", "status": "progress", "at": f"2026-12-02T18:{i // 60:02d}:{i % 60:02d}Z",
            "message": f"{i} of 56 GiB", "details": {"bytes_done": i * 1_048_576}, **extra}


def batch(*events: dict[str, Any]) -> dict[str, Any]:
    return {"protocol": 1, "events": list(events)}


def test_batch_is_stored_in_order_and_single_events_still_work(h: Harness) -> None:
    iid = "p-0-bbbbbb"
    h.register(iid)
    assert h.post(iid, "events", {"protocol": 1, "phase": "params", "status": "started",
                                  "at": "2026-12-02T18:00:00Z"}).json() == {"status": "stored"}
    r = h.post(iid, "events", batch(*[progress(i) for i in range(1, 21)],
                                    {"protocol": 1, "phase": "params", "status": "done", "at": "2026-12-02T18:01:00Z",
                                     "details": {"url": "https://u:hunter2@mirror/x"}}))
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "stored", "events": 21, "stored": 21, "duplicates": 0}
    report = h.store.report(iid)
    assert report is not None
    assert [(e.status, e.details.get("bytes_done")) for e in report.events] == [
        ("started", None), *[("progress", i * 1_048_576) for i in range(1, 21)], ("done", None)]
    assert report.events[-1].details["url"] == "https://u:[REDACTED]@mirror/x"


def test_replayed_batch_stores_nothing_twice(h: Harness) -> None:
    iid = "p-0-rrrrrr"
    h.register(iid)
    assert h.post(iid, "events", progress(2)).json() == {"status": "stored"}
    docs = batch(progress(1), progress(2), progress(3))
    assert h.post(iid, "events", docs).json() == {"status": "stored", "events": 3, "stored": 2, "duplicates": 1}
    assert h.post(iid, "events", docs).json() == {"status": "duplicate", "events": 3, "stored": 0, "duplicates": 3}
    assert h.post(iid, "events", progress(3)).json() == {"status": "duplicate"}
    assert h.store.stats()["events"] == 3


def test_one_bad_event_rejects_the_batch_naming_its_index(h: Harness) -> None:
    iid = "p-0-xxxxxx"
    h.register(iid)
    before = h.store.stats()
    docs = batch(progress(1), progress(2), {**progress(3), "phase": "bogus"}, progress(4),
                 {**progress(5), "at": "2026-02-30T00:00:00Z"})
    r = h.post(iid, "events", docs)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["error"] == "schema violation"
    assert [(p["index"], p["path"]) for p in body["detail"]] == [(2, "$.events[2].phase"), (4, "$.events[4].at")]
    assert "bogus" in body["detail"][0]["message"] and "not a valid time" in body["detail"][1]["message"]
    assert h.store.stats() == before
    # The same events without the bad ones go through: nothing of the refused batch was half-stored.
    assert h.post(iid, "events", batch(progress(1), progress(2), progress(4))).json()["stored"] == 3


@pytest.mark.parametrize(("doc", "path"), [
    ({"protocol": 1, "events": []}, "$.events"),
    ({"protocol": 2, "events": [progress(1)]}, "$.protocol"),
    ({"protocol": 1, "events": [progress(1)], "extra": True}, "$"),
    ({"protocol": 1, "events": {"0": progress(1)}}, "$.events"),
    ({"events": [progress(1)]}, "$"),
])
def test_bad_batch_envelopes_are_schema_violations(h: Harness, doc: dict[str, Any], path: str) -> None:
    iid = "p-0-eeeeee"
    h.register(iid)
    before = h.store.stats()
    r = h.post(iid, "events", doc)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "schema violation" and path in [p["path"] for p in r.json()["detail"]]
    assert h.store.stats() == before


def test_oversized_batch_is_413_and_stores_nothing(h: Harness) -> None:
    iid = "p-0-oooooo"
    h.register(iid)
    before = h.store.stats()
    r = h.post(iid, "events", batch(*[progress(i) for i in range(201)]))
    assert r.status_code == 413, r.text
    assert r.json()["error"] == "batch too large" and "201 events" in r.json()["detail"]
    assert "200" in r.json()["detail"]
    assert h.store.stats() == before
    assert h.post(iid, "events", batch(*[progress(i) for i in range(200)])).json()["stored"] == 200  # at the limit


def test_batch_over_the_event_limit_is_422_and_stores_nothing(tmp_path: Path) -> None:
    harness = Harness(tmp_path / "c.db", max_other_events=2)
    try:
        iid = "p-0-llllll"
        harness.register(iid)
        before = harness.store.stats()
        steps = [{"protocol": 1, "phase": phase, "status": "started", "at": "2026-12-02T18:00:00Z"}
                 for phase in ("tunnel", "params", "daemon")]
        r = harness.post(iid, "events", batch(progress(1), *steps))
        assert r.status_code == 422, r.text
        assert "limit 2" in r.json()["detail"] and "nothing of this batch was stored" in r.json()["detail"]
        assert harness.store.stats() == before
    finally:
        harness.close()


def test_batch_for_an_unknown_instance_or_with_a_foreign_token_stores_nothing(h: Harness) -> None:
    h.register("p-0-aaaaaa")
    r = h.post("p-0-ghost0", "events", batch(progress(1)))
    assert r.status_code == 404 and r.json()["error"] == "unknown instance"
    r = h.client.post("/api/v1/instances/p-0-aaaaaa/events", json=batch(progress(1)), headers=auth("p-0-ghost0"))
    assert r.status_code == 403
    assert h.store.stats()["events"] == 0


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    harness = Harness(tmp_path_factory.mktemp("fuzz") / "c.db")
    harness.register("fuzz-0-bbbbbb")
    yield harness
    harness.close()


near_valid_event = st.fixed_dictionaries(
    {"protocol": st.sampled_from([1, 1, 1, 2, True]), "phase": st.sampled_from(["params", "benchmark", "bogus"]),
     "status": st.sampled_from(["started", "progress", "done"]),
     "at": st.sampled_from(["2026-12-02T18:00:00Z", "2026-12-02T18:00:01Z", "2026-02-30T00:00:00Z"])},
    optional={"message": st.one_of(st.none(), st.text(max_size=20), st.integers()),
              "details": st.dictionaries(st.text(max_size=5), st.integers(-3, 3), max_size=2)})
near_valid_batch = st.fixed_dictionaries(
    {"protocol": st.sampled_from([1, 1, 1, 1.0, 2]), "events": st.lists(near_valid_event, max_size=6)},
    optional={"extra": st.none()})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=near_valid_batch)
def test_fuzzed_batches_are_stored_whole_or_not_at_all(fuzz: Harness, doc: dict[str, Any]) -> None:
    before = fuzz.store.stats()["events"]
    r = fuzz.post("fuzz-0-bbbbbb", "events", doc)
    assert r.status_code in (200, 400), r.text
    after = fuzz.store.stats()["events"]
    if r.status_code == 200:
        assert _protocol_validator("event_batch").is_valid(doc)
        assert r.json()["events"] == len(doc["events"]) and after - before == r.json()["stored"]
    else:
        assert after == before
        assert not _protocol_validator("event_batch").is_valid(doc) or any(
            e["at"] == "2026-02-30T00:00:00Z" for e in doc["events"])  # the schema cannot see impossible dates
        bad = {p.get("index") for p in r.json()["detail"]}
        events = doc["events"]
        assert bad <= set(range(len(events))) | {None}
        for index in bad - {None}:
            event = events[index]
            assert not _protocol_validator("event").is_valid(event) or event["at"] == "2026-02-30T00:00:00Z"


def test_machine_id_is_believed_only_with_the_provisioners_claim(tmp_path: Path) -> None:
    harness = Harness(tmp_path / "claims.db")
    strict = ControllerServer(harness.store, SECRET, None, "127.0.0.1", 0, require_machine_claim=True).start()
    try:
        client = httpx.Client(base_url=strict.url, timeout=10.0)

        def register(iid: str, **fields: Any) -> httpx.Response:
            doc = {"protocol": 1, "instance_id": iid, "at": "2026-12-02T17:59:30Z", **fields}
            return client.post(f"/api/v1/instances/{iid}/register", json=doc, headers=auth(iid))

        # A worker on machine 5 claiming to be machine 4242 (whose claim it does not have) is refused.
        forged = register("p-0-forged", machine_id="4242", machine_claim=machine_claim(SECRET, "p-0-forged", "5"))
        assert forged.status_code == 403 and "does not match machine_id '4242'" in forged.json()["detail"]
        # Another instance's genuine claim for that machine does not transfer.
        stolen = register("p-0-stolen", machine_id="4242", machine_claim=machine_claim(SECRET, "p-0-other", "4242"))
        assert stolen.status_code == 403
        unclaimed = register("p-0-unclaimed", machine_id="4242")
        assert unclaimed.status_code == 403 and "without machine_claim" in unclaimed.json()["detail"]
        assert harness.store.reports() == []

        assert register("p-0-noid").status_code == 200  # no machine id: nothing to vouch for, never judged
        good = register("p-0-good", machine_id="4242", machine_claim=machine_claim(SECRET, "p-0-good", "4242"))
        assert good.status_code == 200
        assert {r.instance_id: r.machine_id for r in harness.store.reports()} == {"p-0-noid": None, "p-0-good": "4242"}
        client.close()
    finally:
        strict.stop()
        harness.close()


def test_a_wrong_claim_is_refused_even_where_claims_are_optional(h: Harness) -> None:
    doc = {"protocol": 1, "instance_id": "p-1-x", "at": "2026-12-02T17:59:30Z", "machine_id": "4242",
           "machine_claim": "0" * 64}
    assert h.post("p-1-x", "register", doc).status_code == 403
    assert h.store.reports() == []

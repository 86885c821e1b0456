"""Controller HTTP API: where workers report, and where the loop and humans read what they said.

Workers (worker-image/entrypoint.sh) POST register / events / logs / result for their own instance with a
per-instance token (`reconciler.tokens`); the reconcile loop reads the store directly, humans and
`fleet status` use the small read API. Protocol: fleet-spec/schema/worker-protocol.v1.schema.json.

Every request is checked in this order, and the first failure answers with a JSON error
`{"error": "...", "detail": ...}` and stores nothing:
route (404/405) -> instance id (400) -> Authorization (401 missing/malformed, 403 valid-looking but not
for this instance) -> Content-Type (415) -> Content-Length (411/413, the body is never read past the
limit) -> UTF-8 + JSON (400) -> structure (400: depth, integer range, non-finite numbers, bad Unicode)
-> schema (400, JSON path + message) -> times and body/path id agreement (400) -> store: unknown instance
404, destroyed instance 410, different second result 409, event limit 422; database trouble 503
(temporary: the worker retries). Replay semantics are described in `reconciler.store`.

`/events` also takes an event batch, `{"protocol": 1, "events": [event, ...]}` (protocol v1, additive):
more events than the schema's maxItems is 413; every event is validated as a single one would be, and
problems name the event (`$.events[<index>]...`, `index`); one bad event or a refusal by the store
(event limit) rejects the whole batch and stores nothing. Batching is what makes 2,000 events/s cheap:
the per-request cost (HTTP, token, one transaction) is paid once per batch, not once per event.

Read/admin endpoints (`GET /api/...`, `POST .../destroyed`) need `Authorization: Bearer <admin token>`.
`allow_open_reads=True` lifts that for GETs only, for the local demo where the API listens on 127.0.0.1
and the logs it serves are already redacted; `/healthz` is always open.

Server: stdlib ThreadingHTTPServer, HTTP/1.1 keep-alive, socket timeouts against slow clients, a cap on
concurrent connections, quiet logging through `logging` (never bodies, never the Authorization header).
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import logging
import math
import re
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from functools import cache, lru_cache, partial
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonschema

from reconciler import SCHEMA_DIR
from reconciler.observations import BenchmarkResult, InstanceReport, PhaseEvent, format_time, parse_time
from reconciler.store import (
    ControllerStore,
    EventLimitExceeded,
    InstanceDestroyed,
    InstanceMeta,
    ResultConflict,
    UnknownInstance,
)
from reconciler.tokens import (
    bearer_token,
    check_secret,
    instance_token,
    is_well_formed_token,
    machine_claim,
    same_secret,
)

log = logging.getLogger(__name__)

PROTOCOL_SCHEMA_PATH = SCHEMA_DIR / "worker-protocol.v1.schema.json"
MAX_BODY_BYTES = 256 * 1024
DEFAULT_LOG_TAIL = 200
MAX_JSON_DEPTH = 32
MAX_SAFE_INTEGER = 2**53 - 1  # beyond this JSON numbers are not exact in most clients; and SQLite is 64-bit
REQUEST_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 256
MAX_REPORTED_PROBLEMS = 10
LINGER_SECONDS = 2.0
LINGER_MAX_BYTES = 4 * MAX_BODY_BYTES

INSTANCE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_WORKER_ROUTE = re.compile(r"^/api/v1/instances/(?P<id>[^/]+)/(?P<action>register|events|logs|result|destroyed)$")
_LOGS_ROUTE = re.compile(r"^/api/instance-logs/(?P<id>[^/]+)$")
_INSTANCE_ROUTE = re.compile(r"^/api/instances/(?P<id>[^/]+)$")

#: Which $defs of the protocol schema each worker endpoint accepts.
_KIND_BY_ACTION = {"register": "register", "events": "event", "logs": "log_batch", "result": "result"}
_TIME_FIELDS = ("at", "started_at")


class ApiError(Exception):
    """A request the API refuses. `close` = the connection cannot be reused (body left unread)."""

    def __init__(self, status: int, error: str, detail: Any = None, *, close: bool = False):
        super().__init__(error)
        self.status = status
        self.error = error
        self.detail = detail
        self.close = close


@dataclass(frozen=True)
class Response:
    status: int
    body: Mapping[str, Any]
    close: bool = False


@dataclass(frozen=True)
class Request:
    """What the API needs from an HTTP request; `read_body(n)` reads exactly n bytes (lazily, so nothing
    is read before the caller is authenticated and the length is within the limit)."""

    method: str
    target: str
    read_body: Callable[[int], bytes]
    authorization: str | None = None
    content_type: str | None = None
    content_lengths: tuple[str, ...] = ()
    transfer_encoding: str | None = None


# --- validation (pure) -------------------------------------------------------------------------------


@cache
def _protocol_validator(kind: str) -> jsonschema.Draft202012Validator:
    """Validator for one $defs entry with its local $refs inlined: same rules, half the time per request
    (resolving `$ref` through the registry dominated validation cost on the ingest path)."""
    defs = json.loads(PROTOCOL_SCHEMA_PATH.read_text(encoding="utf-8"))["$defs"]

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline({**defs[ref.removeprefix("#/$defs/")],
                               **{k: v for k, v in node.items() if k != "$ref"}})
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return jsonschema.Draft202012Validator(inline(defs[kind]))


def _json_path(parts: Any) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _clip(text: str, limit: int = 300) -> str:
    """Shorten from the middle: jsonschema messages put the (possibly huge) value first, the reason last."""
    return text if len(text) <= limit else f"{text[:limit // 2]} ... {text[-(limit // 2):]}"


def parse_json_body(raw: bytes) -> Any:
    """Bytes -> JSON value, or ApiError(400) naming the problem (encoding, syntax, NaN/Infinity, depth)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, "malformed JSON", f"body is not UTF-8: {exc}") from None

    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    try:
        return json.loads(text, parse_constant=no_constants)
    except json.JSONDecodeError as exc:
        raise ApiError(400, "malformed JSON", f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:
        raise ApiError(400, "malformed JSON", str(exc)) from None
    except RecursionError:
        raise ApiError(400, "malformed JSON", "nested too deeply") from None


def structure_problems(value: Any) -> list[dict[str, str]]:
    """What no schema can say: nesting depth, integers SQLite and clients can hold, finite numbers, text
    that is valid Unicode (JSON escapes can encode lone surrogates, which UTF-8 cannot store)."""
    problems: list[dict[str, str]] = []

    def bad_text(text: str) -> bool:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False

    def walk(node: Any, path: list[Any], depth: int) -> None:
        if len(problems) >= MAX_REPORTED_PROBLEMS:
            return
        if depth > MAX_JSON_DEPTH:
            problems.append({"path": _json_path(path), "message": f"nested deeper than {MAX_JSON_DEPTH} levels"})
        elif isinstance(node, str):
            if bad_text(node):
                problems.append({"path": _json_path(path), "message": "string is not valid Unicode (lone surrogate)"})
        elif isinstance(node, bool) or node is None:
            return
        elif isinstance(node, int):
            if abs(node) > MAX_SAFE_INTEGER:
                problems.append({"path": _json_path(path),
                                 "message": f"integer out of range (|n| <= {MAX_SAFE_INTEGER})"})
        elif isinstance(node, float):
            if not math.isfinite(node):
                problems.append({"path": _json_path(path), "message": "number is not finite"})
        elif isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, [*path, i], depth + 1)
        elif isinstance(node, dict):
            for key, item in node.items():
                if bad_text(key):
                    problems.append({"path": _json_path(path), "message": "object key is not valid Unicode"})
                    continue
                walk(item, [*path, key], depth + 1)

    walk(value, [], 0)
    return problems


@dataclass(frozen=True)
class _HotPathRules:
    """The protocol schema's rules for the two high-volume kinds, read from the schema file itself."""

    time: re.Pattern[str]
    phases: frozenset[str]
    statuses: frozenset[str]
    max_line: int
    max_lines: int
    max_tail: int
    max_message: int
    max_batch_events: int


@cache
def _hot_path_rules() -> _HotPathRules:
    defs = json.loads(PROTOCOL_SCHEMA_PATH.read_text(encoding="utf-8"))["$defs"]
    event, batch = defs["event"]["properties"], defs["log_batch"]["properties"]
    return _HotPathRules(
        time=re.compile(defs["time"]["pattern"]), phases=frozenset(event["phase"]["enum"]),
        statuses=frozenset(event["status"]["enum"]), max_line=batch["lines"]["items"]["maxLength"],
        max_lines=batch["lines"]["maxItems"], max_tail=defs["log_tail"]["maxItems"],
        max_message=event["message"]["maxLength"],
        max_batch_events=defs["event_batch"]["properties"]["events"]["maxItems"])


@cache
def _batch_envelope_validator() -> jsonschema.Draft202012Validator:
    """`event_batch` without its item rules and size limit: the events are checked one by one (so errors
    name their index and the fast check applies), and the size answers 413."""
    batch = json.loads(PROTOCOL_SCHEMA_PATH.read_text(encoding="utf-8"))["$defs"]["event_batch"]
    events = {k: v for k, v in batch["properties"]["events"].items() if k not in ("items", "maxItems")}
    return jsonschema.Draft202012Validator({**batch, "properties": {**batch["properties"], "events": events}})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _strings(value: Any, max_items: int, max_length: int) -> bool:
    return (isinstance(value, list) and len(value) <= max_items
            and all(isinstance(v, str) and len(v) <= max_length for v in value))


def fast_valid(kind: str, doc: Any) -> bool:
    """True only for documents the schema accepts (events and log batches, the ingest hot path).

    jsonschema costs ~10 us per array item; a 50-line batch spent more time in validation than in the
    store. This check is deliberately narrower than the schema: anything it does not recognise goes to
    jsonschema, which also writes the error messages. A property test holds it to "accepts => schema valid".
    """
    if not isinstance(doc, dict) or doc.get("protocol") != 1 or not _is_int(doc["protocol"]):
        return False
    rules = _hot_path_rules()
    if kind == "log_batch":
        return (doc.keys() <= {"protocol", "lines", "dropped"} and _strings(doc.get("lines"), rules.max_lines,
                                                                             rules.max_line)
                and ("dropped" not in doc or (_is_int(doc["dropped"]) and doc["dropped"] >= 0)))
    if kind == "event":
        message = doc.get("message")
        return (doc.keys() <= {"protocol", "phase", "status", "at", "exit_code", "message", "log_tail", "details"}
                and doc.get("phase") in rules.phases and doc.get("status") in rules.statuses
                and isinstance(doc.get("at"), str) and rules.time.match(doc["at"]) is not None
                and (doc.get("exit_code") is None or _is_int(doc["exit_code"]))
                and (message is None or (isinstance(message, str) and len(message) <= rules.max_message))
                and ("log_tail" not in doc or _strings(doc["log_tail"], rules.max_tail, rules.max_line))
                and isinstance(doc.get("details", {}), dict))
    return False


def _schema_problems(validator: jsonschema.Draft202012Validator, doc: Any) -> list[dict[str, Any]]:
    errors = sorted(validator.iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    return [{"path": _json_path(e.absolute_path), "message": _clip(e.message)} for e in errors]


def validate_report(kind: str, doc: Any) -> None:
    """Raise ApiError(400, "schema violation", [{path, message}, ...]) unless `doc` is a valid `kind`."""
    problems = structure_problems(doc)
    if not problems and not fast_valid(kind, doc):
        problems = _schema_problems(_protocol_validator(kind), doc)
    if not problems:
        for name in _TIME_FIELDS:
            if isinstance(doc.get(name), str):
                try:
                    parse_time(doc[name])
                except (ValueError, OverflowError) as exc:
                    problems.append({"path": f"$.{name}", "message": f"not a valid time: {exc}"})
    if problems:
        raise ApiError(400, "schema violation", problems[:MAX_REPORTED_PROBLEMS])


def is_event_batch(doc: Any) -> bool:
    """A body for /events is a batch when it has `events` (which no single event may have)."""
    return isinstance(doc, dict) and "events" in doc


def validate_event_batch(doc: Any) -> list[Any]:
    """The events of a valid `event_batch`, else ApiError: 413 when it holds more events than one request
    may, 400 "schema violation" for a bad envelope or for bad events, each problem naming its event
    (`index`, and the path `$.events[<index>]...`). One bad event refuses the whole batch."""
    limit = _hot_path_rules().max_batch_events
    events: Any = doc.get("events") if isinstance(doc, dict) else None
    if isinstance(events, list) and len(events) > limit:
        raise ApiError(413, "batch too large", f"{len(events)} events; the limit is {limit} per request, "
                                               "send the rest in another batch")
    if not (isinstance(events, list) and events and doc.keys() <= {"protocol", "events"}
            and doc.get("protocol") == 1 and _is_int(doc["protocol"])):
        envelope: list[dict[str, Any]] = structure_problems(doc) or _schema_problems(_batch_envelope_validator(), doc)
        if envelope:  # else the schema accepts what the quick check did not recognise (e.g. "protocol": 1.0)
            raise ApiError(400, "schema violation", envelope[:MAX_REPORTED_PROBLEMS])
    events = doc["events"]
    problems: list[dict[str, Any]] = []
    for index, event in enumerate(events):
        try:
            validate_report("event", event)
        except ApiError as exc:
            problems += [{**problem, "path": f"$.events[{index}]{problem['path'][1:]}", "index": index}
                         for problem in exc.detail]
            if len(problems) >= MAX_REPORTED_PROBLEMS:
                break
    if problems:
        raise ApiError(400, "schema violation", problems[:MAX_REPORTED_PROBLEMS])
    return events


# --- JSON views of the store (pure) ------------------------------------------------------------------


def _time(value: datetime | None) -> str | None:
    return None if value is None else format_time(value)


def event_to_json(event: PhaseEvent, received_at: datetime | None = None) -> dict[str, Any]:
    out = {"phase": event.phase, "status": event.status, "at": _time(event.at), "exit_code": event.exit_code,
           "message": event.message, "log_tail": list(event.log_tail), "details": dict(event.details)}
    if received_at is not None:
        out["received_at"] = _time(received_at)
    return out


def result_to_json(result: BenchmarkResult) -> dict[str, Any]:
    return {"outcome": result.outcome, "at": _time(result.at), "started_at": _time(result.started_at),
            "exit_code": result.exit_code, "requested": result.requested, "completed": result.completed,
            "failed": result.failed, "proofs_per_hour": result.proofs_per_hour,
            "seconds_per_proof": result.seconds_per_proof, "proof_type": result.proof_type,
            "concurrency": result.concurrency, "image_digest": result.image_digest,
            "log_tail": list(result.log_tail)}


def summary_to_json(report: InstanceReport) -> dict[str, Any]:
    """One row of `GET /api/instances`."""
    last = report.events[-1] if report.events else None
    failure = report.failure()
    return {
        "instance_id": report.instance_id, "pool": report.pool, "slot": report.slot,
        "machine_id": report.machine_id, "host_id": report.host_id, "gpu_name": report.gpu_name,
        "image_digest": report.image_digest, "registered_at": _time(report.registered_at),
        "last_event": None if last is None else {"phase": last.phase, "status": last.status, "at": _time(last.at)},
        "failed_phase": None if failure is None else failure.phase,
        "result": None if report.result is None else {"outcome": report.result.outcome,
                                                      "proofs_per_hour": report.result.proofs_per_hour},
        "dropped_log_lines": report.dropped_log_lines, "destroyed_at": _time(report.destroyed_at),
    }


def report_to_json(report: InstanceReport, meta: InstanceMeta | None = None) -> dict[str, Any]:
    """`GET /api/instances/{id}`: registration, lifecycle timeline, events, result and log tail."""
    received = meta.event_received_at if meta is not None else ()
    out = {
        **summary_to_json(report),
        "contract_id": report.contract_id, "image_version": report.image_version,
        "timeline": {name: _time(at) for name, at in report.phase_times().items()},
        "events": [event_to_json(e, received[i] if i < len(received) else None) for i, e in enumerate(report.events)],
        "result": None if report.result is None else result_to_json(report.result),
        "log_tail": list(report.log_tail),
    }
    if meta is not None:
        out.update({
            "worker_registered_at": _time(meta.worker_registered_at), "registrations": meta.registrations,
            "hostname": meta.hostname, "gpus": list(meta.gpus), "stored_log_lines": meta.stored_log_lines,
            "ring_dropped": meta.ring_dropped, "worker_dropped": meta.worker_dropped,
            "result_received_at": _time(meta.result_received_at),
        })
    return out


# --- the API (transport-independent) ------------------------------------------------------------------


class ControllerApi:
    """Routes a Request to the store. Knows nothing about sockets; the HTTP handler below is a shell."""

    def __init__(self, store: ControllerStore, secret: bytes, admin_token: str | None, *,
                 allow_open_reads: bool = False, max_body_bytes: int = MAX_BODY_BYTES,
                 now: Callable[[], datetime] | None = None, require_machine_claim: bool = False):
        self.store = store
        self.secret = check_secret(secret)
        self.admin_token = admin_token or None
        self.allow_open_reads = allow_open_reads
        self.require_machine_claim = require_machine_claim
        self.max_body_bytes = max_body_bytes
        self.now = now or store.clock
        # The token an instance must present, computed once per instance rather than once per request
        # (the HMAC is a tenth of the API's own cost on the single-event path). Bounded: ids are arbitrary.
        self._expected_token = lru_cache(maxsize=4096)(partial(instance_token, self.secret))

    def handle(self, request: Request) -> Response:
        try:
            return self._route(request)
        except ApiError as exc:
            if exc.status in (401, 403):
                log.warning("rejected %s %s: %s", request.method, urlsplit(request.target).path, exc.error)
            return Response(exc.status, {"error": exc.error, "detail": exc.detail}, close=exc.close)
        except sqlite3.Error as exc:
            log.error("store error on %s %s: %s", request.method, urlsplit(request.target).path, exc)
            return Response(503, {"error": "store unavailable", "detail": "temporary; retry later"})

    def _route(self, request: Request) -> Response:
        parts = urlsplit(request.target)
        path, method = parts.path, request.method
        if match := _WORKER_ROUTE.match(path):
            self._require_method(request, "POST")
            instance_id = self._instance_id(match["id"])
            if match["action"] == "destroyed":
                self._require_admin(request)
                return self._destroyed(instance_id)
            self._require_instance_token(request, instance_id)
            doc = self._json_body(request)
            return self._ingest(match["action"], instance_id, doc)
        if path == "/healthz":
            self._require_method(request, "GET")
            return Response(200, {"status": "ok", "instances": self.store.instance_count()})
        if path == "/api/instances":
            self._require_method(request, "GET")
            self._require_reader(request)
            return Response(200, {"instances": [summary_to_json(r) for r in self.store.reports()]})
        if match := _INSTANCE_ROUTE.match(path):
            self._require_method(request, "GET")
            instance_id = self._instance_id(match["id"])
            self._require_reader(request)
            found = self.store.detail(instance_id)
            if found is None:
                raise ApiError(404, "unknown instance", f"instance {instance_id!r} never registered")
            return Response(200, report_to_json(*found))
        if match := _LOGS_ROUTE.match(path):
            self._require_method(request, "GET")
            instance_id = self._instance_id(match["id"])
            self._require_reader(request)
            view = self.store.log_view(instance_id, self._tail_param(parts.query))
            if view is None:
                raise ApiError(404, "unknown instance", f"instance {instance_id!r} never registered")
            return Response(200, {"instance_id": view.instance_id, "lines": list(view.lines),
                                  "dropped": view.dropped, "destroyed_at": _time(view.destroyed_at)})
        raise ApiError(404, "not found", f"no endpoint {method} {_clip(path, 200)}", close=self.has_body(request))

    # --- checks ---

    @staticmethod
    def has_body(request: Request) -> bool:
        return bool(request.transfer_encoding) or any(v.strip() not in ("", "0") for v in request.content_lengths)

    def _require_method(self, request: Request, allowed: str) -> None:
        if request.method != allowed:
            raise ApiError(405, "method not allowed", f"use {allowed}", close=self.has_body(request))

    def _instance_id(self, raw: str) -> str:
        if not INSTANCE_ID.match(raw):
            raise ApiError(400, "invalid instance id",
                           f"{_clip(raw, 140)!r} does not match [A-Za-z0-9][A-Za-z0-9_.-]{{0,127}}", close=True)
        return raw

    def _presented(self, request: Request) -> str:
        token = bearer_token(request.authorization)
        if token is None:
            raise ApiError(401, "unauthorized", "expected header 'Authorization: Bearer <token>'", close=True)
        return token

    def _require_instance_token(self, request: Request, instance_id: str) -> None:
        token = self._presented(request)
        if not is_well_formed_token(token):
            raise ApiError(401, "unauthorized", "token is not 64 lowercase hex characters", close=True)
        if not same_secret(self._expected_token(instance_id), token):
            raise ApiError(403, "forbidden", f"token is not valid for instance {instance_id!r}", close=True)

    def _require_admin(self, request: Request) -> None:
        if self.admin_token is None:
            raise ApiError(403, "forbidden", "admin API disabled: the controller has no admin token", close=True)
        if not same_secret(self.admin_token, self._presented(request)):
            raise ApiError(403, "forbidden", "admin token is not valid", close=True)

    def _require_reader(self, request: Request) -> None:
        if not self.allow_open_reads:
            self._require_admin(request)

    def _tail_param(self, query: str) -> int:
        try:
            params = parse_qs(query, keep_blank_values=True, strict_parsing=False, max_num_fields=16)
        except ValueError as exc:
            raise ApiError(400, "bad query", str(exc)) from None
        values = params.get("tail", [str(DEFAULT_LOG_TAIL)])
        if len(values) != 1 or not re.fullmatch(r"[0-9]{1,9}", values[0]):
            raise ApiError(400, "bad query", "tail must be one non-negative integer")
        return min(int(values[0]), self.store.ring_lines)

    def _json_body(self, request: Request) -> Any:
        content_type = request.content_type or ""
        if content_type.split(";", 1)[0].strip().lower() != "application/json":
            raise ApiError(415, "unsupported media type",
                           f"Content-Type must be application/json, got {_clip(content_type, 100)!r}", close=True)
        if request.transfer_encoding:
            raise ApiError(411, "length required", "chunked bodies are not accepted; send Content-Length",
                           close=True)
        if not request.content_lengths:
            raise ApiError(411, "length required", "send Content-Length")
        if len(set(request.content_lengths)) != 1 or not re.fullmatch(r"[0-9]{1,12}", request.content_lengths[0]):
            raise ApiError(400, "bad Content-Length", "expected one non-negative integer", close=True)
        length = int(request.content_lengths[0])
        if length > self.max_body_bytes:
            raise ApiError(413, "body too large", f"{length} bytes; the limit is {self.max_body_bytes}", close=True)
        return parse_json_body(request.read_body(length))

    # --- effects ---

    def _check_machine_claim(self, instance_id: str, doc: Mapping[str, Any]) -> None:
        """A machine_id is believed only with the provisioner's claim for this instance (see tokens.py)."""
        machine, claim = doc.get("machine_id"), doc.get("machine_claim")
        if machine is None:
            return
        if claim is None:
            if self.require_machine_claim:
                raise ApiError(403, "forbidden", "machine_id without machine_claim: this controller only accepts "
                                                 "machine ids vouched for by the provisioner (FLEET_MACHINE_CLAIM)")
            return
        if not same_secret(machine_claim(self.secret, instance_id, machine), claim):
            raise ApiError(403, "forbidden", f"machine_claim does not match machine_id {machine!r} for instance "
                                             f"{instance_id!r}")

    def _ingest(self, action: str, instance_id: str, doc: Any) -> Response:
        if action == "events" and is_event_batch(doc):
            return self._ingest_event_batch(instance_id, validate_event_batch(doc))
        validate_report(_KIND_BY_ACTION[action], doc)
        try:
            if action == "register":
                if doc["instance_id"] != instance_id:
                    raise ApiError(400, "schema violation", [{"path": "$.instance_id", "message":
                                   f"{doc['instance_id']!r} does not match the instance in the path {instance_id!r}"}])
                self._check_machine_claim(instance_id, doc)
                return Response(200, {"status": self.store.register(instance_id, doc)})
            if action == "events":
                return Response(200, {"status": self.store.add_event(instance_id, doc)})
            if action == "logs":
                evicted = self.store.add_logs(instance_id, doc["lines"], doc.get("dropped", 0))
                return Response(200, {"status": "stored", "lines": len(doc["lines"]), "evicted": evicted})
            return Response(200, {"status": self.store.set_result(instance_id, doc)})
        except UnknownInstance as exc:
            raise ApiError(404, "unknown instance", f"{exc}; register first") from None
        except InstanceDestroyed as exc:
            raise ApiError(410, "instance destroyed", str(exc)) from None
        except ResultConflict as exc:
            raise ApiError(409, "result conflict", str(exc)) from None
        except EventLimitExceeded as exc:
            raise ApiError(422, "event limit reached", str(exc)) from None

    def _ingest_event_batch(self, instance_id: str, events: list[Any]) -> Response:
        try:
            statuses = self.store.add_events(instance_id, events)
        except UnknownInstance as exc:
            raise ApiError(404, "unknown instance", f"{exc}; register first") from None
        except InstanceDestroyed as exc:
            raise ApiError(410, "instance destroyed", str(exc)) from None
        except EventLimitExceeded as exc:
            raise ApiError(422, "event limit reached", f"{exc}; nothing of this batch was stored") from None
        stored = statuses.count("stored")
        return Response(200, {"status": "stored" if stored else "duplicate", "events": len(statuses),
                              "stored": stored, "duplicates": len(statuses) - stored})

    def _destroyed(self, instance_id: str) -> Response:
        if not self.store.mark_destroyed(instance_id, self.now()):
            raise ApiError(404, "unknown instance", f"instance {instance_id!r} never registered")
        view = self.store.log_view(instance_id, 0)
        return Response(200, {"status": "destroyed",
                              "destroyed_at": _time(view.destroyed_at) if view is not None else None})


# --- HTTP shell -------------------------------------------------------------------------------------------

#: Header limits of http.client.parse_headers, which this replaces on the request path.
MAX_HEADER_LINE = 65536
MAX_HEADERS = 100
#: RFC 9110 field-name (token) ':' OWS value OWS. Anything else in a request head is refused (400), as is
#: obsolete line folding: a lenient parser here is how request smuggling starts.
_HEADER_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*(.*?)[ \t]*\r?\n")
_PHRASES = {status.value: status.phrase for status in HTTPStatus}


class _Headers:
    """Request headers by lowercase name, the part of email.message.Message the handler uses (`get`,
    `get_all`). Parsing a head with the email package cost ~70 us, as much as a store write."""

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, list[str]]):
        self._values = values

    def get(self, name: str, default: str | None = None) -> str | None:
        values = self._values.get(name.lower())
        return values[0] if values else default

    def get_all(self, name: str) -> list[str] | None:
        return self._values.get(name.lower())


class _DateHeader:
    """`Date:` value, formatted once per second rather than per response."""

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def __call__(self) -> str:
        second = int(time.time())
        if second != self._second:
            self._text, self._second = email.utils.formatdate(second, usegmt=True), second
        return self._text


_http_date = _DateHeader()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fleet-controller/1"
    sys_version = ""
    server: _HttpServer
    headers: Any  # _Headers on the request path (the stdlib types it as email.message.Message)

    def parse_request(self) -> bool:
        """The request line by http.server's rules (same answers to bad lines), then the headers with
        `_read_headers` instead of the email package."""
        self.command = None  # type: ignore[assignment]  # as http.server: set in case of error on the first line
        self.request_version = self.default_request_version
        self.close_connection = True
        self.requestline = requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = requestline.split()
        if not words:
            return False
        if len(words) >= 3:
            version = words[-1]
            numbers = version[5:].split(".") if version.startswith("HTTP/") else []
            if len(numbers) != 2 or not all(n.isascii() and n.isdigit() and len(n) <= 10 for n in numbers):
                self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request version ({version!r})")
                return False
            if (int(numbers[0]), int(numbers[1])) >= (2, 0):
                self.send_error(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"Invalid HTTP version ({version[5:]})")
                return False
            self.close_connection = (int(numbers[0]), int(numbers[1])) < (1, 1)
            self.request_version = version
        if not 2 <= len(words) <= 3:
            self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request syntax ({requestline!r})")
            return False
        command, path = words[:2]
        if len(words) == 2:
            self.close_connection = True
            if command != "GET":
                self.send_error(HTTPStatus.BAD_REQUEST, f"Bad HTTP/0.9 request type ({command!r})")
                return False
        if path.startswith("//"):
            path = "/" + path.lstrip("/")  # as http.server (gh-87389): never an absolute URI without scheme
        self.command, self.path = command, path
        headers = self._read_headers()
        if headers is None:
            return False
        self.headers = headers
        connection = (headers.get("Connection") or "").lower()
        if connection == "close":
            self.close_connection = True
        elif connection == "keep-alive":
            self.close_connection = False
        if (headers.get("Expect") or "").lower() == "100-continue" and self.request_version >= "HTTP/1.1":
            return bool(self.handle_expect_100())
        return True

    def _read_headers(self) -> _Headers | None:
        values: dict[str, list[str]] = {}
        count = 0
        while True:
            line = self.rfile.readline(MAX_HEADER_LINE + 1)
            if len(line) > MAX_HEADER_LINE:
                self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long", "header line")
                return None
            if line in (b"\r\n", b"\n", b""):
                return _Headers(values)
            count += 1
            if count > MAX_HEADERS:
                self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers",
                                f"got more than {MAX_HEADERS} headers")
                return None
            match = _HEADER_LINE.fullmatch(line)
            if match is None:
                self.send_error(HTTPStatus.BAD_REQUEST, "Bad header line",
                                f"{_clip(line.decode('iso-8859-1').rstrip(), 100)!r} is not 'Name: value'")
                return None
            values.setdefault(match[1].decode("ascii").lower(), []).append(match[2].decode("iso-8859-1"))

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.request_timeout)  # idle keep-alive and slow bodies end
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _read_exactly(self, length: int) -> bytes:
        chunks, remaining = [], length
        try:
            while remaining > 0:
                chunk = self.rfile.read(remaining)
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
        except TimeoutError:
            raise ApiError(408, "request timeout", "body not received in time", close=True) from None
        if remaining:
            raise ApiError(400, "incomplete body", f"got {length - remaining} of {length} bytes", close=True)
        return b"".join(chunks)

    def _serve(self) -> None:
        consumed = False

        def read_body(length: int) -> bytes:
            nonlocal consumed
            consumed = True
            return self._read_exactly(length)

        request = Request(method=self.command, target=self.path, read_body=read_body,
                          authorization=self.headers.get("Authorization"),
                          content_type=self.headers.get("Content-Type"),
                          content_lengths=tuple(v.strip() for v in self.headers.get_all("Content-Length") or ()),
                          transfer_encoding=self.headers.get("Transfer-Encoding"))
        try:
            response = self.server.api.handle(request)
        except Exception:
            log.exception("internal error on %s %s", self.command, urlsplit(self.path).path)
            response = Response(500, {"error": "internal error", "detail": None}, close=True)
        if not consumed and ControllerApi.has_body(request):
            # The unread body would be parsed as the next request: this connection cannot be reused.
            response = replace(response, close=True)
        self._send(response)

    do_GET = do_POST = _serve

    def __getattr__(self, name: str) -> Any:
        # Any other method (PUT, BREW, ...) gets a JSON 404/405 from the router, not http.server's 501.
        if name.startswith("do_"):
            return self._serve
        raise AttributeError(name)

    def do_HEAD(self) -> None:
        self._send(Response(405, {}, close=True), head=True)

    def _send(self, response: Response, head: bool = False) -> None:
        body = json.dumps(response.body, ensure_ascii=True).encode("ascii")
        if log.isEnabledFor(logging.DEBUG):
            self.log_request(response.status)
        head_lines = [f"{self.protocol_version} {response.status} {_PHRASES.get(response.status, 'Error')}",
                      f"Server: {self.version_string()}", f"Date: {_http_date()}", "Content-Type: application/json",
                      f"Content-Length: {len(body)}", "Cache-Control: no-store"]
        if response.close:
            head_lines.append("Connection: close")
            self.close_connection = True
        # One write for status, headers and body: one TCP segment, one wakeup of the client.
        self.wfile.write(("\r\n".join(head_lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else body))
        if response.close:
            self._linger()

    def _linger(self) -> None:
        """Before closing on an unread body, half-close and drain it for a moment (bounded bytes and time):
        closing with unread data makes the kernel send RST, which can destroy the error response before
        the client reads it (a worker would see "connection reset" instead of "413 body too large")."""
        with contextlib.suppress(OSError):
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(LINGER_SECONDS)
            deadline = time.monotonic() + LINGER_SECONDS
            drained = 0
            while drained < LINGER_MAX_BYTES and time.monotonic() < deadline:
                chunk = self.connection.recv(65536)
                if not chunk:
                    break
                drained += len(chunk)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Protocol-level errors raised by http.server itself (bad request line, headers too long): JSON too."""
        self.close_connection = True
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "error"
        body = json.dumps({"error": message or phrase, "detail": explain}, ensure_ascii=True).encode("ascii")
        self.send_response(code, phrase)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and code >= 200 and code not in (204, 304):
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], api: ControllerApi, request_timeout: float, max_connections: int):
        self.api = api
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            full = len(self._open) >= self.max_connections
            if not full:
                self._open.add(request)
        if full:
            log.warning("refusing connection from %s: %d connections open", client_address[0], self.max_connections)
            super().shutdown_request(request)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def close_all_connections(self) -> None:
        with self._open_lock:
            connections = list(self._open)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s ended with an error", client_address[0], exc_info=True)


class ControllerServer:
    """The controller API on a real socket. `port=0` picks a free port; `url` tells which."""

    def __init__(self, store: ControllerStore, secret: bytes, admin_token: str | None, host: str = "127.0.0.1",
                 port: int = 0, *, allow_open_reads: bool = False, max_body_bytes: int = MAX_BODY_BYTES,
                 request_timeout: float = REQUEST_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS,
                 now: Callable[[], datetime] | None = None, require_machine_claim: bool = False):
        self.api = ControllerApi(store, secret, admin_token, allow_open_reads=allow_open_reads,
                                 max_body_bytes=max_body_bytes, now=now, require_machine_claim=require_machine_claim)
        self.host, self.port = host, port
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        self._server: _HttpServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("controller server is not started")
        host, port = self._server.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}"

    def start(self) -> ControllerServer:
        if self._server is not None:
            return self
        self._server = _HttpServer((self.host, self.port), self.api, self.request_timeout, self.max_connections)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="controller-http", daemon=True)
        self._thread.start()
        log.info("controller listening on %s", self.url)
        return self

    def serve_forever(self) -> None:
        """Run in the calling thread until stop() is called from another (the CLI's signal handler)."""
        self.start()
        assert self._thread is not None
        self._thread.join()

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
        server.shutdown()
        server.close_all_connections()
        server.server_close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> ControllerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""Worker protocol v1 at the controller's edge: JSON parsing with limits, schema validation, JSON views.

The contract is fleet-spec/schema/worker-protocol.v1.schema.json; everything here is pure but for the
schema file read once. Used by the API (`api.py`) before anything reaches the store.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

import jsonschema

from reconciler import SCHEMA_DIR
from reconciler.adapters.store.port import InstanceMeta
from reconciler.domain.observations import BenchmarkResult, InstanceReport, PhaseEvent, format_time, parse_time

PROTOCOL_SCHEMA_PATH = SCHEMA_DIR / "worker-protocol.v1.schema.json"
MAX_BODY_BYTES = 256 * 1024
DEFAULT_LOG_TAIL = 200
MAX_JSON_DEPTH = 32
MAX_SAFE_INTEGER = 2**53 - 1  # beyond this JSON numbers are not exact in most clients; and SQLite is 64-bit
MAX_REPORTED_PROBLEMS = 10

INSTANCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")

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


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


#: Built once: `json.loads` with an option builds a new JSONDecoder (and its scanner) on every call.
_JSON_DECODER = json.JSONDecoder(parse_constant=_no_constants)


def parse_json_body(raw: bytes) -> Any:
    """Bytes -> JSON value, or ApiError(400) naming the problem (encoding, syntax, NaN/Infinity, depth)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, "malformed JSON", f"body is not UTF-8: {exc}") from None
    if text.startswith("\ufeff"):  # json.loads's own check, which JSONDecoder.decode does not make
        raise ApiError(400, "malformed JSON", "Unexpected UTF-8 BOM (decode using utf-8-sig) at line 1 column 1")
    try:
        return _JSON_DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise ApiError(400, "malformed JSON", f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:
        raise ApiError(400, "malformed JSON", str(exc)) from None
    except RecursionError:
        raise ApiError(400, "malformed JSON", "nested too deeply") from None


def _structure_sound(node: Any, depth: int = 0) -> bool:
    """True only if `structure_problems` finds nothing: the same rules without building paths (the ingest
    hot path checks every event; the path of each node cost more than the check). False may also mean
    "not sure" (an unexpected type): the full walk then decides and writes the messages."""
    kind = type(node)
    if depth > MAX_JSON_DEPTH:
        return False
    if kind is str:
        return node.isascii() or _is_utf8_text(node)
    if kind is int:
        return -MAX_SAFE_INTEGER <= node <= MAX_SAFE_INTEGER
    if kind is bool or node is None:
        return True
    if kind is float:
        return math.isfinite(node)
    if kind is dict:
        depth += 1
        for key, item in node.items():
            if type(key) is not str or not (key.isascii() or _is_utf8_text(key)):
                return False
            if type(item) is str:  # most values: checked here rather than by a call
                if not (item.isascii() or _is_utf8_text(item)):
                    return False
            elif not _structure_sound(item, depth):
                return False
        return depth <= MAX_JSON_DEPTH or not node
    if kind is list:
        depth += 1
        for item in node:
            if type(item) is str:
                if not (item.isascii() or _is_utf8_text(item)):
                    return False
            elif not _structure_sound(item, depth):
                return False
        return depth <= MAX_JSON_DEPTH or not node
    return False


def _is_utf8_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def structure_problems(value: Any) -> list[dict[str, str]]:
    """What no schema can say: nesting depth, integers SQLite and clients can hold, finite numbers, text
    that is valid Unicode (JSON escapes can encode lone surrogates, which UTF-8 cannot store)."""
    return [] if _structure_sound(value) else _structure_walk(value)


def _structure_walk(value: Any) -> list[dict[str, str]]:
    """`structure_problems` the slow way, with the path of every problem."""
    problems: list[dict[str, str]] = []

    def walk(node: Any, path: list[Any], depth: int) -> None:
        if len(problems) >= MAX_REPORTED_PROBLEMS:
            return
        if depth > MAX_JSON_DEPTH:
            problems.append({"path": _json_path(path), "message": f"nested deeper than {MAX_JSON_DEPTH} levels"})
        elif isinstance(node, str):
            if not _is_utf8_text(node):
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
                if not _is_utf8_text(key):
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
                and isinstance(doc.get("at"), str) and rules.time.fullmatch(doc["at"]) is not None
                and (doc.get("exit_code") is None or _is_int(doc["exit_code"]))
                and (message is None or (isinstance(message, str) and len(message) <= rules.max_message))
                and ("log_tail" not in doc or _strings(doc["log_tail"], rules.max_tail, rules.max_line))
                and isinstance(doc.get("details", {}), dict))
    return False


def _schema_problems(validator: jsonschema.Draft202012Validator, doc: Any) -> list[dict[str, Any]]:
    errors = sorted(validator.iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    return [{"path": _json_path(e.absolute_path), "message": _clip(e.message)} for e in errors]


def validate_report(kind: str, doc: Any, *, structure_checked: bool = False) -> None:
    """Raise ApiError(400, "schema violation", [{path, message}, ...]) unless `doc` is a valid `kind`.
    `structure_checked`: the caller found the structure sound already."""
    problems = [] if structure_checked else structure_problems(doc)
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
    # One structure check for the whole batch (the events sit two levels down: depth counts from each
    # event, as when each is checked alone); then each event as a single one would be.
    sound = _structure_sound(events, -1)
    for index, event in enumerate(events):
        try:
            validate_report("event", event, structure_checked=sound)
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
    out = {"phase": event.phase, "status": event.status, "at": _time(event.at), "worker_at": _time(event.worker_at),
           "exit_code": event.exit_code,
           "message": event.message, "log_tail": list(event.log_tail), "details": dict(event.details)}
    if received_at is not None:
        out["received_at"] = _time(received_at)
    return out


def result_to_json(result: BenchmarkResult) -> dict[str, Any]:
    return {"outcome": result.outcome, "at": _time(result.at), "worker_at": _time(result.worker_at),
            "started_at": _time(result.started_at),
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
        "clock": "controller",  # timeline, event and result times: the controller's clock (arrival)
        "worker_clock_skew_s": report.clock_skew_s,
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

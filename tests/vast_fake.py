"""A local fake of the vast.ai REST API: a real HTTP server on 127.0.0.1, for tests and the infra helper.

It speaks the shapes the real API speaks (see reconciler/marketplace/vastai.py for the sources):
`POST /api/v0/bundles/` evaluates the `{field: {op: value}}` query for real (eq neq gt gte lt lte in
notin), orders and limits; `PUT /api/v0/asks/{id}/` rents an offer and answers `new_contract`;
`GET /api/v1/instances/` pages with `limit`/`after_token`/`next_token`; `GET /api/v0/instances/` lists
all (the older shape); `GET|DELETE /api/v0/instances/{id}/`. Every request is recorded (method, path,
query, headers, JSON body) so tests assert exactly what a client sent. Faults are scripted per request:
429 with Retry-After, 5xx, garbage bodies, or answers held back past a client's read timeout.

Usage:
    with VastFake(api_key="k", offers=default_offers()) as fake:
        client = VastAiMarketplace("k", base_url=fake.base_url)
"""

from __future__ import annotations

import base64
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

ONSTART_MAX_CHARS = 4048
_QUERY_KEYWORDS = {"order", "limit", "type", "allocated_storage", "disable_bundling"}
_OPS = {"eq", "neq", "gt", "gte", "lt", "lte", "in", "notin"}


def make_offer(
    offer_id: int,
    machine_id: int,
    host_id: int,
    gpu_name: str = "RTX 4090",
    **overrides: Any,
) -> dict[str, Any]:
    """A realistic `/bundles/` offer row. Override any field; pass None to drop one."""
    offer: dict[str, Any] = {
        "id": offer_id,
        "ask_contract_id": offer_id,
        "bundle_id": offer_id + 1_000_000,
        "machine_id": machine_id,
        "host_id": host_id,
        "gpu_name": gpu_name,
        "num_gpus": 1,
        "gpu_ram": 24564 if gpu_name == "RTX 4090" else 24467,
        "gpu_arch": "nvidia",
        "compute_cap": 890 if gpu_name == "RTX 4090" else 1200,
        "cuda_max_good": 12.8,
        "driver_version": "570.133.07",
        "cpu_name": "AMD EPYC 7B13 64-Core Processor",
        "cpu_cores_effective": 16.0,
        "cpu_ram": 257_000,
        "disk_space": 500.0,
        "disk_bw": 3200.0,
        "inet_down": 900.0,
        "inet_up": 800.0,
        "direct_port_count": 20,
        "dph_base": 0.35,
        "dph_total": 0.402,
        "reliability": 0.991,
        "reliability2": 0.991,
        "verified": True,
        "verification": "verified",
        "rentable": True,
        "rented": False,
        "external": False,
        "geolocation": "Norway, NO",
        "score": 210.0,
    }
    for key, value in overrides.items():
        if value is None:
            offer.pop(key, None)
        else:
            offer[key] = value
    return offer


def default_offers() -> list[dict[str, Any]]:
    """A small market: three RTX 4090 machines (one host owns two), an RTX PRO 4000, and poor listings."""
    return [
        make_offer(9001, 41001, 501, dph_total=0.45),
        make_offer(9002, 41002, 501, dph_total=0.38, geolocation="Sweden, SE"),
        make_offer(9003, 41003, 502, dph_total=0.52, cpu_ram=515_000),
        make_offer(9004, 52001, 503, gpu_name="RTX PRO 4000", dph_total=0.29, cuda_max_good=12.9),
        make_offer(9005, 41004, 504, dph_total=0.31, reliability=0.81, reliability2=0.81),
        make_offer(9006, 41005, 505, dph_total=0.33, verified=False, verification="unverified"),
        make_offer(9007, 41006, 506, dph_total=0.36, cpu_ram=64_000),
    ]


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-cased names
    body: Any  # parsed JSON, None when there was no body, the raw text when it was not JSON


@dataclass
class Fault:
    """What to do instead of (or on top of) the normal answer.

    kind: "status" (answer `status` with `body` JSON and `headers`), "garbage" (do the work, then 200
    with a non-JSON body), "slow" (do the work, then hold the answer for `delay_s` before sending it), "drop" (close
    the connection without an answer, after doing the work).
    """

    kind: str
    status: int = 500
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    method: str | None = None
    path_prefix: str | None = None
    remaining: int = 1
    #: For "status": do the work first (a proxy's 502 after the backend acted). "slow", "drop" and
    #: "garbage" always do the work first: their point is an answer lost after the fact.
    after_work: bool = False

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and (
            self.path_prefix is None or path.startswith(self.path_prefix)
        )


@dataclass
class FakeInstance:
    row: dict[str, Any]
    script: list[str] = field(default_factory=list)  # statuses still to report, one per read


def _compare(value: Any, op: str, operand: Any) -> bool:
    if op == "eq":
        return bool(value == operand)
    if op == "neq":
        return bool(value != operand)
    if op == "in":
        return value in operand
    if op == "notin":
        return value not in operand
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return {
        "gt": value > operand,
        "gte": value >= operand,
        "lt": value < operand,
        "lte": value <= operand,
    }[op]


def _sort_key(name: str) -> Callable[[Mapping[str, Any]], tuple[int, Any]]:
    """Offers missing the field sort last (and never compare None with a number)."""

    def key(offer: Mapping[str, Any]) -> tuple[int, Any]:
        value = offer.get(name)
        return (1, 0) if value is None else (0, value)

    return key


class QueryError(ValueError):
    pass


def offer_matches(offer: Mapping[str, Any], query: Mapping[str, Any], ignored: Iterable[str] = ()) -> bool:
    """Evaluate a `/bundles/` query on one offer, as the real API does: every clause must hold.

    `ignored` names fields the server pretends not to know (the real API only warns on unknown fields).
    """
    skip = set(ignored)
    for name, clause in query.items():
        if name in _QUERY_KEYWORDS or name in skip:
            continue
        if not isinstance(clause, Mapping):
            raise QueryError(f"clause for {name} is not an object")
        for op, operand in clause.items():
            if op not in _OPS:
                raise QueryError(f"unknown operator {op!r} on {name}")
            if op in ("in", "notin") and not isinstance(operand, list):
                raise QueryError(f"{op} on {name} needs a list")
            if name not in offer:
                return False
            if not _compare(offer[name], op, operand):
                return False
    return True


class VastFake:
    """The fake server. Thread-safe; start with `with` or start()/stop()."""

    def __init__(
        self,
        api_key: str = "test-vast-key",
        offers: Iterable[Mapping[str, Any]] | None = None,
        *,
        page_size: int = 25,
        new_instance_script: Sequence[str] = ("loading", "running"),
    ):
        self.api_key = api_key
        self.offers: dict[int, dict[str, Any]] = {int(o["id"]): dict(o) for o in (offers or default_offers())}
        self.instances: dict[int, FakeInstance] = {}
        self.requests: list[RecordedRequest] = []
        self.page_size = page_size
        #: Query fields the search pretends not to know, to test a client's own filtering.
        self.ignored_fields: set[str] = set()
        self.new_instance_script = list(new_instance_script)
        self._faults: list[Fault] = []
        self._ids = itertools.count(7_100_001)
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def root_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/api/v0"

    def start(self) -> VastFake:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="vast-fake", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> VastFake:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- scripting ------------------------------------------------------------------------------

    def inject(self, fault: Fault) -> None:
        """Queue a fault; it applies to the next `fault.remaining` matching requests."""
        with self._lock:
            self._faults.append(fault)

    def rate_limit_next(self, n: int = 1, retry_after: float | str = 2, **match: Any) -> None:
        body = {"success": False, "error": "rate_limited", "msg": "API requests too frequent"}
        self.inject(Fault("status", 429, body, {"Retry-After": str(retry_after)}, remaining=n, **match))

    def fail_next(
        self, n: int = 1, status: int = 500, body: Any = None, *, after_work: bool = False, **match: Any
    ) -> None:
        default = {"success": False, "error": "server_error", "msg": "Internal Server Error"}
        payload = default if body is None else body
        self.inject(Fault("status", status, payload, remaining=n, after_work=after_work, **match))

    def garbage_next(self, n: int = 1, **match: Any) -> None:
        self.inject(Fault("garbage", remaining=n, **match))

    def slow_next(self, n: int = 1, delay_s: float = 2.0, **match: Any) -> None:
        self.inject(Fault("slow", delay_s=delay_s, remaining=n, **match))

    def drop_next(self, n: int = 1, **match: Any) -> None:
        self.inject(Fault("drop", remaining=n, **match))

    def script_status(self, contract_id: int | str, statuses: Sequence[str]) -> None:
        """The instance reports these statuses on its next reads (one per GET/list), then the last."""
        with self._lock:
            self.instances[int(contract_id)].script = list(statuses)

    def set_status(self, contract_id: int | str, actual_status: str | None, status_msg: str | None = None) -> None:
        with self._lock:
            instance = self.instances[int(contract_id)]
            instance.script = []
            instance.row["actual_status"] = actual_status
            if status_msg is not None:
                instance.row["status_msg"] = status_msg

    def add_instance(self, **row: Any) -> int:
        """Put an instance in the account directly (e.g. one a previous run created)."""
        with self._lock:
            contract_id = next(self._ids)
            base = {
                "id": contract_id,
                "machine_id": 41999,
                "host_id": 599,
                "actual_status": "running",
                "intended_status": "running",
                "label": None,
                "gpu_name": "RTX 4090",
                "num_gpus": 1,
                "dph_total": 0.4,
                "start_date": time.time(),
                "image_uuid": "example/worker@sha256:" + "0" * 64,
                "status_msg": None,
                "extra_env": [],
            }
            base.update(row)
            base["id"] = contract_id
            self.instances[contract_id] = FakeInstance(base)
            return contract_id

    def requests_to(self, method: str, path_prefix: str) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.method == method and r.path.startswith(path_prefix)]

    # -- request handling ------------------------------------------------------------------------

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.remaining > 0 and fault.matches(method, path):
                    fault.remaining -= 1
                    return fault
        return None

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        parts = [p for p in path.split("/") if p]
        with self._lock:
            if parts[:2] == ["api", "v0"]:
                rest = parts[2:]
                if method == "POST" and rest == ["bundles"]:
                    return self._search(body)
                if method == "PUT" and len(rest) == 2 and rest[0] == "asks":
                    return self._create(rest[1], body)
                if method == "GET" and rest == ["instances"]:
                    return 200, {"instances": [self._report(i) for i in sorted(self.instances)]}
                if len(rest) == 2 and rest[0] == "instances" and method in ("GET", "DELETE"):
                    return self._one(method, rest[1])
            if parts[:2] == ["api", "v1"] and parts[2:] == ["instances"] and method == "GET":
                return self._page(query)
        return 404, {"success": False, "error": "not_found", "msg": f"no route {method} {path}"}

    def _search(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, Mapping):
            return 400, {"success": False, "error": "invalid_args", "msg": "query must be a JSON object"}
        if body.get("type", "on-demand") not in ("on-demand", "bid", "reserved"):
            return 400, {"success": False, "error": "invalid_args", "msg": f"bad type {body.get('type')!r}"}
        try:
            found = [o for o in self.offers.values() if offer_matches(o, body, self.ignored_fields)]
        except QueryError as exc:
            return 400, {"success": False, "error": "invalid_args", "msg": str(exc)}
        for key, direction in reversed(body.get("order") or []):
            found.sort(key=_sort_key(str(key)), reverse=direction == "desc")
        limit = body.get("limit")
        if isinstance(limit, int) and limit >= 0:
            found = found[:limit]
        return 200, {"offers": found}

    def _create(self, ask_id: str, body: Any) -> tuple[int, Any]:
        gone = 404, {"success": False, "error": "no_such_ask", "msg": f"Instance type by id {ask_id} is not available."}
        offer = self.offers.get(int(ask_id)) if ask_id.isdigit() else None
        if offer is None or not offer.get("rentable") or offer.get("rented"):
            return gone
        if not isinstance(body, Mapping) or not isinstance(body.get("image"), str) or not body["image"]:
            return 400, {"success": False, "error": "invalid_args", "msg": "image is required"}
        env = body.get("env", {})
        if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
            return 400, {"success": False, "error": "invalid_args", "msg": "env must be an object of strings"}
        onstart = body.get("onstart")
        if isinstance(onstart, str) and len(onstart) > ONSTART_MAX_CHARS:
            return 400, {"success": False, "error": "invalid_args", "msg": "onstart script is too long"}
        contract_id = next(self._ids)
        offer["rented"] = True
        offer["rentable"] = False
        row = {
            "id": contract_id,
            "machine_id": offer["machine_id"],
            "host_id": offer["host_id"],
            "actual_status": None,
            "intended_status": "running",
            "cur_state": "running",
            "label": body.get("label"),
            "gpu_name": offer["gpu_name"],
            "num_gpus": offer["num_gpus"],
            "dph_total": offer["dph_total"],
            "reliability2": offer.get("reliability2"),
            "start_date": time.time(),
            "image_uuid": body["image"],
            "image_runtype": body.get("runtype"),
            "disk_space": body.get("disk"),
            "onstart": onstart,
            "status_msg": None,
            "extra_env": [[k, v] for k, v in env.items()],
            "_ask_id": int(ask_id),
        }
        self.instances[contract_id] = FakeInstance(row, list(self.new_instance_script))
        return 200, {"success": True, "new_contract": contract_id, "instance_api_key": "inst-" + str(contract_id)}

    def _report(self, contract_id: int) -> dict[str, Any]:
        instance = self.instances[contract_id]
        if instance.script:
            instance.row["actual_status"] = instance.script.pop(0) if len(instance.script) > 1 else instance.script[0]
        return {k: v for k, v in instance.row.items() if not k.startswith("_")}

    def _one(self, method: str, raw_id: str) -> tuple[int, Any]:
        contract_id = int(raw_id) if raw_id.isdigit() else -1
        if method == "GET":
            if contract_id not in self.instances:
                return 200, {"instances": None}
            return 200, {"instances": self._report(contract_id)}
        if contract_id not in self.instances:
            return 404, {"success": False, "error": "no_such_instance", "msg": f"Instance {raw_id} not found."}
        instance = self.instances.pop(contract_id)
        offer = self.offers.get(instance.row.get("_ask_id", -1))
        if offer is not None:
            offer["rented"] = False
            offer["rentable"] = True
        return 200, {"success": True}

    def _page(self, query: dict[str, list[str]]) -> tuple[int, Any]:
        try:
            limit = int(query.get("limit", ["25"])[0])
        except ValueError:
            return 400, {"success": False, "error": "invalid_args", "msg": "limit must be an integer"}
        limit = max(1, min(limit, 25, self.page_size))
        after = 0
        if "after_token" in query:
            try:
                after = int(json.loads(base64.urlsafe_b64decode(query["after_token"][0]))["values"]["id"])
            except (ValueError, KeyError, TypeError):
                return 400, {"success": False, "error": "invalid_args", "msg": "bad after_token"}
        ids = [i for i in sorted(self.instances) if i > after]
        page = ids[:limit]
        token = None
        if len(ids) > limit:
            token = base64.urlsafe_b64encode(json.dumps({"values": {"id": page[-1]}}).encode()).decode()
        return 200, {
            "instances": [self._report(i) for i in page],
            "next_token": token,
            "total_instances": len(self.instances),
        }

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass  # tests assert on fake.requests, not on stderr

            def _handle(self) -> None:
                split = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body: Any = None
                if raw:
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        body = raw.decode("utf-8", "replace")
                record = RecordedRequest(
                    method=self.command,
                    path=split.path,
                    query=parse_qs(split.query),
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=body,
                )
                with fake._lock:
                    fake.requests.append(record)
                if self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                    self._send(401, {"success": False, "error": "auth_error", "msg": "Invalid user key"})
                    return
                fault = fake._take_fault(self.command, split.path)
                if fault is not None and fault.kind == "status" and not fault.after_work:
                    self._send(fault.status, fault.body, fault.headers)
                    return
                status, payload = fake._route(self.command, split.path, record.query, body)
                if fault is not None and fault.kind == "status":
                    self._send(fault.status, fault.body, fault.headers)
                    return
                if fault is not None and fault.kind == "slow":
                    # The work is done; only the answer is late, as when a real server is overloaded.
                    fake._stopping.wait(fault.delay_s)
                if fault is not None and fault.kind == "drop":
                    self.close_connection = True
                    return
                if fault is not None and fault.kind == "garbage":
                    self._send_raw(200, b"<html><body>502 Bad Gateway</body></html>", "text/html")
                    return
                self._send(status, payload)

            def _send(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
                self._send_raw(status, json.dumps(payload).encode(), "application/json", headers)

            def _send_raw(
                self, status: int, data: bytes, content_type: str, headers: Mapping[str, str] | None = None
            ) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (its timeout); nothing to answer

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        return Handler

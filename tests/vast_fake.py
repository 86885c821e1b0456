"""A strict fake of the vast.ai REST API: a real HTTP server on 127.0.0.1, one for every test that needs vast.ai.

Strict means at least as strict as the real API (each rule below cites its source,
as reconciler's vast.ai adapter does). What it enforces:
- auth on EVERY route: `Authorization: Bearer KEY`. Unknown or deleted key -> 401 "Invalid user key", except the
  search `POST /api/v0/bundles/`, which answers a bad or missing key with **404** "Invalid user key" (vast-ai/docs
  api-reference/openapi/yaml/search_offers.yaml @c624622622496828c1ae58edec481bba1f5d675d); a key whose
  session expired -> **404** "Session expired. Please log in again." (vast-cli vast.py, the 404 is real); a scoped
  key without the permission of the route (`misc` search, `instance_read` show/list, `instance_write`
  create/destroy, `user_read` users/current) -> 403. Keys can be revoked or expired mid-run
  (`revoke_key(key, after_requests=N)`), and each key sees only its own account's instances.
- real paths and body shapes, and it refuses what the real API refuses: unknown search fields/operators, create
  bodies with unknown keys or wrong types, `client_id` other than "me", oversized onstart, unknown runtype.
- rate limits per key and endpoint, on an injected clock (`VirtualClock`, shared with the client under test):
  create at most one per 4.5 s with a 12 s penalty when exceeded; reads at most 5 a second per endpoint. A
  429 carries no Retry-After and its body is plain text "API requests too frequent: endpoint threshold=..."
  (docs.vast.ai, rate limits and errors).
- slow creates and creates that commit after the client gave up (`late_commit_next`): the offer is taken at
  once, the answer is held back past the client's timeout, and the instance appears in lists only once the
  fake clock passes its commit time.
- every `actual_status` (None, created, scheduling, loading, running, stopped, frozen, exited, rebooting,
  unknown, offline) with consistent `intended_status`/`cur_state`, set at once (`set_status`), per read
  (`script_status`) or on the clock (`schedule_status`, `new_instance_timeline`).
- "offer taken" races (`stale_offer`: listed in search, gone on create -> 404 `no_such_ask`).
- search as the current API reference has it (issue 23: vast-ai/docs `api-reference/openapi/yaml/`, the search
  reference and the `auto_*` files generated from the backend): `rented` is no server-side filter (the server
  drops the key; the official CLI filters the rows itself: vast-ai/vast-cli vast.py search__offers
  @55679830a2c2adcf5c7fad08bf08717a9591062a), an answer cut short carries `truncated: true`, and the daily search
  row quota answers 429 `search_quota_exceeded` with `Retry-After` in seconds, possibly hours
  (`exhaust_search_quota`). The last two are from the issue's reading of the current reference; the snapshots
  readable here (vast-ai/docs @4c1c6573188557cd4a630a578236cdb4f62c9f40, auto_post_api_v0_bundles_32b4bb.yaml)
  do not show them yet, so their body texts are ASSUMED (the adapter relies on the `error` code and the header).
- DELETE of a missing instance: 404 `no_such_instance` "Instance {id} not found." (auto_delete_api_v0_instances_id
  _4ff617.yaml @4c1c6573); show of a missing one: 200 `{"instances": null}` (auto_get_api_v0_instances_id_4ff617).
Every request is recorded (method, path, query, headers, JSON body, the status answered). Scripted faults:
5xx (before or after doing the work), garbage bodies, answers held back, dropped connections.

Usage:
    with VastFake(api_key="k") as fake:
        client = VastAiMarketplace("k", base_url=fake.base_url, clock=fake.clock, sleep=fake.clock.sleep)
"""

from __future__ import annotations

import base64
import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

ONSTART_MAX_CHARS = 4048
LABEL_MAX_CHARS = 128  # ASSUMED: the console truncates longer names; we refuse them
_QUERY_KEYWORDS = {"order", "limit", "type", "allocated_storage", "disable_bundling"}
_OPS = {"eq", "neq", "gt", "gte", "lt", "lte", "in", "notin"}
#: Keys of the create body (vast-cli vastai/api/instances.py create_instance, plus the documented target_state).
CREATE_KEYS = frozenset({
    "client_id", "image", "env", "price", "disk", "label", "extra", "onstart", "image_login", "python_utf8",
    "lang_utf8", "use_jupyter_lab", "jupyter_dir", "force", "cancel_unavail", "template_hash_id", "user",
    "runtype", "args", "volume_info", "target_state",
})
#: What the CLI sends as runtype (vast-cli vast.py get_runtype, create__instance).
RUNTYPES = frozenset({"ssh", "ssh_proxy", "ssh_direc ssh_proxy", "jupyter", "jupyter_proxy ssh_proxy",
                      "jupyter_direc ssh_direc ssh_proxy", "args"})
#: Every `actual_status` the API reports (docs.vast.ai show-instance; vast-cli SKILL.md; start-instance docs).
STATUSES: tuple[str | None, ...] = (None, "created", "scheduling", "loading", "running", "stopped", "frozen",
                                    "exited", "rebooting", "unknown", "offline")
PERMISSIONS = frozenset({"instance_read", "instance_write", "user_read", "misc"})

MSG_INVALID_KEY = "Invalid user key"
#: ASSUMED wording (the reference names the code and the header, not the text).
MSG_SEARCH_QUOTA = "Daily search quota exceeded; try again after the Retry-After period."
#: Search fields the server accepts and drops (the CLI filters them on the client).
SERVER_DROPPED_FIELDS = frozenset({"rented"})
MSG_SESSION_EXPIRED = "Session expired. Please log in again."
MSG_NO_KEY = "Please log in or sign up"


class VirtualClock:
    """The fake's time, shared with the client under test: `sleep` advances it and never waits."""

    def __init__(self, start: float = 1_796_000_000.0):
        self._now = start
        self._lock = threading.Lock()
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot go back in time ({seconds})")
        with self._lock:
            self._now += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(max(0.0, seconds))

    @property
    def calls(self) -> list[float]:
        """The sleeps asked for (the same shape as tests.fakes.Sleeps)."""
        return self.sleeps


class RealClock(VirtualClock):
    """Wall-clock time, for a client in another process (which cannot share a VirtualClock): pair it with
    `scale_limits(STRICT_LIMITS, f)` and the client's `time_scale=f` so nobody waits long."""

    def __call__(self) -> float:
        return time.time()

    def advance(self, seconds: float) -> None:
        raise TypeError("a RealClock cannot be advanced")

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        time.sleep(max(0.0, seconds))


@dataclass(frozen=True)
class EndpointLimit:
    """One endpoint's limit per key: a minimum gap between accepted calls and/or at most `max_calls` per
    `period_s`; a violation blocks the key's endpoint for `penalty_s` (each further violation re-arms it)."""

    min_interval_s: float = 0.0
    max_calls: int | None = None
    period_s: float = 1.0
    penalty_s: float = 0.0


#: Observed create limit (issue 15 / DESIGN.md): ~1 per 4.5 s per key, ~12 s penalty. Read limits are not
#: published ("thresholds ... not disclosed"); 5 a second per endpoint is our strict assumption.
STRICT_LIMITS: Mapping[str, EndpointLimit] = {
    "create": EndpointLimit(min_interval_s=4.5, penalty_s=12.0),
    "search": EndpointLimit(max_calls=5, period_s=1.0),
    "show": EndpointLimit(max_calls=5, period_s=1.0),
    "list": EndpointLimit(max_calls=5, period_s=1.0),
    "destroy": EndpointLimit(max_calls=5, period_s=1.0),
    "user": EndpointLimit(max_calls=5, period_s=1.0),
}


@dataclass
class ApiKey:
    key: str
    account: str = "acct-main"
    permissions: frozenset[str] | None = None  # None: full access (the console's default key)
    state: str = "active"  # active | revoked | session-expired
    #: Requests still answered before `pending_state` takes effect (revocation mid-run).
    countdown: int | None = None
    pending_state: str | None = None


def scale_limits(limits: Mapping[str, EndpointLimit], factor: float) -> dict[str, EndpointLimit]:
    """The same limits with every interval times `factor` (read limits keep their call count)."""
    return {name: EndpointLimit(min_interval_s=lim.min_interval_s * factor, max_calls=lim.max_calls,
                                period_s=lim.period_s * factor, penalty_s=lim.penalty_s * factor)
            for name, lim in limits.items()}


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
        "storage_cost": 0.1,
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


#: Fields a search may filter on: every field of an offer row.
SEARCH_FIELDS = frozenset(make_offer(1, 1, 1)) | {"gpu_total_ram", "cpu_cores", "pcie_bw", "dlperf",
                                                  "flops_usd", "duration", "min_bid", "static_ip"}


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


def market_of(count: int, gpu_name: str = "RTX 4090", start_price: float = 0.30, step: float = 0.005,
              first_offer: int = 20_001, first_machine: int = 60_001) -> list[dict[str, Any]]:
    """`count` fitting offers on distinct machines and hosts, cheapest first (a market for N-slot applies)."""
    return [make_offer(first_offer + i, first_machine + i, 800 + i, gpu_name=gpu_name,
                       dph_total=round(start_price + i * step, 4)) for i in range(count)]


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-cased names
    body: Any  # parsed JSON, None when there was no body, the raw text when it was not JSON
    at: float = 0.0  # the fake clock when it arrived
    status: int | None = None  # what the fake answered (None: no answer, connection dropped)


@dataclass
class Fault:
    """What to do instead of (or on top of) the normal answer.

    kind: "status" (answer `status` with `body` JSON and `headers`), "garbage" (do the work, then 200 with a
    non-JSON body), "slow" (do the work, then hold the answer for `delay_s` real seconds), "drop" (do the work,
    then close the connection without an answer), "late" (a create: take the offer now, commit the instance
    `commit_after_s` later on the fake clock, hold the answer for `delay_s` real seconds).
    """

    kind: str
    status: int = 500
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    method: str | None = None
    path_prefix: str | None = None
    remaining: int = 1
    #: For "status": do the work first (a proxy's 502 after the backend acted). "slow", "drop", "late" and
    #: "garbage" always do the work first: their point is an answer lost after the fact.
    after_work: bool = False
    commit_after_s: float = 0.0

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and (
            self.path_prefix is None or path.startswith(self.path_prefix)
        )


@dataclass
class FakeInstance:
    row: dict[str, Any]
    account: str = "acct-main"
    script: list[str | None] = field(default_factory=list)  # statuses still to report, one per read
    timeline: list[tuple[float, str | None, str | None]] = field(default_factory=list)  # (at, status, msg)
    visible_at: float = float("-inf")  # a late commit: unseen (lists, show, destroy) before this time
    ask_id: int | None = None


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


def check_query(query: Mapping[str, Any], ignored: Iterable[str] = ()) -> None:
    """Refuse a malformed `/bundles/` query as the API does (400 invalid_args)."""
    skip = set(ignored)
    for name, clause in query.items():
        if name in _QUERY_KEYWORDS:
            continue
        if name not in SEARCH_FIELDS and name not in skip:
            raise QueryError(f"unknown search field {name!r}")
        if not isinstance(clause, Mapping) or not clause:
            raise QueryError(f"clause for {name} must be an object like {{\"eq\": value}}")
        for op, operand in clause.items():
            if op not in _OPS:
                raise QueryError(f"unknown operator {op!r} on {name}")
            if op in ("in", "notin") and not isinstance(operand, list):
                raise QueryError(f"{op} on {name} needs a list")
            if op in ("gt", "gte", "lt", "lte") and (isinstance(operand, bool)
                                                   or not isinstance(operand, int | float)):
                raise QueryError(f"{op} on {name} needs a number, got {operand!r}")
    order = query.get("order")
    if order is not None and (not isinstance(order, list) or not all(
            isinstance(o, list) and len(o) == 2 and isinstance(o[0], str) and o[1] in ("asc", "desc")
            for o in order)):
        raise QueryError("order must be a list of [field, 'asc'|'desc']")
    limit = query.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise QueryError(f"limit must be a non-negative integer, got {limit!r}")
    storage = query.get("allocated_storage")
    if storage is not None and (isinstance(storage, bool) or not isinstance(storage, int | float) or storage < 0):
        raise QueryError(f"allocated_storage must be a number of GiB, got {storage!r}")
    if query.get("type", "on-demand") not in ("on-demand", "bid", "reserved"):
        raise QueryError(f"bad type {query.get('type')!r}")


def offer_matches(offer: Mapping[str, Any], query: Mapping[str, Any], ignored: Iterable[str] = ()) -> bool:
    """Evaluate a `/bundles/` query on one offer, as the real API does: every clause must hold.

    `ignored` names fields the server pretends not to know (to test a client's own filtering)."""
    skip = set(ignored)
    for name, clause in query.items():
        if name in _QUERY_KEYWORDS or name in skip:
            continue
        if not isinstance(clause, Mapping):
            raise QueryError(f"clause for {name} is not an object")
        for op, operand in clause.items():
            if op not in _OPS:
                raise QueryError(f"unknown operator {op!r} on {name}")
            if name not in offer:
                return False
            if not _compare(offer[name], op, operand):
                return False
    return True


def check_create_body(body: Any) -> str | None:
    """Why the API would refuse this `PUT /asks/{id}/` body (None when it is well-formed)."""
    if not isinstance(body, Mapping):
        return "request body must be a JSON object"
    unknown = sorted(set(body) - CREATE_KEYS)
    if unknown:
        return f"unknown field(s) {', '.join(unknown)}"
    if body.get("client_id") != "me":
        return "client_id must be 'me'"
    if not isinstance(body.get("image"), str) or not body["image"].strip():
        return "image is required"
    disk = body.get("disk")
    if isinstance(disk, bool) or not isinstance(disk, int | float) or disk <= 0:
        return f"disk must be a positive number of GB, got {disk!r}"
    env = body.get("env", {})
    if env is not None and (not isinstance(env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        return "env must be an object of strings"
    label = body.get("label")
    if label is not None and (not isinstance(label, str) or len(label) > LABEL_MAX_CHARS):
        return f"label must be a string of at most {LABEL_MAX_CHARS} characters"
    onstart = body.get("onstart")
    if onstart is not None and (not isinstance(onstart, str) or len(onstart) > ONSTART_MAX_CHARS):
        return "onstart script is too long"
    runtype = body.get("runtype")
    if runtype is not None and runtype not in RUNTYPES:
        return f"unknown runtype {runtype!r}"
    for name in ("image_login", "template_hash_id", "jupyter_dir", "user"):
        if body.get(name) is not None and not isinstance(body[name], str):
            return f"{name} must be a string"
    price = body.get("price")
    if price is not None and (isinstance(price, bool) or not isinstance(price, int | float)):
        return "price must be a number"
    if body.get("target_state") not in (None, "running", "stopped"):
        return "target_state must be running or stopped"
    return None


def _error(code: str, msg: str) -> dict[str, Any]:
    return {"success": False, "error": code, "msg": msg}


class VastFake:
    """The fake server. Thread-safe; start with `with` or start()/stop()."""

    def __init__(
        self,
        api_key: str = "test-vast-key",
        offers: Iterable[Mapping[str, Any]] | None = None,
        *,
        page_size: int = 25,
        new_instance_script: Sequence[str | None] = ("loading", "running"),
        new_instance_timeline: Sequence[tuple[float, str | None]] | None = None,
        clock: VirtualClock | None = None,
        limits: Mapping[str, EndpointLimit] | None = None,
        rate_limit_body: str = "text",
    ):
        """`new_instance_script`: statuses a new instance reports, one per read, then the last forever.
        `new_instance_timeline`: instead, (seconds after commit, status) on the fake clock.
        `limits`: rate limits per endpoint (default STRICT_LIMITS; `{}` turns them off for a test that is
        about something else and says so)."""
        self.api_key = api_key
        self.clock = clock or VirtualClock()
        self.keys: dict[str, ApiKey] = {api_key: ApiKey(api_key)}
        self.offers: dict[int, dict[str, Any]] = {int(o["id"]): dict(o) for o in (offers or default_offers())}
        self.instances: dict[int, FakeInstance] = {}
        self.requests: list[RecordedRequest] = []
        self.page_size = page_size
        #: Query fields the search pretends not to know, to test a client's own filtering.
        self.ignored_fields: set[str] = set()
        #: At most this many offers per search answer (None: only the query's `limit` cuts); a cut answer says
        #: `truncated: true`.
        self.max_results: int | None = None
        #: Until this fake-clock time every search answers 429 search_quota_exceeded (`exhaust_search_quota`).
        self.search_quota_until = float("-inf")
        #: Offers still listed by search but already rented by someone else: create -> 404 no_such_ask.
        self.stale_offers: set[int] = set()
        self.new_instance_script = list(new_instance_script)
        self.new_instance_timeline = list(new_instance_timeline) if new_instance_timeline is not None else None
        self.limits = dict(STRICT_LIMITS if limits is None else limits)
        self.rate_limit_body = rate_limit_body
        #: Called (in the server thread) right after a create committed, before it is answered: a test can kill
        #: the client there, at the worst moment (rented, and the client never learns it).
        self.on_create: Callable[[], None] | None = None
        self._calls: dict[tuple[str, str], deque[float]] = {}
        self._blocked_until: dict[tuple[str, str], float] = {}
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

    # -- keys -----------------------------------------------------------------------------------

    def add_key(self, key: str, *, account: str = "acct-main", permissions: Iterable[str] | None = None) -> None:
        """Another key: of the same account (a scoped key) or of another account (sees none of ours)."""
        perms = None if permissions is None else frozenset(permissions)
        if perms is not None and not perms <= PERMISSIONS:
            raise ValueError(f"unknown permission(s) {sorted(perms - PERMISSIONS)}")
        with self._lock:
            self.keys[key] = ApiKey(key, account, perms)

    def revoke_key(self, key: str | None = None, *, after_requests: int = 0) -> None:
        """Delete the key (401 "Invalid user key"), now or after it has been used `after_requests` more times."""
        self._key_state(key or self.api_key, "revoked", after_requests)

    def expire_session(self, key: str | None = None, *, after_requests: int = 0) -> None:
        """The key's session expires: every route answers 404 "Session expired. Please log in again."."""
        self._key_state(key or self.api_key, "session-expired", after_requests)

    def restore_key(self, key: str | None = None) -> None:
        with self._lock:
            entry = self.keys[key or self.api_key]
            entry.state, entry.countdown, entry.pending_state = "active", None, None

    def _key_state(self, key: str, state: str, after_requests: int) -> None:
        with self._lock:
            entry = self.keys[key]
            if after_requests <= 0:
                entry.state, entry.countdown, entry.pending_state = state, None, None
            else:
                entry.countdown, entry.pending_state = after_requests, state

    # -- scripting ------------------------------------------------------------------------------

    def inject(self, fault: Fault) -> None:
        """Queue a fault; it applies to the next `fault.remaining` matching requests."""
        with self._lock:
            self._faults.append(fault)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def rate_limit_next(self, n: int = 1, retry_after: float | str | None = None, **match: Any) -> None:
        """Answer the next matching requests 429 (the real API sends no Retry-After; pass one to test it)."""
        headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
        body = {"success": False, "error": "rate_limited", "msg": "API requests too frequent"}
        self.inject(Fault("status", 429, body, headers, remaining=n, **match))

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

    def late_commit_next(self, n: int = 1, *, commit_after_s: float = 30.0, hold_s: float = 1.0) -> None:
        """The next `n` creates take their offer at once but commit `commit_after_s` later (fake clock) and
        answer only after `hold_s` real seconds: set the client's create timeout below `hold_s`."""
        self.inject(Fault("late", delay_s=hold_s, commit_after_s=commit_after_s, remaining=n, method="PUT",
                          path_prefix="/api/v0/asks/"))

    def exhaust_search_quota(self, retry_after_s: float) -> None:
        """The account's daily search row quota is used up for `retry_after_s` more seconds (fake clock): every
        search until then answers 429 `search_quota_exceeded` with the seconds left in `Retry-After`."""
        with self._lock:
            self.search_quota_until = self.clock() + retry_after_s

    def stale_offer(self, offer_id: int) -> None:
        """Someone else rents this offer; search still lists it (a stale index): create -> no_such_ask."""
        with self._lock:
            self.stale_offers.add(int(offer_id))

    def script_status(self, contract_id: int | str, statuses: Sequence[str | None]) -> None:
        """The instance reports these statuses on its next reads (one per GET/list), then the last."""
        for status in statuses:
            _check_status(status)
        with self._lock:
            self.instances[int(contract_id)].script = list(statuses)

    def set_status(self, contract_id: int | str, actual_status: str | None, status_msg: str | None = None) -> None:
        _check_status(actual_status)
        with self._lock:
            instance = self.instances[int(contract_id)]
            instance.script = []
            instance.timeline = []
            _apply_status(instance.row, actual_status, status_msg)

    def schedule_status(self, contract_id: int | str, after_s: float, actual_status: str | None,
                        status_msg: str | None = None) -> None:
        """From `after_s` seconds on (fake clock), the instance reports `actual_status`."""
        _check_status(actual_status)
        with self._lock:
            instance = self.instances[int(contract_id)]
            instance.script = []
            instance.timeline.append((self.clock() + after_s, actual_status, status_msg))
            instance.timeline.sort(key=lambda t: t[0])

    def add_instance(self, *, account: str = "acct-main", **row: Any) -> int:
        """Put an instance in an account directly (e.g. one a previous, killed run created)."""
        with self._lock:
            contract_id = next(self._ids)
            base = {
                "id": contract_id,
                "machine_id": 41999,
                "host_id": 599,
                "actual_status": "running",
                "intended_status": "running",
                "cur_state": "running",
                "label": None,
                "gpu_name": "RTX 4090",
                "num_gpus": 1,
                "dph_total": 0.4,
                "start_date": self.clock(),
                "image_uuid": "example/worker@sha256:" + "0" * 64,
                "status_msg": None,
                "extra_env": [],
            }
            base.update(row)
            base["id"] = contract_id
            self.instances[contract_id] = FakeInstance(base, account)
            return contract_id

    def requests_to(self, method: str, path_prefix: str) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.method == method and r.path.startswith(path_prefix)]

    def visible_instances(self, account: str = "acct-main") -> list[dict[str, Any]]:
        """The rows the account would list now (committed ones only), without advancing any script."""
        now = self.clock()
        with self._lock:
            return [dict(i.row) for i in self.instances.values() if i.account == account and i.visible_at <= now]

    def instances_with_label(self, label: str, account: str = "acct-main") -> list[int]:
        """Every instance (committed or not yet) carrying `label`: what a test asserts 'one per slot' on."""
        with self._lock:
            return [cid for cid, i in self.instances.items() if i.account == account and i.row.get("label") == label]

    # -- request handling ------------------------------------------------------------------------

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.remaining > 0 and fault.matches(method, path):
                    fault.remaining -= 1
                    return fault
        return None

    def _authenticate(self, header: str | None) -> tuple[ApiKey | None, tuple[int, Any] | None]:
        """The key of a request, or the answer refusing it."""
        if not header or not header.startswith("Bearer "):
            return None, (401, _error("auth_error", MSG_NO_KEY))
        with self._lock:
            entry = self.keys.get(header[len("Bearer "):])
            if entry is None:
                return None, (401, _error("auth_error", MSG_INVALID_KEY))
            if entry.countdown is not None:
                if entry.countdown <= 0:
                    entry.state, entry.countdown, entry.pending_state = entry.pending_state or "revoked", None, None
                else:
                    entry.countdown -= 1
            if entry.state == "revoked":
                return None, (401, _error("auth_error", MSG_INVALID_KEY))
            if entry.state == "session-expired":
                # Not a typo: vast answers an expired session with 404 (vast-cli vast.py, PR #377).
                return None, (404, _error("session_expired", MSG_SESSION_EXPIRED))
            return entry, None

    def _rate_limited(self, key: str, endpoint: str) -> EndpointLimit | None:
        """Count the call; the limit it broke (None when it may proceed)."""
        limit = self.limits.get(endpoint)
        if limit is None:
            return None
        now = self.clock()
        slot = (key, endpoint)
        with self._lock:
            calls = self._calls.setdefault(slot, deque())
            while calls and calls[0] <= now - max(limit.period_s, limit.min_interval_s):
                calls.popleft()
            broke = now < self._blocked_until.get(slot, float("-inf"))
            if calls and limit.min_interval_s and now - calls[-1] < limit.min_interval_s:
                broke = True
            if limit.max_calls is not None and sum(1 for t in calls if t > now - limit.period_s) >= limit.max_calls:
                broke = True
            if broke:
                if limit.penalty_s:
                    self._blocked_until[slot] = now + limit.penalty_s
                return limit
            calls.append(now)
            return None

    @staticmethod
    def _endpoint(method: str, parts: list[str]) -> tuple[str, str] | None:
        """(rate-limit endpoint, permission) of a route; None when there is no such route."""
        if parts[:2] == ["api", "v1"] and parts[2:] == ["instances"] and method == "GET":
            return "list", "instance_read"
        if parts[:2] != ["api", "v0"]:
            return None
        rest = parts[2:]
        if method == "POST" and rest == ["bundles"]:
            return "search", "misc"
        if method == "PUT" and len(rest) == 2 and rest[0] == "asks":
            return "create", "instance_write"
        if method == "GET" and rest == ["instances"]:
            return "list", "instance_read"
        if len(rest) == 2 and rest[0] == "instances" and method == "GET":
            return "show", "instance_read"
        if len(rest) == 2 and rest[0] == "instances" and method == "DELETE":
            return "destroy", "instance_write"
        if method == "GET" and rest == ["users", "current"]:
            return "user", "user_read"
        return None

    def _route(self, key: ApiKey, method: str, path: str, query: dict[str, list[str]], body: Any,
               fault: Fault | None) -> tuple[int, Any]:
        parts = [p for p in path.split("/") if p]
        rest = parts[2:]
        with self._lock:
            if parts[:2] == ["api", "v1"]:
                return self._page(key, query)
            if method == "POST":
                return self._search(body)
            if method == "PUT":
                return self._create(key, rest[1], body, fault)
            if rest == ["instances"]:
                return 200, {"instances": [self._report(i) for i in self._visible(key)]}
            if rest == ["users", "current"]:
                return 200, {"id": 4242, "email": "fleet@example.org", "credit": 100.0, "username": key.account}
            return self._one(key, method, rest[1], body)

    def _visible(self, key: ApiKey) -> list[int]:
        now = self.clock()
        return [cid for cid in sorted(self.instances)
                if self.instances[cid].account == key.account and self.instances[cid].visible_at <= now]

    def _search(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, Mapping):
            return 400, _error("invalid_args", "query must be a JSON object")
        ignored = self.ignored_fields | SERVER_DROPPED_FIELDS
        try:
            check_query(body, ignored)
            found = [o for o in self.offers.values() if offer_matches(o, body, ignored)]
        except QueryError as exc:
            return 400, _error("invalid_args", str(exc))
        for key, direction in reversed(body.get("order") or []):
            found.sort(key=_sort_key(str(key)), reverse=direction == "desc")
        matched = len(found)
        limit = body.get("limit")
        if isinstance(limit, int) and limit >= 0:
            found = found[:limit]
        if self.max_results is not None:
            found = found[:self.max_results]
        answer: dict[str, Any] = {"offers": [dict(o) for o in found]}
        if len(found) < matched:
            answer["truncated"] = True
        return 200, answer

    def _create(self, key: ApiKey, ask_id: str, body: Any, fault: Fault | None) -> tuple[int, Any]:
        gone = 404, _error("no_such_ask", f"Instance type by id {ask_id} is not available.")
        offer = self.offers.get(int(ask_id)) if ask_id.isdigit() else None
        if offer is None or not offer.get("rentable") or offer.get("rented") or int(ask_id) in self.stale_offers:
            return gone
        problem = check_create_body(body)
        if problem is not None:
            return 400, _error("invalid_args", problem)
        contract_id = next(self._ids)
        offer["rented"] = True
        offer["rentable"] = False
        env = body.get("env") or {}
        now = self.clock()
        commit_at = now + (fault.commit_after_s if fault is not None and fault.kind == "late" else 0.0)
        row = {
            "id": contract_id,
            "machine_id": offer["machine_id"],
            "host_id": offer["host_id"],
            "actual_status": None,
            "intended_status": "running",
            "cur_state": "running",
            "next_state": "running",
            "label": body.get("label"),
            "gpu_name": offer["gpu_name"],
            "num_gpus": offer["num_gpus"],
            "dph_total": offer["dph_total"],
            "storage_cost": offer.get("storage_cost"),
            "reliability2": offer.get("reliability2"),
            "start_date": commit_at,
            "image_uuid": body["image"],
            "image_runtype": body.get("runtype"),
            "disk_space": body.get("disk"),
            "onstart": body.get("onstart"),
            "status_msg": None,
            "extra_env": [[k, v] for k, v in env.items()],
        }
        instance = FakeInstance(row, key.account, ask_id=int(ask_id), visible_at=commit_at)
        if self.new_instance_timeline is not None:
            instance.timeline = [(commit_at + after, status, None) for after, status in self.new_instance_timeline]
        else:
            instance.script = list(self.new_instance_script)
        self.instances[contract_id] = instance
        return 200, {"success": True, "new_contract": contract_id, "instance_api_key": "inst-" + str(contract_id)}

    def _report(self, contract_id: int) -> dict[str, Any]:
        instance = self.instances[contract_id]
        if instance.script:
            status = instance.script.pop(0) if len(instance.script) > 1 else instance.script[0]
            _apply_status(instance.row, status, None)
        elif instance.timeline:
            now = self.clock()
            current = [t for t in instance.timeline if t[0] <= now]
            if current:
                _, status, msg = current[-1]
                _apply_status(instance.row, status, msg)
        return dict(instance.row)

    def _one(self, key: ApiKey, method: str, raw_id: str, body: Any) -> tuple[int, Any]:
        contract_id = int(raw_id) if raw_id.isdigit() else -1
        known = contract_id in self._visible(key)
        if method == "GET":
            return 200, {"instances": self._report(contract_id) if known else None}
        if body not in (None, {}):
            return 400, _error("invalid_args", "destroy takes an empty JSON object")
        if not known:
            return 404, _error("no_such_instance", f"Instance {raw_id} not found.")
        instance = self.instances.pop(contract_id)
        offer = self.offers.get(instance.ask_id if instance.ask_id is not None else -1)
        if offer is not None:
            offer["rented"] = False
            offer["rentable"] = True
        return 200, {"success": True}

    def _page(self, key: ApiKey, query: dict[str, list[str]]) -> tuple[int, Any]:
        try:
            limit = int(query.get("limit", ["25"])[0])
            filters = json.loads(query["select_filters"][0]) if "select_filters" in query else {}
            order = json.loads(query["order_by"][0]) if "order_by" in query else []
        except ValueError as exc:
            return 400, _error("invalid_args", f"bad query argument: {exc}")
        if not isinstance(filters, dict) or not isinstance(order, list):
            return 400, _error("invalid_args", "select_filters must be an object and order_by a list")
        limit = max(1, min(limit, 25, self.page_size))
        after = 0
        if "after_token" in query:
            try:
                after = int(json.loads(base64.urlsafe_b64decode(query["after_token"][0]))["values"]["id"])
            except (ValueError, KeyError, TypeError):
                return 400, _error("invalid_args", "bad after_token")
        ids = [i for i in self._visible(key) if i > after]
        if filters:
            try:
                ids = [i for i in ids if offer_matches(self.instances[i].row, filters)]
            except QueryError as exc:
                return 400, _error("invalid_args", str(exc))
        page = ids[:limit]
        token = None
        if len(ids) > limit:
            token = base64.urlsafe_b64encode(json.dumps({"values": {"id": page[-1]}}).encode()).decode()
        return 200, {
            "instances": [self._report(i) for i in page],
            "next_token": token,
            "total_instances": len(ids),
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
                    at=fake.clock(),
                )
                self._record = record
                with fake._lock:
                    fake.requests.append(record)
                if "api_key" in record.query:
                    # The real API would take it; we refuse it so no client leaks the key into URLs and logs.
                    self._send(400, _error("invalid_args", "pass the API key in the Authorization header"))
                    return
                key, refusal = fake._authenticate(self.headers.get("Authorization"))
                parts = [p for p in split.path.split("/") if p]
                route = fake._endpoint(self.command, parts)
                if refusal is not None:
                    if route is not None and route[0] == "search" and refusal[1].get("msg") == MSG_INVALID_KEY:
                        refusal = (404, _error("auth_error", MSG_INVALID_KEY))  # search_offers.yaml: 404
                    elif route is not None and route[0] == "search" and refusal[0] == 401:
                        refusal = (404, _error("auth_error", MSG_INVALID_KEY))  # a missing key, too
                    self._send(*refusal)
                    return
                assert key is not None
                if route is None:
                    self._send(404, _error("not_found", f"no route {self.command} {split.path}"))
                    return
                endpoint, permission = route
                if key.permissions is not None and permission not in key.permissions:
                    self._send(403, _error("permission_denied",
                                           f"API key lacks permission {permission} for {self.command} {split.path}"))
                    return
                if endpoint == "search" and fake.clock() < fake.search_quota_until:
                    left = max(1, int(fake.search_quota_until - fake.clock() + 0.999))
                    self._send(429, _error("search_quota_exceeded", MSG_SEARCH_QUOTA), {"Retry-After": str(left)})
                    return
                broke = fake._rate_limited(key.key, endpoint)
                if broke is not None:
                    threshold = broke.min_interval_s or broke.period_s / (broke.max_calls or 1)
                    text = f"API requests too frequent: endpoint threshold={threshold:g}"
                    if fake.rate_limit_body == "json":
                        self._send(429, _error("rate_limited", text))
                    else:
                        self._send_raw(429, text.encode(), "text/plain")
                    return
                fault = fake._take_fault(self.command, split.path)
                if fault is not None and fault.kind == "status" and not fault.after_work:
                    self._send(fault.status, fault.body, fault.headers)
                    return
                status, payload = fake._route(key, self.command, split.path, record.query, body, fault)
                if endpoint == "create" and status == 200 and fake.on_create is not None:
                    fake.on_create()
                if fault is not None and fault.kind == "status":
                    self._send(fault.status, fault.body, fault.headers)
                    return
                if fault is not None and fault.kind in ("slow", "late"):
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
                self._record.status = status
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


def _check_status(status: str | None) -> None:
    if status not in STATUSES:
        raise ValueError(f"unknown actual_status {status!r}; vast.ai reports one of {STATUSES}")


def _apply_status(row: dict[str, Any], status: str | None, msg: str | None) -> None:
    """Keep actual_status, intended_status and cur_state consistent, as the API reports them."""
    row["actual_status"] = status
    if status in ("stopped", "frozen"):
        row["intended_status"] = row["cur_state"] = status
    elif status == "running":
        row["intended_status"] = row["cur_state"] = "running"
    if msg is not None:
        row["status_msg"] = msg

"""The controller API, transport-independent: authenticated, validated requests in, responses out.

Workers POST register / events / logs / result for their own instance with a per-instance token; the
reconcile loop reads the store directly; humans and `fleet status` use the small read API. The HTTP
server (`server.py`) only moves bytes to and from `ControllerApi.handle`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from functools import lru_cache, partial
from typing import Any
from urllib.parse import parse_qs, urlsplit

from reconciler.adapters.controller.protocol import (
    _KIND_BY_ACTION,
    DEFAULT_LOG_TAIL,
    INSTANCE_ID,
    MAX_BODY_BYTES,
    ApiError,
    _clip,
    _time,
    is_event_batch,
    parse_json_body,
    report_to_json,
    summary_to_json,
    validate_event_batch,
    validate_report,
)
from reconciler.adapters.store.port import (
    RETRY_AFTER_S,
    ControllerStore,
    EventLimitExceeded,
    InstanceDestroyed,
    PreparedWrite,
    ResultConflict,
    StoreUnavailable,
    UnknownInstance,
)
from reconciler.domain.identifiers import identifier_problems
from reconciler.domain.tokens import (
    bearer_token,
    check_secret,
    instance_token,
    is_well_formed_token,
    machine_claim,
    same_secret,
)

log = logging.getLogger(__name__)

_WORKER_ROUTE = re.compile(r"^/api/v1/instances/(?P<id>[^/]+)/(?P<action>register|events|logs|result|destroyed)$")
_LOGS_ROUTE = re.compile(r"^/api/instance-logs/(?P<id>[^/]+)$")
_INSTANCE_ROUTE = re.compile(r"^/api/instances/(?P<id>[^/]+)$")
_DIRECTIVE_ROUTE = re.compile(r"^/api/v1/instances/(?P<id>[^/]+)/directive$")


@dataclass(frozen=True)
class Response:
    status: int
    body: Mapping[str, Any]
    close: bool = False
    #: The request carried a valid worker or admin token (the HTTP edge stops counting the connection as
    #: unauthenticated).
    authenticated: bool = False
    #: Headers beyond the JSON ones (lower-case names), e.g. Retry-After on a 503.
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class BodyNeeded:
    """`ControllerApi.begin` accepted the head of a worker report: read `length` body bytes, then `finish`."""

    action: str
    instance_id: str
    length: int


@dataclass(frozen=True)
class PreparedReport:
    """A validated, redacted worker report ready to store (`ControllerApi.store_prepared`): the store's
    prepared write and how its result becomes the answer."""

    request: Request
    write: PreparedWrite[Any]
    answer: Callable[[Any], Mapping[str, Any]]
    #: Added to the 422 "event limit reached" detail (a batch says that none of it was stored).
    limit_note: str = ""


#: Store refusals as answers: (status, error, how the detail is worded).
_REFUSALS: dict[type[BaseException], tuple[int, str, str]] = {
    UnknownInstance: (404, "unknown instance", "register"), InstanceDestroyed: (410, "instance destroyed", ""),
    ResultConflict: (409, "result conflict", ""), EventLimitExceeded: (422, "event limit reached", "batch"),
}


def _status_answer(status: Any) -> Mapping[str, Any]:
    return {"status": status}


def _batch_answer(statuses: Any) -> Mapping[str, Any]:
    stored = statuses.count("stored")
    return {"status": "stored" if stored else "duplicate", "events": len(statuses), "stored": stored,
            "duplicates": len(statuses) - stored}


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


# --- the API (transport-independent) ------------------------------------------------------------------


class ControllerApi:
    """Routes a Request to the store. Knows nothing about sockets; the HTTP handler below is a shell."""

    def __init__(self, store: ControllerStore, secret: bytes, admin_token: str | None, *,
                 allow_open_reads: bool = False, max_body_bytes: int = MAX_BODY_BYTES,
                 now: Callable[[], datetime] | None = None, require_machine_claim: bool = False,
                 health: Callable[[], Mapping[str, object]] | None = None):
        self.store = store
        #: More for /healthz from the process serving this API (a replica: who leads, and since when).
        self.health = health
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
        """The whole request at once, the body read through `request.read_body` (synchronous callers)."""
        step = self.begin(request)
        if not isinstance(step, BodyNeeded):
            return step
        try:
            body = request.read_body(step.length)
        except ApiError as exc:
            return self.error_response(request, exc)
        return self.finish(request, step, body)

    def begin(self, request: Request) -> Response | BodyNeeded:
        """Everything before the body: route, instance id, token, Content-Type and -Length. Nothing is read
        from an unauthenticated client or past the size limit; an async edge reads the body, then `finish`."""
        try:
            return self._route(request)
        except ApiError as exc:
            return self.error_response(request, exc)
        except StoreUnavailable as exc:
            return self._store_unavailable(request, exc)

    def finish(self, request: Request, step: BodyNeeded, body: bytes) -> Response:
        prepared = self.prepare(request, step, body)
        return prepared if isinstance(prepared, Response) else self.store_prepared(prepared)

    def prepare(self, request: Request, step: BodyNeeded, body: bytes) -> Response | PreparedReport:
        """The CPU part of a report, nothing stored yet: parse, validate, redact, encode. A refusal is the
        Response; else `store_prepared` stores it (the HTTP edge stores a loop turn's reports together)."""
        try:
            return self._prepare_ingest(request, step.action, step.instance_id, parse_json_body(body))
        except ApiError as exc:
            return replace(self.error_response(request, exc), authenticated=True)

    def store_prepared(self, prepared: PreparedReport) -> Response:
        return self.store_all([prepared])[0]

    def store_all(self, prepared: list[PreparedReport]) -> list[Response]:
        """Store prepared reports in one transaction; each gets its own answer (see ControllerStore.write_all)."""
        outcomes = self.store.write_all([p.write for p in prepared])
        return [self._stored(p, error, result) for p, (error, result) in zip(prepared, outcomes, strict=True)]

    def _stored(self, prepared: PreparedReport, error: BaseException | None, result: Any) -> Response:
        if error is None:
            return Response(200, prepared.answer(result), authenticated=True)
        if isinstance(error, StoreUnavailable):
            return replace(self._store_unavailable(prepared.request, error), authenticated=True)
        refusal = _REFUSALS.get(type(error))
        if refusal is None:
            log.error("internal error storing %s %s: %r", prepared.request.method,
                      urlsplit(prepared.request.target).path, error)
            return Response(500, {"error": "internal error", "detail": None}, close=True, authenticated=True)
        status, reason, note = refusal
        detail = f"{error}; register first" if note == "register" else f"{error}{prepared.limit_note}" \
            if note == "batch" else str(error)
        return replace(self.error_response(prepared.request, ApiError(status, reason, detail)), authenticated=True)

    @staticmethod
    def error_response(request: Request, exc: ApiError) -> Response:
        if exc.status in (401, 403):
            log.warning("rejected %s %s: %s", request.method, urlsplit(request.target).path, exc.error)
        return Response(exc.status, {"error": exc.error, "detail": exc.detail}, close=exc.close)

    @staticmethod
    def _store_unavailable(request: Request, exc: StoreUnavailable) -> Response:
        log.error("store error on %s %s: %s", request.method, urlsplit(request.target).path, exc)
        return Response(503, {"error": "store unavailable", "detail": "temporary; retry later"},
                        headers=(("retry-after", str(RETRY_AFTER_S)),))

    def _route(self, request: Request) -> Response | BodyNeeded:
        target = request.target
        if target.startswith("/") and not target.startswith("//") and "?" not in target and "#" not in target:
            path, query = target, ""  # what urlsplit returns for such a target, at a tenth of the cost
        else:
            parts = urlsplit(target)
            path, query = parts.path, parts.query
        method = request.method
        if match := _WORKER_ROUTE.match(path):
            self._require_method(request, "POST")
            instance_id = self._instance_id(match["id"])
            if match["action"] == "destroyed":
                self._require_admin(request)
                return replace(self._destroyed(instance_id), authenticated=True)
            self._require_instance_token(request, instance_id)
            return BodyNeeded(match["action"], instance_id, self._body_length(request))
        if match := _DIRECTIVE_ROUTE.match(path):
            # What the reconciler decided (serve, stop, wait); the worker polls it (worker-image/serve.sh).
            self._require_method(request, "GET")
            instance_id = self._instance_id(match["id"])
            self._require_instance_token(request, instance_id)
            directive = self.store.directive(instance_id)
            if directive is None:
                directive = {"protocol": 1, "action": "wait", "reason": "no verdict yet"}
            return Response(200, directive, authenticated=True)
        if path == "/healthz":
            # Alive and answering, to anyone (a load balancer's probe); what the fleet holds and who leads only
            # with the admin token: a stranger learns nothing about the fleet from it.
            self._require_method(request, "GET")
            if self.admin_token is None or request.authorization is None:
                return Response(200, {"status": "ok"})
            self._require_admin(request)
            return Response(200, {"status": "ok", "instances": self.store.instance_count(),
                                  **(self.health() if self.health is not None else {})}, authenticated=True)
        if path == "/api/instances":
            self._require_method(request, "GET")
            admin = self._require_reader(request)
            return Response(200, {"instances": [summary_to_json(r) for r in self.store.reports()]}, authenticated=admin)
        if match := _INSTANCE_ROUTE.match(path):
            self._require_method(request, "GET")
            instance_id = self._instance_id(match["id"])
            admin = self._require_reader(request)
            found = self.store.detail(instance_id)
            if found is None:
                raise ApiError(404, "unknown instance", f"instance {instance_id!r} never registered")
            return Response(200, report_to_json(*found), authenticated=admin)
        if match := _LOGS_ROUTE.match(path):
            self._require_method(request, "GET")
            instance_id = self._instance_id(match["id"])
            admin = self._require_reader(request)
            view = self.store.log_view(instance_id, self._tail_param(query))
            if view is None:
                raise ApiError(404, "unknown instance", f"instance {instance_id!r} never registered")
            return Response(200, {"instance_id": view.instance_id, "lines": list(view.lines),
                                  "dropped": view.dropped, "destroyed_at": _time(view.destroyed_at)},
                            authenticated=admin)
        raise ApiError(404, "not found", f"no endpoint {method} {_clip(path, 200)}", close=self.has_body(request))

    # --- checks ---

    @staticmethod
    def has_body(request: Request) -> bool:
        return bool(request.transfer_encoding) or any(v.strip() not in ("", "0") for v in request.content_lengths)

    def _require_method(self, request: Request, allowed: str) -> None:
        if request.method != allowed:
            raise ApiError(405, "method not allowed", f"use {allowed}", close=self.has_body(request))

    def _instance_id(self, raw: str) -> str:
        if not INSTANCE_ID.fullmatch(raw):
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

    def _require_reader(self, request: Request) -> bool:
        """True when the reader presented the admin token (False: open reads, nobody authenticated)."""
        if self.allow_open_reads:
            return False
        self._require_admin(request)
        return True

    def _tail_param(self, query: str) -> int:
        try:
            params = parse_qs(query, keep_blank_values=True, strict_parsing=False, max_num_fields=16)
        except ValueError as exc:
            raise ApiError(400, "bad query", str(exc)) from None
        values = params.get("tail", [str(DEFAULT_LOG_TAIL)])
        if len(values) != 1 or not re.fullmatch(r"[0-9]{1,9}", values[0]):
            raise ApiError(400, "bad query", "tail must be one non-negative integer")
        return min(int(values[0]), self.store.ring_lines)

    def _body_length(self, request: Request) -> int:
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
        return length

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

    def _prepare_ingest(self, request: Request, action: str, instance_id: str, doc: Any) -> PreparedReport:
        if action == "events" and is_event_batch(doc):
            events = validate_event_batch(doc)
            return PreparedReport(request, self.store.prepare_events(instance_id, events), _batch_answer,
                                  "; nothing of this batch was stored")
        validate_report(_KIND_BY_ACTION[action], doc)
        if action in ("register", "result") and (problems := identifier_problems(doc)):
            raise ApiError(400, "schema violation", problems)
        if action == "register":
            if doc["instance_id"] != instance_id:
                raise ApiError(400, "schema violation", [{"path": "$.instance_id", "message":
                               f"{doc['instance_id']!r} does not match the instance in the path {instance_id!r}"}])
            self._check_machine_claim(instance_id, doc)
            return PreparedReport(request, self.store.prepare_register(instance_id, doc), _status_answer)
        if action == "events":
            return PreparedReport(request, self.store.prepare_event(instance_id, doc), _status_answer)
        if action == "logs":
            count = len(doc["lines"])
            return PreparedReport(request, self.store.prepare_logs(instance_id, doc["lines"], doc.get("dropped", 0)),
                                  lambda evicted: {"status": "stored", "lines": count, "evicted": evicted})
        return PreparedReport(request, self.store.prepare_result(instance_id, doc), _status_answer)

    def _destroyed(self, instance_id: str) -> Response:
        if not self.store.mark_destroyed(instance_id, self.now()):
            raise ApiError(404, "unknown instance", f"instance {instance_id!r} never registered")
        view = self.store.log_view(instance_id, 0)
        return Response(200, {"status": "destroyed",
                              "destroyed_at": _time(view.destroyed_at) if view is not None else None})

"""Controller HTTP edge: uvicorn (httptools parser, uvloop) + Starlette around the transport-free ControllerApi.

Where it sits: workers (curl, over the internet) and the admin client speak HTTP to this module; it turns a
request into `api.Request`, lets `ControllerApi` decide (route, auth, validation, store) and writes the JSON
answer. Nothing here knows about the store or the protocol schema.

What the edge adds to uvicorn, and why (uvicorn alone would let a slowloris client starve workers):
- Head deadline: a request head must be complete `head_timeout_s` after the connection opened (or after the
  first byte of a keep-alive request). uvicorn only has an idle keep-alive timer, and every received byte
  resets it, so a client trickling one header byte at a time would hold a connection forever.
- Body deadline and size on every route: the body must arrive within `body_timeout_s` of the head (408
  otherwise); worker reports read theirs in `_read_body`, the routes beside them (the sign-in form, the page)
  through the `BodyLimits` middleware (Starlette's middleware stack; 413 past `route_max_body_bytes`). A
  response that leaves a body unread closes the connection.
- Connection caps (`ConnectionGuard`), so that no one client can hold what others need: unauthenticated
  connections in all (`max_unauthenticated`) and per client address (`max_unauthenticated_per_address`);
  authenticated ones per token (`max_per_token`: a connection belongs to the token of its first authenticated
  request, a worker's from the head of its report on); every connection (`max_connections`, by default from
  the process's open-file limit, so the server never runs out of descriptors: see docs/security.md on
  LimitNOFILE). At a cap the new connection is admitted and the oldest one of the same group gives way, an
  idle one (between requests, or still sending its head) before one in the middle of a request: a flood
  from one address or one token only churns its own connections. uvicorn's `limit_concurrency` would lock
  everyone out instead (503 to all once the count is reached, authenticated or not).
- Head limits (100 headers, 64 KiB per line, 128 KiB in all: 431) and answers to malformed heads as JSON
  `{"error", "detail"}` with the wording of the earlier http.server-based edge; a real listen backlog
  (2048, not socketserver's 5, so a burst of workers is queued, not reset); optional TLS.
- Closing with an unread body half-closes and drains the socket for a moment first (bounded bytes and time):
  closing with unread input makes the kernel send RST, which can destroy an error answer (413) before the
  client reads it.

Extension point: `build_app(api, extra_routes=[...])` mounts more Starlette routes (the live page at `/`,
`/metrics`) before the API's catch-all; the cli passes them, so this adapter imports neither render nor flows.

uvicorn internals: what uvicorn's documented settings cover is set through them (`timeout_keep_alive`,
`backlog`, `timeout_graceful_shutdown`, `headers`, `server_header`, `access_log`) and the body limits of the
routes are a Starlette middleware; the head deadline, the head limits, the connection caps, lingering close and
the inline answer to worker reports need the httptools protocol itself, so `EdgeProtocol` subclasses
`uvicorn.protocols.http.httptools_impl.HttpToolsProtocol`. pyproject pins uvicorn to the minor release this
was tested with, and tests/unit/test_uvicorn_contract.py fails, naming what moved, when an upgrade changes
the parts of the protocol and of `RequestResponseCycle` this module relies on.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import resource
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from http import HTTPStatus
from pathlib import Path
from typing import Any

import httptools
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from reconciler.adapters.controller.api import BodyNeeded, ControllerApi, PreparedReport, Request, Response
from reconciler.adapters.controller.protocol import MAX_BODY_BYTES, ApiError
from reconciler.adapters.store.port import ControllerStore
from reconciler.domain.tokens import bearer_token

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SERVER_NAME = "fleet-controller/1"
#: Key of the per-connection handle in `scope["extensions"]` (how the app tells the edge "authenticated").
EDGE_EXTENSION = "fleet.edge"
_PHRASES = {status.value: status.phrase for status in HTTPStatus}


@dataclass(frozen=True)
class EdgeLimits:
    """Deadlines and caps of the HTTP edge; defaults suit workers posting over the internet."""

    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 30.0
    max_unauthenticated: int = 512
    #: Unauthenticated connections from one address (a rented host with 8 GPUs is 8 workers behind one address,
    #: each opening a connection per report; behind a reverse proxy every client is the proxy: raise it there
    #: and limit per client in the proxy).
    max_unauthenticated_per_address: int = 64
    #: Connections of one token (a worker uses one at a time; the admin CLI a few).
    max_per_token: int = 16
    #: Every connection; None: from the open-file limit (soft RLIMIT_NOFILE) less `reserved_descriptors`.
    max_connections: int | None = None
    #: Descriptors kept for everything but connections (store files, git, log files, the event loop, pools).
    reserved_descriptors: int = 64
    #: Body size for the routes beside the worker API (the sign-in form is the only one that takes a body).
    route_max_body_bytes: int = 64 * 1024
    backlog: int = 2048
    max_header_line: int = 65536
    max_headers: int = 100
    max_head_bytes: int = 128 * 1024
    linger_s: float = 2.0
    linger_max_bytes: int = 4 * MAX_BODY_BYTES
    graceful_shutdown_s: float = 5.0


def _date() -> str:
    return email.utils.formatdate(time.time(), usegmt=True)


def _error_bytes(status: int, error: str, detail: Any) -> bytes:
    body = json.dumps({"error": error, "detail": detail}, ensure_ascii=True).encode("ascii")
    head = (f"HTTP/1.1 {status} {_PHRASES.get(status, 'Error')}\r\nServer: {SERVER_NAME}\r\nDate: {_date()}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nCache-Control: no-store\r\n"
            "Connection: close\r\n\r\n")
    return head.encode("latin-1") + body


# --- malformed heads: the answers of the earlier edge ----------------------------------------------------

_VERSION_ERRORS = ("Invalid major version", "Invalid minor version", "Expected dot", "Expected HTTP/",
                   "Invalid HTTP version", "Expected SOURCE method")
_LINE_END_ERRORS = ("Expected CRLF", "Missing expected CR", "Missing expected LF", "Expected LF")
_HEADER_ERRORS = ("Invalid header token", "Invalid header field char", "Invalid header value char",
                  "Unexpected whitespace after header value", "Unexpected space after start line")


def classify_parse_error(head: bytes, exc: Exception) -> tuple[int, str, str]:
    """(status, error, detail) for a head llhttp refused, worded as http.server/our earlier parser did, so
    clients and logs keep telling the same story: unknown method with a well-formed line is 405."""
    message = str(exc)
    first = head.split(b"\n", 1)[0].rstrip(b"\r").decode("latin-1")
    words = first.split()
    if isinstance(exc, httptools.HttpParserInvalidMethodError):
        if len(words) == 3 and words[1].startswith("/") and words[2].startswith("HTTP/"):
            return 405, "method not allowed", f"method {words[0][:32]!r} is not supported"
        return 400, "Bad request syntax", f"{first[:100]!r}"
    if any(message.startswith(prefix) for prefix in _LINE_END_ERRORS):
        return 400, "Bad request syntax", f"{message}: lines of a request head end with CRLF (RFC 9112 2.2)"
    if any(message.startswith(prefix) for prefix in _VERSION_ERRORS) and len(words) >= 3:
        return 400, f"Bad request version ({words[-1][:32]!r})", message
    if any(message.startswith(prefix) for prefix in _HEADER_ERRORS):
        return 400, "Bad header line", f"{message}; every header line must be 'Name: value' (CRLF)"
    if "Content-Length" in message or "Transfer-Encoding" in message:
        return 400, "bad Content-Length", message
    return 400, "Bad request syntax", message


class _Refuse(Exception):
    def __init__(self, status: int, error: str, detail: str):
        super().__init__(error)
        self.status, self.error, self.detail = status, error, detail


# --- connections -------------------------------------------------------------------------------------------


def connection_limit(limits: EdgeLimits) -> int:
    """`max_connections`, or what the open-file limit leaves for connections: accepting past it would fail with
    EMFILE (and take the descriptors the store and git need) instead of evicting someone."""
    if limits.max_connections is not None:
        return limits.max_connections
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(16, int(soft) - limits.reserved_descriptors)


def _oldest_idle_first(connections: Iterable[EdgeProtocol], spare: EdgeProtocol | None = None) -> EdgeProtocol | None:
    """The oldest connection that is idle (between requests, or still sending its head), else the oldest."""
    oldest = None
    for conn in connections:
        if conn is spare:
            continue
        if conn.evictable():
            return conn
        if oldest is None:
            oldest = conn
    return oldest


class ConnectionGuard:
    """The server's connections by age, by client address (while unauthenticated) and by token (once
    authenticated), and who gives way at a cap (see the module docstring). Runs on the event loop only."""

    def __init__(self, limits: EdgeLimits, max_connections: int):
        if min(limits.max_unauthenticated, limits.max_unauthenticated_per_address, limits.max_per_token,
               max_connections) < 1:
            raise ValueError(f"connection caps must be >= 1: {limits}")
        self.limits = limits
        self.max_connections = max_connections
        self._all: dict[EdgeProtocol, None] = {}
        self._waiting: dict[EdgeProtocol, None] = {}  # unauthenticated, oldest first
        self._by_address: dict[str, dict[EdgeProtocol, None]] = {}  # unauthenticated, per client address
        self._by_token: dict[str, dict[EdgeProtocol, None]] = {}
        self.peak = 0  # most unauthenticated connections at once
        self.peak_connections = 0
        self.evicted = 0
        self.refused = 0

    def __len__(self) -> int:
        """Unauthenticated connections now."""
        return len(self._waiting)

    @property
    def connections(self) -> int:
        return len(self._all)

    def held_by(self, token: str) -> int:
        return len(self._by_token.get(token, ()))

    def admit(self, conn: EdgeProtocol) -> bool:
        same_address = self._by_address.get(conn.address)
        if same_address is not None and len(same_address) >= self.limits.max_unauthenticated_per_address:
            self._evict(_oldest_idle_first(same_address))
        if len(self._waiting) >= self.limits.max_unauthenticated:
            self._evict(_oldest_idle_first(self._waiting))
        if len(self._all) >= self.max_connections:
            victim = self._victim_for_room()
            if victim is None:
                self.refused += 1
                return False
            self._evict(victim)
        self._all[conn] = None
        self._waiting[conn] = None
        self._by_address.setdefault(conn.address, {})[conn] = None
        self.peak = max(self.peak, len(self._waiting))
        self.peak_connections = max(self.peak_connections, len(self._all))
        return True

    def _victim_for_room(self) -> EdgeProtocol | None:
        """At the total cap: the oldest idle connection of the token holding the most (when it holds more than
        one), else the oldest idle connection, else the oldest unauthenticated one; None when every connection
        is an authenticated request under way. Oldest first: the newest (a probe, a worker's next report) stays."""
        if self._by_token:
            biggest: dict[EdgeProtocol, None] = max(self._by_token.values(), key=len)
            victim = _oldest_idle_first(biggest) if len(biggest) > 1 else None
            if victim is not None and victim.evictable():
                return victim
        for conn in self._all:
            if conn.evictable():
                return conn
        return next(iter(self._waiting), None)

    def authenticated(self, conn: EdgeProtocol, token: str) -> None:
        if conn not in self._all:
            return  # evicted or closed meanwhile
        self._forget_waiting(conn)
        group = self._by_token.setdefault(token, {})
        group[conn] = None
        if len(group) > self.limits.max_per_token:
            self._evict(_oldest_idle_first(group, spare=conn))

    def gone(self, conn: EdgeProtocol) -> None:
        self._all.pop(conn, None)
        self._forget_waiting(conn)
        if conn.token is not None:
            group = self._by_token.get(conn.token)
            if group is not None:
                group.pop(conn, None)
                if not group:
                    del self._by_token[conn.token]

    def _forget_waiting(self, conn: EdgeProtocol) -> None:
        if self._waiting.pop(conn, 0) is None:
            same_address = self._by_address[conn.address]
            same_address.pop(conn, None)
            if not same_address:
                del self._by_address[conn.address]

    def _evict(self, victim: EdgeProtocol | None) -> None:
        if victim is None:
            return
        self.evicted += 1
        self.gone(victim)
        victim.evict()


class _LingeringTransport:
    """The connection's transport as uvicorn sees it: `close()` first drains unread input (see module doc)."""

    def __init__(self, transport: asyncio.Transport, owner: EdgeProtocol):
        self._transport = transport
        self._owner = owner
        self._closing = False
        self._corked: list[bytes] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._corked is not None:
            self._corked.append(bytes(data))
        else:
            self._transport.write(data)

    def cork(self) -> None:
        """Hold writes until `uncork`: status line, headers and body leave in one send (one syscall, one
        segment; uvicorn writes the head and the body separately)."""
        if self._corked is None:
            self._corked = []

    def uncork(self) -> None:
        held, self._corked = self._corked, None
        if held and not self._transport.is_closing():
            self._transport.write(b"".join(held))

    def is_closing(self) -> bool:
        return self._closing or self._transport.is_closing()

    def close(self) -> None:
        if self._closing:
            return
        self.uncork()
        self._closing = True
        self._owner.closing()

    def hard_close(self) -> None:
        self.uncork()
        self._closing = True
        self._transport.close()


class EdgeProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with head/body deadlines, head limits, the unauthenticated cap, lingering
    close and JSON answers to malformed heads. `limits` and `guard` are set on a per-server subclass."""

    limits: EdgeLimits = EdgeLimits()
    guard: ConnectionGuard
    #: Worker reports are answered inline (see `_start_asgi_task`) by this API and group commit; None: ASGI only.
    reports: tuple[ControllerApi, GroupCommit] | None = None

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._edge_transport: _LingeringTransport | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._awaiting_head = True
        self._head_bytes = 0
        self._head_prefix = b""
        self._header_count = 0
        self._lingering = False
        self._lingered = 0
        self._done = False
        self._eof = False
        #: The token this connection belongs to, from its first authenticated request (None: unauthenticated).
        self.token: str | None = None
        self.address = "?"
        self._feeding = False
        self._inline_pending: tuple[RequestResponseCycle, Any] | None = None

    # --- life cycle ---

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._edge_transport = _LingeringTransport(transport, self)
        super().connection_made(self._edge_transport)  # type: ignore[arg-type]
        self.address = str((self.client or ("?",))[0])
        if not self.guard.admit(self):
            log.warning("refusing a connection from %s: all %d connections are authenticated requests under way",
                        self.address, self.guard.max_connections)
            self._edge_transport.hard_close()
            return
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._done = True
        self.guard.gone(self)
        for timer in (self._head_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def evictable(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def evict(self) -> None:
        log.debug("closing %s connection from %s to admit a new one",
                 "an unauthenticated" if self.token is None else "a worker's or admin's", self.address)
        self._done = True
        if self._edge_transport is not None:
            self._edge_transport.hard_close()

    @property
    def is_authenticated(self) -> bool:
        return self.token is not None

    def mark_authenticated(self, authorization: str | None) -> None:
        """The request on this connection presented a valid token (in `authorization`): the connection belongs
        to that token from now on."""
        if self.token is None:
            self.token = bearer_token(authorization) or ""
            self.guard.authenticated(self, self.token)

    # --- deadlines ---

    def _arm_head_timer(self) -> None:
        if self._head_timer is None and not self._done:
            self._head_timer = self.loop.call_later(self.limits.head_timeout_s, self._head_timeout)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._done or not self._awaiting_head:
            return
        if self._head_bytes:
            self._refuse(408, "request timeout",
                         f"request head not complete within {self.limits.head_timeout_s:g} s")
        elif self._edge_transport is not None:
            self._edge_transport.hard_close()  # nothing was sent on this connection: nothing to answer

    # --- parsing ---

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            self._lingered += len(data)
            if self._lingered > self.limits.linger_max_bytes and self._edge_transport is not None:
                self._edge_transport.hard_close()
            return
        if self._done:
            return
        self._unset_keepalive_if_required()
        if self._awaiting_head:
            self._head_bytes += len(data)
            if len(self._head_prefix) < 8192:
                self._head_prefix += data[:8192]
        self._feeding = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _Refuse):
                self._refuse(cause.status, cause.error, cause.detail)
            else:
                raise
            return
        except httptools.HttpParserUpgrade:
            self._refuse(400, "Bad request syntax", "protocol upgrades are not supported")
            return
        except httptools.HttpParserError as exc:
            status, error, detail = classify_parse_error(self._head_prefix, exc)
            self._refuse(status, error, detail)
            return
        finally:
            self._feeding = False
            pending, self._inline_pending = self._inline_pending, None
            if pending is not None:
                self._start_report(*pending)
        if self._awaiting_head and self._head_bytes > self.limits.max_head_bytes:
            self._refuse(431, "Request header fields too large",
                         f"request head longer than {self.limits.max_head_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._awaiting_head = True
        self._header_count = 0
        self._arm_head_timer()
        self.scope["extensions"] = {EDGE_EXTENSION: self}  # type: ignore[dict-item]  # ASGI allows any value

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.limits.max_header_line:
            raise _Refuse(414, "URI too long", f"request target longer than {self.limits.max_header_line} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            raise _Refuse(431, "Too many headers", f"got more than {self.limits.max_headers} headers")
        if len(name) + len(value) + 2 > self.limits.max_header_line:
            raise _Refuse(431, "Line too long", f"a header line is longer than {self.limits.max_header_line} bytes")
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        self._awaiting_head = False
        self._head_bytes = 0
        self._head_prefix = b""
        version = self.parser.get_http_version()
        if version not in ("1.0", "1.1"):
            raise _Refuse(505, f"Invalid HTTP version ({version})", "this server speaks HTTP/1.0 and HTTP/1.1")
        super().on_headers_complete()
        # uvicorn closes every HTTP/1.0 connection; `Connection: keep-alive` asks to keep it (RFC 9112 9.3).
        if version == "1.0" and self.parser.should_keep_alive() and self.cycle is not None:
            self.cycle.keep_alive = True

    def on_response_complete(self) -> None:
        if self.cycle is not None and self.cycle.more_body and self.cycle.keep_alive and \
                self._edge_transport is not None:
            # The answer left (part of) the body unread: the connection cannot carry another request.
            self.cycle.keep_alive = False
            self._edge_transport.close()
        super().on_response_complete()
        if self._eof and not self.pipeline and self.cycle is not None and self.cycle.response_complete:
            self._edge_transport.hard_close() if self._edge_transport is not None else None

    def closing_if_body_unread(self, scope: Scope, send: Send) -> Send:
        """`send` for the request of `scope`, adding `connection: close` to an answer that starts before the
        request's body is all in (a route that answers from the head: the admin's `destroyed`, a refusal). The
        unread rest ends the connection after the answer (`on_response_complete`); an answer that looked
        kept-alive is what a client reusing the connection meets as "Server disconnected without sending a
        response"."""
        cycle = next((c for c in (self.cycle, *(queued for queued, _ in self.pipeline))
                      if c is not None and c.scope is scope), None)
        if cycle is None:
            return send

        async def answer(message: Message) -> None:
            if message["type"] == "http.response.start" and cycle.more_body and cycle.keep_alive:
                headers = list(message.get("headers", ()))
                if not any(name.lower() == b"connection" and value.lower() == b"close" for name, value in headers):
                    message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        return answer

    # --- worker reports answered inline ---

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        """A worker report whose body is complete is answered without an ASGI task: the API and the group
        commit are called from the protocol and the answer is written here (same API, same bytes; the task,
        the receive/send messages and the body deadline's timer cost as much CPU as the API itself). A
        report whose body is still arriving (large, slow, `Expect: 100-continue`) takes the ASGI path."""
        if self.reports is not None and cycle.scope["method"] == "POST" and \
                cycle.scope["path"].startswith(WORKER_PREFIX):
            if self._feeding:  # its body may be in the data being parsed: decide when the feed is done
                self._inline_pending = (cycle, app)
                return
            if not cycle.more_body:  # a pipelined request started after the previous answer
                self._answer_inline(cycle)
                return
        super()._start_asgi_task(cycle, app)

    def _start_report(self, cycle: RequestResponseCycle, app: Any) -> None:
        transport = self._edge_transport
        if self._done or transport is None or transport.is_closing() or cycle.response_complete:
            return  # refused or closed while parsing: nothing to answer
        if cycle.more_body:
            super()._start_asgi_task(cycle, app)
        else:
            self._answer_inline(cycle)

    def _answer_inline(self, cycle: RequestResponseCycle) -> None:
        assert self.reports is not None
        api, commits = self.reports
        try:
            request = request_of(cycle.scope)  # type: ignore[arg-type]  # HTTPScope is a Scope
            step = api.begin(request)
            if not isinstance(step, BodyNeeded):
                self._send_inline(cycle, step, request.authorization)
                return
            self.mark_authenticated(request.authorization)
            if cycle.waiting_for_100_continue and self._edge_transport is not None:
                # As uvicorn's receive() does when the app reads the body: the same bytes on the wire
                # (a server may omit it once the body is here, RFC 9110 10.1.1; clients accept both).
                self._edge_transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                cycle.waiting_for_100_continue = False
            body = bytes(cycle.body)
            cycle.body = bytearray()
            if len(body) < step.length:
                self._send_inline(cycle, api.error_response(request, ApiError(
                    400, "incomplete body", f"got {len(body)} of {step.length} bytes", close=True)))
                return
            commits.submit(request, step, body[:step.length],
                           lambda response: self._send_inline(cycle, response, request.authorization))
        except Exception:
            log.exception("internal error on %s %s", cycle.scope["method"], cycle.scope["path"])
            self._send_inline(cycle, Response(500, {"error": "internal error", "detail": None}, close=True))

    def _send_inline(self, cycle: RequestResponseCycle, response: Response, authorization: str | None = None
                     ) -> None:
        """Write the answer as uvicorn's `send` would (default headers, lowercase names, `connection: close`
        when the connection ends) in one write, then finish the cycle as uvicorn does."""
        transport = self._edge_transport
        if self._done or cycle.disconnected or cycle.response_complete or transport is None or \
                transport.is_closing():
            return
        if response.authenticated:
            self.mark_authenticated(authorization)
        headers, body = _json_response(response)
        if response.close:
            cycle.keep_alive = False
        content = [STATUS_LINE[response.status]]
        for name, value in (*cycle.default_headers, *headers):
            content.extend((name, b": ", value, b"\r\n"))
        if not cycle.keep_alive and not response.close:  # (a closing answer carries the header already)
            content.append(b"connection: close\r\n")
        content.extend((b"\r\n", body))
        cycle.response_started = cycle.response_complete = True
        cycle.waiting_for_100_continue = False
        transport.write(b"".join(content))
        cycle.message_event.set()
        if not cycle.keep_alive:
            transport.close()
        cycle.on_response()

    # --- answers and closing ---

    def _refuse(self, status: int, error: str, detail: str) -> None:
        """Answer a head the server will not process, then close (draining unread input)."""
        self._cancel_head_timer()
        if self._edge_transport is None or self._done or self._lingering:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._edge_transport.hard_close()  # a response is in progress: no second one on this connection
            return
        log.info("refused a request from %s: %d %s", (self.client or ("?",))[0], status, error)
        self._edge_transport.write(_error_bytes(status, error, detail))
        self._edge_transport.close()

    def closing(self) -> None:
        """uvicorn closes the connection: half-close and drain while unread input may still arrive."""
        transport = self._edge_transport
        assert transport is not None
        unread = (self._awaiting_head and self._head_bytes > 0) or (
            self.cycle is not None and self.cycle.more_body)
        if not unread or not transport.can_write_eof() or self._done:
            transport.hard_close()
            return
        self._lingering = True
        with contextlib.suppress(Exception):
            transport.write_eof()
            transport.resume_reading()
        self._linger_timer = self.loop.call_later(self.limits.linger_s, transport.hard_close)

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio.Protocol's contract
        """A half-closed client (it sent everything, then shut down writing) still gets every answer."""
        if self._lingering or self._done:
            return None
        busy = self.pipeline or (self.cycle is not None and not self.cycle.response_complete)
        if not busy:
            return None
        self._eof = True
        if self.cycle is not None and self.cycle.more_body:
            # The body will never be completed: let the app see what arrived (it answers "incomplete body").
            self.cycle.more_body = False
            self.cycle.message_event.set()
        return True

    def send_400_response(self, msg: str) -> None:  # uvicorn's plain-text 400, replaced by the JSON answer
        self._refuse(400, "Bad request syntax", msg)


def _edge_protocol(limits: EdgeLimits, reports: tuple[ControllerApi, GroupCommit] | None = None
                   ) -> tuple[type[EdgeProtocol], ConnectionGuard]:
    guard = ConnectionGuard(limits, connection_limit(limits))
    protocol = type("ServerEdgeProtocol", (EdgeProtocol,), {"limits": limits, "guard": guard, "reports": reports})
    return protocol, guard


# --- the ASGI app ----------------------------------------------------------------------------------------


#: json.dumps's default encoder, its C core built once (json.dumps builds it on every call).
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_response_encoder = None if _c_make_encoder is None else _c_make_encoder(
    None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False, True)


def _json_text(value: Any) -> str:
    if _response_encoder is None:
        return json.dumps(value, ensure_ascii=True)
    return "".join(_response_encoder(value, 0))


def _json_response(response: Response) -> tuple[list[tuple[bytes, bytes]], bytes]:
    body = _json_text(response.body).encode("ascii")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode("ascii")),
               (b"cache-control", b"no-store")]
    headers.extend((name.encode("latin-1"), value.encode("latin-1")) for name, value in response.headers)
    if response.close:
        headers.append((b"connection", b"close"))
    return headers, body


async def _read_body(receive: Receive, length: int, timeout_s: float) -> bytes:
    """Exactly `length` bytes of the request body, or ApiError 400 (short) / 408 (too slow)."""
    chunks: list[bytes] = []
    received = 0
    try:
        async with asyncio.timeout(timeout_s):
            while received < length:
                message = await receive()  # immediate when the body came with the head (the usual case)
                if message["type"] != "http.request":
                    break
                chunk = message.get("body", b"")
                chunks.append(chunk)
                received += len(chunk)
                if not message.get("more_body", False):
                    break
    except TimeoutError:
        raise ApiError(408, "request timeout", f"body not received within {timeout_s:g} s", close=True) from None
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if len(body) < length:
        raise ApiError(400, "incomplete body", f"got {len(body)} of {length} bytes", close=True)
    return body[:length]


_INTERNAL_ERROR = Response(500, {"error": "internal error", "detail": None}, close=True)
#: CPU time a loop turn spends preparing reports before it lets other requests in (see GroupCommit._flush).
PREPARE_BUDGET_S = 0.02
#: Bodies larger than this are prepared on a thread of their own, off the event loop (see GroupCommit._flush).
INLINE_PREPARE_BYTES = 32 * 1024
#: Threads that write turns to a store across a network: one runs a transaction while the others' turns wait in
#: the store's group-commit queue, to be stored together by the next one.
WRITER_THREADS = 4


class GroupCommit:
    """Reports that are ready in the same event-loop turn are stored in one transaction.

    Each request still gets its own answer (a write that is refused or fails alone does not affect the
    others), but the COMMIT, which is most of a small write's cost, is paid once per turn. Every answer is
    sent only after that COMMIT: a 2xx still means "in the database"; the database being unavailable is a 503
    with Retry-After for every report of the turn (workers retry).

    A store across a network (`store.remote`: PostgreSQL) is written from writer threads: a transaction there
    waits on round trips to the server, and meanwhile the loop parses, validates and redacts the next reports;
    their turns queue in the store's own group commit (`SqlStore.write_all`), which stores them together when
    the transaction under way ends (the busier the server, the bigger the batch, rather than a loop stalled on a
    socket). An embedded store (SQLite) is written in the loop's own turn: its statements run in-process and a
    thread hand-over would cost more than it saves.

    The CPU work before the write stays off the loop's critical path: at most PREPARE_BUDGET_S of it per turn,
    and a body over INLINE_PREPARE_BYTES is prepared on a thread of its own (the loop takes the GIL back within
    the interpreter's switch interval), so a hostile worker's largest bodies never keep /healthz or other
    workers waiting.
    """

    def __init__(self, api: ControllerApi):
        self.api = api
        self._queue: list[tuple[Request, BodyNeeded, bytes, Callable[[Response], None]]] = []
        self._scheduled = False
        self._writers = ThreadPoolExecutor(max_workers=WRITER_THREADS, thread_name_prefix="store-writer") \
            if api.store.remote else None
        self._preparer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="report-preparer")
        #: Reports prepared off the loop, waiting for the next turn's write.
        self._prepared: list[tuple[PreparedReport, Callable[[Response], None]]] = []
        self.flushes = 0
        self.writes = 0

    def finish(self, request: Request, step: BodyNeeded, body: bytes) -> asyncio.Future[Response]:
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()

        def deliver(response: Response) -> None:
            if not future.done():
                future.set_result(response)

        self.submit(request, step, body, deliver)
        return future

    def submit(self, request: Request, step: BodyNeeded, body: bytes, deliver: Callable[[Response], None]) -> None:
        """Store the report with this turn's others; `deliver(response)` once they are committed."""
        self._queue.append((request, step, body, deliver))
        self._schedule()  # after the other requests of this turn queued theirs

    @staticmethod
    def _deliver(deliver: Callable[[Response], None], response: Response) -> None:
        try:
            deliver(response)
        except Exception:
            log.exception("could not answer a report")

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._queue = self._queue, []
        # First the CPU work of every report (parse, validate, redact), outside the write transaction, so its
        # row locks are held only while statements run. Refusals are answered at once. At most PREPARE_BUDGET_S
        # of it per loop turn: the rest waits for the next turn, so that a burst of the largest bodies (each
        # bounded: 256 KiB, redaction linear in it) never keeps the loop from reading other requests, /healthz
        # and other workers' reports, for longer than that.
        # A large body (a log batch near the 256 KiB limit can cost tens of milliseconds to redact) is prepared on
        # a thread instead: the loop goes on serving, and writes it with a later turn's reports.
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        pending, self._prepared = self._prepared, []
        for index, (request, step, body, deliver) in enumerate(batch):
            if index and time.perf_counter() - started > PREPARE_BUDGET_S:
                self._queue[:0] = batch[index:]
                self._schedule()
                break
            self.writes += 1
            if len(body) > INLINE_PREPARE_BYTES:
                aside = loop.run_in_executor(self._preparer, self._prepare, request, step, body)
                aside.add_done_callback(partial(self._prepared_aside, deliver))
                continue
            item = self._prepare(request, step, body)
            if isinstance(item, Response):
                self._deliver(deliver, item)
            else:
                pending.append((item, deliver))
        if not pending:
            return
        # The turn's writes in one transaction, with whatever other turns queued meanwhile (the store's group
        # commit; no savepoints: a write refuses before it modifies anything, and one that fails otherwise is
        # rolled back and the others stored without it).
        items = [item for item, _ in pending]
        if self._writers is None:
            self._answer(pending, self._store(items))
            return
        written = asyncio.get_running_loop().run_in_executor(self._writers, self._store, items)
        written.add_done_callback(partial(self._written, pending))

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _prepare(self, request: Request, step: BodyNeeded, body: bytes) -> PreparedReport | Response:
        try:
            return self.api.prepare(request, step, body)
        except Exception:
            log.exception("internal error on %s %s", request.method, step.action)
            return _INTERNAL_ERROR

    def _prepared_aside(self, deliver: Callable[[Response], None],
                        prepared: asyncio.Future[PreparedReport | Response]) -> None:
        if prepared.cancelled():  # the loop is closing: the server is stopping
            return
        item = prepared.result()
        if isinstance(item, Response):
            self._deliver(deliver, item)
            return
        self._prepared.append((item, deliver))
        self._schedule()

    def _written(self, pending: list[tuple[PreparedReport, Callable[[Response], None]]],
                 written: asyncio.Future[list[Response]]) -> None:
        if not written.cancelled():  # (cancelled: the loop is closing, the server is stopping)
            self._answer(pending, written.result())

    def _store(self, items: list[PreparedReport]) -> list[Response]:
        try:
            return self.api.store_all(items)
        except Exception:
            log.exception("internal error storing %d reports", len(items))
            return [_INTERNAL_ERROR] * len(items)

    def _answer(self, pending: list[tuple[PreparedReport, Callable[[Response], None]]],
                responses: list[Response]) -> None:
        self.flushes += 1
        for (_, deliver), response in zip(pending, responses, strict=True):
            self._deliver(deliver, response)


def controller_asgi(api: ControllerApi, body_timeout_s: float = EdgeLimits.body_timeout_s,
                    commits: GroupCommit | None = None) -> ASGIApp:
    """The controller API as an ASGI app: head -> api.begin -> (body) -> api.finish -> JSON answer."""
    commits = commits or GroupCommit(api)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = request_of(scope)
        step = api.begin(request)
        edge: EdgeProtocol | None = scope.get("extensions", {}).get(EDGE_EXTENSION)
        if isinstance(step, BodyNeeded):
            if edge is not None:
                edge.mark_authenticated(request.authorization)  # the token is good: the body may take its time
            try:
                body = await _read_body(receive, step.length, body_timeout_s)
            except ApiError as exc:
                response = api.error_response(request, exc)
            else:
                response = await commits.finish(request, step, body)
        else:
            response = step
        if response.authenticated and edge is not None:
            edge.mark_authenticated(request.authorization)
        headers, body_bytes = _json_response(response)
        transport = edge._edge_transport if edge is not None else None
        if transport is not None:
            transport.cork()
        try:
            await send({"type": "http.response.start", "status": response.status, "headers": headers})
            await send({"type": "http.response.body", "body": body_bytes})
        finally:
            if transport is not None:
                transport.uncork()

    return app


def request_of(scope: Scope) -> Request:
    """The API's view of an HTTP request head (ASGI scope)."""
    authorization = content_type = transfer_encoding = None
    lengths: list[str] = []
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorization = value.decode("latin-1")
        elif name == b"content-type":
            content_type = value.decode("latin-1")
        elif name == b"content-length":
            lengths.append(value.decode("latin-1").strip())
        elif name == b"transfer-encoding":
            transfer_encoding = value.decode("latin-1")
    raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
    query: bytes = scope.get("query_string", b"")
    target = raw_path.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")
    return Request(method=scope["method"], target=target, read_body=_no_sync_body, authorization=authorization,
                   content_type=content_type, content_lengths=tuple(lengths), transfer_encoding=transfer_encoding)


def _no_sync_body(length: int) -> bytes:
    raise RuntimeError("the ASGI edge reads bodies asynchronously (api.begin/finish)")


#: Worker reports (the ingest hot path) go straight to the API: no extra route may live under this prefix.
WORKER_PREFIX = "/api/v1/instances/"


class BodyLimits:
    """ASGI middleware (in Starlette's stack, outside its exception handling) for the routes beside the worker
    API: a declared body over `max_bytes` is 413 before the route runs; a body that is not in within
    `timeout_s` of the head (408) or grows past `max_bytes` (413) ends the route's read with an HTTPException,
    which Starlette answers; the connection is closed (the rest of the body is never read). A client gone in
    the middle of its body (or evicted) ends the request quietly."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float):
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and (not value.strip().isdigit() or int(value) > self.max_bytes):
                body = _json_text({"error": "body too large", "detail": f"the limit is {self.max_bytes} bytes"})
                await send({"type": "http.response.start", "status": 413,
                            "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body.encode()})
                return
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        received = 0

        async def limited() -> Message:
            nonlocal received
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise HTTPException(408, f"body not received within {self.timeout_s:g} s",
                                    headers={"Connection": "close"}) from None
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise HTTPException(413, f"body larger than {self.max_bytes} bytes", headers={"Connection": "close"})
            return message

        try:
            await self.app(scope, limited, send)
        except ClientDisconnect:
            return  # closed (or evicted) while the route read its body: nobody to answer, nothing to log


def build_app(api: ControllerApi, extra_routes: Sequence[BaseRoute] = (), *,
              body_timeout_s: float = EdgeLimits.body_timeout_s, commits: GroupCommit | None = None,
              route_max_body_bytes: int = EdgeLimits.route_max_body_bytes) -> ASGIApp:
    """The controller's ASGI app: `extra_routes` first (e.g. the live page at `/`, `/metrics`, matched by
    Starlette); every request no route matches goes to the controller API, which answers its own JSON
    404/405. Worker reports (`/api/v1/instances/...`) skip Starlette's middleware and routing: a third of
    the edge's cost per request on the ingest path."""
    controller = controller_asgi(api, body_timeout_s, commits)
    routed = Starlette(routes=list(extra_routes), middleware=[
        Middleware(BodyLimits, max_bytes=route_max_body_bytes, timeout_s=body_timeout_s)])
    # The API is the router's default, not a catch-all route: a route pattern would not match every path
    # (`.` stops at a newline in `/api/v1/instances/x%0A/register`), and the API answers its own 404/405.
    routed.router.default = controller
    routed.router.redirect_slashes = False

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await routed(scope, receive, send)
            return
        edge: EdgeProtocol | None = scope.get("extensions", {}).get(EDGE_EXTENSION)
        if edge is not None:
            send = edge.closing_if_body_unread(scope, send)
        if scope["path"].startswith(WORKER_PREFIX):
            await controller(scope, receive, send)
        else:
            await routed(scope, receive, send)

    return app


# --- the server -----------------------------------------------------------------------------------------


class _Server(uvicorn.Server):
    """uvicorn.Server that tells a waiting thread when it listens (or failed to)."""

    def __init__(self, config: uvicorn.Config):
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets=sockets)
        finally:
            self.ready.set()


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """Server TLS context: TLS 1.2+, the certificate chain and key from PEM files (clear error if unusable)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile=str(cert), keyfile=str(key))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot use TLS certificate {cert} with key {key}: {exc}") from None
    return context


class ControllerServer:
    """The controller API on a real socket (uvicorn in a background thread). `port=0` picks a free port;
    `url` tells which. `extra_routes` are mounted before the API (see build_app)."""

    def __init__(self, store: ControllerStore, secret: bytes, admin_token: str | None, host: str = "127.0.0.1",
                 port: int = 0, *, allow_open_reads: bool = False, max_body_bytes: int = MAX_BODY_BYTES,
                 now: Callable[[], datetime] | None = None, require_machine_claim: bool = False,
                 limits: EdgeLimits | None = None, tls_cert: Path | None = None, tls_key: Path | None = None,
                 extra_routes: Iterable[BaseRoute] = (),
                 health: Callable[[], Mapping[str, object]] | None = None):
        self.api = ControllerApi(store, secret, admin_token, allow_open_reads=allow_open_reads,
                                 max_body_bytes=max_body_bytes, now=now, require_machine_claim=require_machine_claim,
                                 health=health)
        self.host, self.port = host, port
        self.limits = limits or EdgeLimits()
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("TLS needs both a certificate and a key (--tls-cert and --tls-key)")
        if tls_cert is not None and tls_key is not None:
            tls_context(tls_cert, tls_key)  # a clear error now rather than a dead server thread later
        self._tls = (tls_cert, tls_key) if tls_cert is not None and tls_key is not None else None
        #: Worker reports this process stored (`writes`) and in how many transactions (`flushes`).
        self.commits = GroupCommit(self.api)
        self.app = build_app(self.api, list(extra_routes), body_timeout_s=self.limits.body_timeout_s,
                             commits=self.commits, route_max_body_bytes=self.limits.route_max_body_bytes)
        self.protocol, self.guard = _edge_protocol(self.limits, (self.api, self.commits))
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None

    @property
    def bound_port(self) -> int:
        if self._socket is None:
            raise RuntimeError("controller server is not started")
        return int(self._socket.getsockname()[1])

    @property
    def url(self) -> str:
        if self._socket is None:
            raise RuntimeError("controller server is not started")
        host, port = self._socket.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"{'https' if self._tls else 'http'}://{shown}:{port}"

    def _bind(self) -> socket.socket:
        info = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if info[0] == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(info[4])
            sock.listen(self.limits.backlog)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return sock

    def start(self) -> ControllerServer:
        if self._server is not None:
            return self
        sock = self._bind()
        tls: dict[str, Any] = {} if self._tls is None else {"ssl_certfile": str(self._tls[0]),
                                                              "ssl_keyfile": str(self._tls[1])}
        config = uvicorn.Config(
            self.app, http=self.protocol, loop="uvloop", lifespan="off", log_config=None, access_log=False,
            server_header=False, headers=[("Server", SERVER_NAME)], backlog=self.limits.backlog,
            timeout_keep_alive=int(max(1, self.limits.keep_alive_s)),
            timeout_graceful_shutdown=int(max(1, self.limits.graceful_shutdown_s)), proxy_headers=False, **tls)
        server = _Server(config)
        thread = threading.Thread(target=self._run, args=(server, sock), name="controller-http", daemon=True)
        self._server, self._thread, self._socket = server, thread, sock
        thread.start()
        if not server.ready.wait(timeout=30) or not server.started:
            self.stop()
            raise OSError(f"controller server did not start on {self.host}:{self.port}")
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        log.info("controller on %s: connections capped at %d (open-file limit %s; docs/security.md)",
                 self.url, self.guard.max_connections, "unlimited" if soft == resource.RLIM_INFINITY else soft)
        if self.limits.max_connections is None and self.guard.max_connections < 1024:
            log.warning("the open-file limit (%s) leaves %d connections for workers: raise it (systemd: "
                        "LimitNOFILE=65536)", soft, self.guard.max_connections)
        return self

    @staticmethod
    def _run(server: _Server, sock: socket.socket) -> None:
        import uvloop

        try:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(server.serve(sockets=[sock]))
        except BaseException:
            log.exception("controller server stopped with an error")
        finally:
            server.ready.set()

    def serve_forever(self) -> None:
        """Run until stop() is called from another thread (the CLI's signal handler)."""
        self.start()
        assert self._thread is not None
        self._thread.join()

    def stop(self) -> None:
        server, thread, sock = self._server, self._thread, self._socket
        if server is None:
            return
        server.should_exit = True
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.limits.graceful_shutdown_s + 10)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
        self._server = self._thread = None

    def __enter__(self) -> ControllerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""The controller's HTTP edge: serves `ControllerApi` to workers and humans over HTTP.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from reconciler.adapters.controller.api import ControllerApi, Request, Response
from reconciler.adapters.controller.protocol import MAX_BODY_BYTES, ApiError, _clip
from reconciler.adapters.store import (
    ControllerStore,
)

log = logging.getLogger(__name__)
REQUEST_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 256
LINGER_SECONDS = 2.0
LINGER_MAX_BYTES = 4 * MAX_BODY_BYTES


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

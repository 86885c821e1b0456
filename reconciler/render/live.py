"""HTTP routes of the operator surfaces: the live status page at `/`, its refresh fragment, `/status.json` and
`/metrics` (Starlette). The cli wires them into the controller's app (`fleet reconcile --listen`); they only
read: a snapshot callable gives the current status (cached by its source), nothing here writes anything.

Access (read-only): the admin token or a separate read token. Scripts send `Authorization: Bearer <token>`.
A browser signs in with the form, which POSTs the token (never in a URL: a URL stays in the browser's history
and in a proxy's access log), and gets a session: a random id in an HTTP-only, SameSite=Strict cookie with an
expiry (`Secure` when the page is served over TLS, here or by a proxy), the session itself in the controller
store (`SessionStore`: every replica knows it; the store keeps a hash of the id, never the cookie) until it
expires, the browser signs out (`/logout`), `fleet controller revoke-sessions` ends them all, or the token
that signed it in is rotated. A link that still carries `?token=` is answered 204 No Content: the browser
neither navigates nor records the URL, and nothing signs in. `Referrer-Policy: no-referrer` keeps URLs out of
Referer headers; the token never reaches a log (`install_access_log_redaction` masks `token=` in the ASGI
server's access log lines, and nothing here logs a request). Every response is `no-store`; pages carry a CSP
that allows only this page's one inline script (per-response nonce) and fetches to this origin.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from reconciler.domain.observations import parse_time
from reconciler.domain.redact import redact_line
from reconciler.domain.status import PAGE_SIZE, StatusQuery
from reconciler.domain.surfaces import LiveSnapshot
from reconciler.render.html import LivePage, render_fragment, render_login, render_page
from reconciler.render.metrics import CONTENT_TYPE, FleetMetrics

COOKIE_NAME = "fleet_status_session"
FRAGMENT_PATH = "/status/fragment"
LOGIN_PATH = "/login"
LOGOUT_PATH = "/logout"
MAX_LOGIN_BODY = 4096
_TOKEN_CONTEXT = b"gpu-fleet status page token v1\x00"
PAGE_CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'nonce-{nonce}'; "
            "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


class SessionStore(Protocol):
    """Where sign-in sessions live (the controller store: adapters/store/sql.py)."""

    def create_session(self, id_hash: str, token_fp: str, now: datetime, expires_at: datetime) -> None: ...

    def session(self, id_hash: str, now: datetime) -> str | None: ...

    def revoke_session(self, id_hash: str) -> bool: ...


def token_fingerprint(token: str) -> str:
    """What a session remembers of the token that signed it in: enough to end it when the token is rotated,
    nothing to sign in with."""
    return hashlib.sha256(_TOKEN_CONTEXT + token.encode()).hexdigest()


def session_key(session_id: str) -> str:
    """How the store finds a session: a hash of the cookie's id (a copy of the store holds no cookie)."""
    return hashlib.sha256(session_id.encode()).hexdigest()


@dataclass(frozen=True)
class ReadAccess:
    """Who may read: any of `tokens` (admin, read), by header or by a session in `sessions`. `open_reads` lifts
    the check (local demo on 127.0.0.1)."""

    tokens: tuple[str, ...]
    open_reads: bool = False
    #: The page is served over TLS (in this process, or by a proxy in front): the cookie is then never sent in clear.
    secure_cookie: bool = False
    cookie_max_age_s: int = 12 * 3600
    sessions: SessionStore | None = None
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))

    def __post_init__(self) -> None:
        if not self.open_reads and not any(self.tokens):
            raise ValueError("the status page needs a read or admin token (or open reads)")
        if not self.open_reads and self.sessions is None:
            raise ValueError("signing in to the status page needs a session store")

    def token_ok(self, presented: str | None) -> bool:
        if not presented:
            return False
        return any(t and hmac.compare_digest(presented.encode(), t.encode()) for t in self.tokens)

    def allows(self, request: Request) -> bool:
        if self.open_reads:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and self.token_ok(value.strip()):
            return True
        cookie = request.cookies.get(COOKIE_NAME)
        if not cookie or self.sessions is None:
            return False
        signed_by = self.sessions.session(session_key(cookie), self.clock())
        return signed_by is not None and any(
            t and hmac.compare_digest(signed_by, token_fingerprint(t)) for t in self.tokens)

    def signed_in(self, token: str, to: str = "/") -> Response:
        """A new session for a browser that presented `token`: the cookie, and a redirect to the page."""
        assert self.sessions is not None  # (__post_init__: no sign-in without a store)
        session_id = secrets.token_urlsafe(32)
        now = self.clock()
        self.sessions.create_session(session_key(session_id), token_fingerprint(token), now,
                                     now + timedelta(seconds=self.cookie_max_age_s))
        response = RedirectResponse(to, status_code=303, headers=_COMMON_HEADERS)
        response.set_cookie(COOKIE_NAME, session_id, max_age=self.cookie_max_age_s, path="/",
                            httponly=True, samesite="strict", secure=self.secure_cookie)
        return response

    def signed_out(self, request: Request) -> Response:
        cookie = request.cookies.get(COOKIE_NAME)
        if cookie and self.sessions is not None:
            self.sessions.revoke_session(session_key(cookie))
        response = RedirectResponse("/", status_code=303, headers=_COMMON_HEADERS)
        response.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="strict", secure=self.secure_cookie)
        return response


_COMMON_HEADERS = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff"}


def _html(body: str, status: int = 200, nonce: str | None = None) -> HTMLResponse:
    headers = dict(_COMMON_HEADERS)
    headers["Content-Security-Policy"] = PAGE_CSP.format(nonce=nonce or "none")
    return HTMLResponse(body, status_code=status, headers=headers)


#: Query parameters of the page, its fragment and /status.json (the same filters as `fleet status`).
QUERY_PARAMS = ("pool", "machine", "all", "since", "page")


class BadQuery(ValueError):
    """A filter parameter that cannot be read; the response names it."""


def status_query(params: Mapping[str, str] | Any, per_page: int | None) -> StatusQuery:
    """?pool=P&pool=Q&machine=M&all=1&since=TIME&page=N -> StatusQuery (repeatable pool/machine)."""
    getlist = getattr(params, "getlist", None)

    def many(name: str) -> frozenset[str]:
        values = getlist(name) if getlist is not None else ([params[name]] if name in params else [])
        return frozenset(part.strip() for v in values for part in v.split(",") if part.strip())

    since = None
    if params.get("since"):
        try:
            since = parse_time(params["since"])
        except ValueError:
            raise BadQuery(f"since={params['since']!r} is not an RFC 3339 time (e.g. 2026-12-02T22:00:00Z)") from None
    page_text = params.get("page") or "1"
    if not page_text.isdigit() or int(page_text) < 1:
        raise BadQuery(f"page={page_text!r} is not a page number (1, 2, ...)")
    return StatusQuery(everything=params.get("all") in ("1", "true", "on", "yes"), pools=many("pool"),
                       machines=many("machine"), since=since, page=int(page_text), per_page=per_page)


class StatusRoutes:
    """The routes; `snapshot(query)` gives the status (None: the default view), `metrics` the registry
    `/metrics` serves."""

    def __init__(self, snapshot: Callable[[StatusQuery | None], LiveSnapshot], access: ReadAccess, *,
                 metrics: FleetMetrics | None = None, refresh_s: float = 5.0, metrics_open: bool = False):
        self._snapshot = snapshot
        self._access = access
        self._metrics = metrics
        self._refresh_s = refresh_s
        self._metrics_open = metrics_open

    def routes(self) -> list[Route]:
        out = [Route("/", self.page, methods=["GET", "HEAD"]),
               Route(LOGIN_PATH, self.login, methods=["POST"]),
               Route(LOGOUT_PATH, self.logout, methods=["POST"]),
               Route(FRAGMENT_PATH, self.fragment, methods=["GET"]),
               Route("/status.json", self.status_json, methods=["GET"])]
        if self._metrics is not None:
            out.append(Route("/metrics", self.metrics, methods=["GET"]))
        return out

    def _login_page(self, problem: str | None = None) -> HTMLResponse:
        return _html(render_login(action=LOGIN_PATH, problem=problem), status=401)

    def page(self, request: Request) -> Response:
        if "token" in request.query_params:
            # A token in a URL is in the browser's history and a proxy's log already; signing in with it would
            # keep such links alive. 204: the browser stays where it was and records no visit.
            return Response(status_code=204, headers=_COMMON_HEADERS)
        if not self._access.allows(request):
            return self._login_page()
        try:
            snap = self._query_snapshot(request)
        except BadQuery as exc:
            return Response(f"{exc}\n", status_code=400, headers=_COMMON_HEADERS, media_type="text/plain")
        nonce = secrets.token_urlsafe(16)
        query = request.url.query
        live = LivePage(fragment_url=FRAGMENT_PATH + (f"?{query}" if query else ""), refresh_s=self._refresh_s,
                        nonce=nonce)
        return _html(render_page(snap.view, extras=snap.extras, spec_source=snap.spec_source, live=live), nonce=nonce)

    def _query_snapshot(self, request: Request) -> LiveSnapshot:
        params = request.query_params
        if not any(name in params for name in QUERY_PARAMS):
            return self._snapshot(None)
        return self._snapshot(status_query(params, PAGE_SIZE))

    async def login(self, request: Request) -> Response:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > MAX_LOGIN_BODY):
            return self._login_page("The sign-in form was too large.")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_LOGIN_BODY:
                return self._login_page("The sign-in form was too large.")
        fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
        token = (fields.get("token") or [""])[0].strip()
        if self._access.token_ok(token):
            return self._access.signed_in(token)
        return self._login_page("That token was not accepted.")

    def logout(self, request: Request) -> Response:
        return self._access.signed_out(request)

    def fragment(self, request: Request) -> Response:
        if not self._access.allows(request):
            return Response("sign in again", status_code=401, headers=_COMMON_HEADERS)
        try:
            snap = self._query_snapshot(request)
        except BadQuery as exc:
            return Response(f"{exc}\n", status_code=400, headers=_COMMON_HEADERS, media_type="text/plain")
        return _html(render_fragment(snap.view, extras=snap.extras, spec_source=snap.spec_source))

    def status_json(self, request: Request) -> Response:
        if not self._access.allows(request):
            return JSONResponse({"error": "unauthorized"}, status_code=401, headers=_COMMON_HEADERS)
        try:
            snap = self._query_snapshot(request)
        except BadQuery as exc:
            return JSONResponse({"error": str(exc)}, status_code=400, headers=_COMMON_HEADERS)
        doc: dict[str, Any] = snap.view.to_json()
        doc["economics"] = [{**e.__dict__, "meets_slo": e.meets_slo, "within_cap": e.within_cap}
                            for e in snap.extras.economics]
        doc["commits"] = [c.__dict__ for c in snap.extras.commits]
        doc["orphans"] = [o.__dict__ for o in snap.extras.orphans]
        return JSONResponse(doc, headers=_COMMON_HEADERS)

    def metrics(self, request: Request) -> Response:
        assert self._metrics is not None
        if not (self._metrics_open or self._access.allows(request)):
            return Response("unauthorized\n", status_code=401, headers=_COMMON_HEADERS,
                            media_type="text/plain")
        return Response(self._metrics.exposition(), headers=_COMMON_HEADERS, media_type=CONTENT_TYPE)


def status_app(routes: StatusRoutes, extra: Sequence[Route] = ()) -> Starlette:
    """A Starlette app with only these routes (tests; a status server beside an older controller)."""
    return Starlette(routes=[*routes.routes(), *extra])


class _RedactAccessLog(logging.Filter):
    """Masks credentials (`?token=...`) in access log lines before any handler formats them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact_line(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact_line(record.msg)
        return True


def install_access_log_redaction(logger_name: str = "uvicorn.access") -> None:
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, _RedactAccessLog) for f in logger.filters):
        logger.addFilter(_RedactAccessLog())

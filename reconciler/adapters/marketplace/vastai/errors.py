"""vast.ai's error semantics: what a refused call means, read from its status AND its body.

Pure. The same 404 can mean "gone", "offer taken" or "your session expired"; only the body tells them apart,
and a 404 we cannot explain is its own kind, never read as "gone". Facts in the package docstring.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.adapters.marketplace.vastai.wire import api_message

KIND_KEY_REFUSED = "key-refused"  # 401: unknown or deleted key ("Invalid user key")
KIND_SESSION_EXPIRED = "session-expired"  # vast answers 404 "Session expired. Please log in again."
KIND_PERMISSION = "permission-denied"  # 403: a scoped key without the permission (or 2FA authorization)
KIND_RATE_LIMITED = "rate-limited"  # 429, usually a plain-text body and no Retry-After
KIND_OFFER_TAKEN = "offer-taken"  # 404 no_such_ask: someone rented the offer since our search
KIND_NO_SUCH_INSTANCE = "no-such-instance"  # 404 no_such_instance: destroyed / never existed
#: The older documented answer to DELETE of a missing instance, 404 `{"error": "not_found", "msg": "Instance not
#: found"}` (vast-ai/docs api-reference/openapi/yaml/destroy_instance.yaml @c624622622496828c1ae58edec481bba1f5d675d):
#: it names no instance, so it is read as gone only once show-instance answers `{"instances": null}`.
KIND_INSTANCE_NOT_FOUND = "instance-not-found"
#: 429 `search_quota_exceeded`: the daily search row quota, with Retry-After in seconds, possibly hours.
KIND_SEARCH_QUOTA = "search-quota-exceeded"
KIND_SERVER = "server-error"  # 5xx
KIND_UNEXPLAINED_404 = "unexplained-404"  # a 404 whose body says nothing we know: never read as "gone"
KIND_REJECTED = "rejected"  # any other 4xx: the request itself is wrong

AUTH_KINDS = frozenset({KIND_KEY_REFUSED, KIND_SESSION_EXPIRED, KIND_PERMISSION})
_GONE = frozenset({KIND_NO_SUCH_INSTANCE})
_GONE_ON_DELETE = frozenset({KIND_NO_SUCH_INSTANCE, KIND_INSTANCE_NOT_FOUND})

_SESSION_EXPIRED = re.compile(r"session\s+expired", re.IGNORECASE)
#: A refused key, whatever the status: 401 on most routes, **404** on `POST /api/v0/bundles/` ("Unauthorized -
#: invalid or missing API key", msg "Invalid user key": vast-ai/docs api-reference/openapi/yaml/search_offers.yaml
#: @c624622622496828c1ae58edec481bba1f5d675d).
_INVALID_KEY = re.compile(r"invalid\s+user\s+key", re.IGNORECASE)
_INSTANCE_NOT_FOUND = re.compile(r"\Ainstance\s+not\s+found\.?\Z", re.IGNORECASE)
_OFFER_GONE = re.compile(r"(instance type|offer|ask).*(not available|no longer available|not found)", re.IGNORECASE)
_INSTANCE_GONE = re.compile(r"(no such instance|instance\s+\S+\s+(not found|does not exist))", re.IGNORECASE)


@dataclass(frozen=True)
class ApiError:
    """One refused call, read from its status AND body."""

    kind: str
    status: int
    code: str | None  # the body's `error`
    message: str | None  # the body's `msg`/`message`/`detail`, or its plain text

    @property
    def is_auth(self) -> bool:
        return self.kind in AUTH_KINDS


def classify_error(status: int, payload: Any, text: str = "") -> ApiError:
    """What a non-2xx answer means. Pure. The same 404 can mean "gone", "offer taken" or "your session
    expired": only the body tells them apart, and a 404 we cannot explain is its own kind."""
    code = payload.get("error") if isinstance(payload, Mapping) and isinstance(payload.get("error"), str) else None
    message = api_message(payload)
    if message is None and not isinstance(payload, Mapping) and text.strip() and "<html" not in text.lower():
        message = text.strip()
    said = f"{code or ''} {message or ''}"
    if status == 401 or (status == 404 and _INVALID_KEY.search(said)):
        kind = KIND_KEY_REFUSED
    elif status == 403:
        kind = KIND_PERMISSION
    elif status == 429:
        kind = KIND_SEARCH_QUOTA if code == "search_quota_exceeded" else KIND_RATE_LIMITED
    elif status >= 500:
        kind = KIND_SERVER
    elif code == "session_expired" or _SESSION_EXPIRED.search(said):
        kind = KIND_SESSION_EXPIRED
    elif code == "no_such_ask" or (status == 404 and _OFFER_GONE.search(said)):
        kind = KIND_OFFER_TAKEN
    elif code == "no_such_instance" or (status == 404 and _INSTANCE_GONE.search(said)):
        kind = KIND_NO_SUCH_INSTANCE
    elif status == 404 and code == "not_found" and message is not None and _INSTANCE_NOT_FOUND.match(message):
        kind = KIND_INSTANCE_NOT_FOUND
    elif status == 404:
        kind = KIND_UNEXPLAINED_404
    else:
        kind = KIND_REJECTED
    return ApiError(kind, status, code, message)

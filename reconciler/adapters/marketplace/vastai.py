"""The vast.ai adapter of the marketplace port: the only module that speaks vast.ai's REST API.

Place in the flow: the slot provider (Pulumi's dynamic provider, or `fleet apply` without Pulumi) asks
this client for offers, rents one, polls it and destroys it. Everything above sees only the dataclasses
of `base`; HTTP status codes, vast's JSON shapes and retries stop here.

Facts this follows (vast-ai/vast-cli `vastai/api/*.py` and docs.vast.ai, API reference):
- search: `POST /api/v0/bundles/`, body `{field: {op: value}, "order": [[field, dir]], "limit", "type"}`;
  the CLI always adds `verified`, `external`, `rentable`, `rented`, and `allocated_storage` (GiB, prices
  the disk into `dph_total`); `cpu_ram` is MB in the API and the CLI converts GB with a factor of 1000.
- create: `PUT /api/v0/asks/{offer_id}/` -> `{"success": true, "new_contract": id}`. `env` is a JSON
  object (`{"VAR": "val", "-p 8000:8000": "1"}`): the "-e K=V" string is only the CLI's input form,
  which the CLI parses into that object before sending. `runtype: "args"` keeps the image's
  entrypoint (the "entrypoint" launch mode); ssh/jupyter replace it with vast's own.
- list: `GET /api/v1/instances/` pages by `limit` (at most 25) and `after_token` = the previous
  page's `next_token`, filtered by `select_filters` (the CLI's `--label` sends `{"label": {"in": [...]}}`);
  one: `GET /api/v0/instances/{id}/` -> `{"instances": {...} | null}`; destroy: `DELETE /api/v0/instances/{id}/`.
- errors: read the BODY, not the status: 401 "Invalid user key" (deleted key),
  and **404** "Invalid user key" from the search `POST /bundles/` (vast-ai/docs search_offers.yaml), **404**
  "Session expired. Please log in again." (vast-cli vast.py), 403 a scoped key without the permission,
  404 `no_such_ask` (offer taken: try the next), 404 `no_such_instance` (gone), the older 404 `not_found`
  "Instance not found" on DELETE (gone only once show-instance says `{"instances": null}`), 429 with a plain-text
  body and no Retry-After (docs.vast.ai, rate limits and errors), 429 `search_quota_exceeded` with a Retry-After
  of possibly hours (honoured to the second: the key's endpoint is held, the error carries the delay). A 404 we
  cannot explain is never read as "gone".
- search results: `rented` is filtered here, as the CLI does (the server drops it); `truncated: true` marks an
  answer the server cut short, carried on the `OfferList` so nobody reads it as the whole market.
- limits: per key and endpoint; create about one per 4.5 s with a ~12 s penalty (observed). We pace every key
  (`Pacing`: a GCRA token bucket per endpoint class, shared by every client of the same key in the process),
  wait out a 429 and say so.
- create is slow and may commit after the client gave up: the CLI waits 120 s for every call; after a timeout,
  reset, 5xx or garbled answer we look the label up over a commit window before renting again.

Secrets: the API key lives in a masked holder, goes only into the Authorization header, and is scrubbed
from every message; the worker env (it carries the instance token) is never logged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import httpx

from reconciler.adapters.settings import VAST_API_KEY_ENV, settings
from reconciler.domain.backoff import backoff_delay
from reconciler.domain.marketplace import (
    Instance,
    InstanceRequest,
    MarketplaceAuthError,
    MarketplaceError,
    MarketplaceRateLimitedError,
    Offer,
    OfferList,
    OfferQuery,
    OfferTakenError,
    PermanentMarketplaceError,
    TemporaryMarketplaceError,
)

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://console.vast.ai/api/v0"
API_KEY_ENV = VAST_API_KEY_ENV
#: vast rejects longer onstart scripts.
ONSTART_MAX_CHARS = 4048
#: vast's CLI converts `cpu_ram` GB -> MB with this factor (offers_mult), so do we.
CPU_RAM_MB_PER_GB = 1000.0
#: "args" runs the image's own entrypoint (our worker); "ssh"/"jupyter" would replace it with vast's.
DEFAULT_RUNTYPE = "args"
#: The v1 instance list serves at most 25 rows a page.
INSTANCE_PAGE_LIMIT = 25
#: A list that still has a next page after this many is a server bug, not a fleet.
MAX_INSTANCE_PAGES = 400
#: Longest piece of an API error message quoted in our exceptions.
MAX_QUOTED_MESSAGE = 300

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Characters that mean the same thing to docker, a shell and vast's env handling: no quotes, `$`,
# backslashes, tabs/newlines or separators. Plain spaces are allowed: GPU names have them ("RTX 4090"),
# and a value with spaces but no quotes can always be single-quoted. Our values (URLs, hex tokens,
# digests, numbers, names) fit in it.
_ENV_VALUE = re.compile(r"[A-Za-z0-9_./:@%+=,~ -]*")
_NUMERIC_ID = re.compile(r"[0-9]{1,19}")

#: vast `actual_status` -> ours (base.INSTANCE_STATUSES). `None` (no status yet) is "loading" too.
_STATUS_MAP = {
    "created": "loading",
    "loading": "loading",
    "scheduling": "scheduling",
    "running": "running",
    "rebooting": "rebooting",
    "frozen": "frozen",
    "stopped": "stopped",
    "exited": "exited",
    "offline": "offline",
    "unknown": "unknown",
}


# --------------------------------------------------------------------------------------------------
# Settings


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded jittered exponential backoff for 429, 5xx, timeouts and connection errors."""

    max_attempts: int = 5
    base_delay_s: float = 1.0
    max_delay_s: float = 30.0
    #: A server asking for a longer pause than this gets this; the caller retries later anyway.
    max_retry_after_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be at least 1, got {self.max_attempts}")


@dataclass(frozen=True)
class Timeouts:
    """Explicit limits on every call: a hung API must not hang a reconcile pass or `pulumi up`."""

    connect_s: float = 5.0
    read_s: float = 30.0
    write_s: float = 30.0
    pool_s: float = 5.0
    #: Read timeout of a create: vast-cli waits 120 s for every call ("Conservative enough for slow operations
    #: like ... instance creation", vastai/api/client.py); a create regularly takes longer than 30 s.
    create_s: float = 120.0

    def to_httpx(self, read_s: float | None = None) -> httpx.Timeout:
        return httpx.Timeout(connect=self.connect_s, read=self.read_s if read_s is None else read_s,
                             write=self.write_s, pool=self.pool_s)


class _Secret:
    """Holds the API key so that repr(), vars() dumps and tracebacks show a mask, never the key."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__


# --------------------------------------------------------------------------------------------------
# Pure core: request bodies, parsing, client-side checks, backoff


def _id_value(machine_id: str) -> int | str:
    """vast's machine ids are integers; a filter on a string would not match them."""
    return int(machine_id) if _NUMERIC_ID.fullmatch(machine_id) else machine_id


def build_search_body(query: OfferQuery) -> dict[str, Any]:
    """OfferQuery -> the `POST /bundles/` body. Ranking is the planner's: we only ask for cheapest first."""
    body: dict[str, Any] = {
        "gpu_name": {"eq": query.gpu_name},
        "num_gpus": {"eq": query.num_gpus},
        "dph_total": {"lte": query.max_price_usd_per_hour},
        "reliability": {"gte": query.min_reliability},
        "inet_down": {"gte": query.min_inet_down_mbps},
        "disk_space": {"gte": query.min_disk_gb},
        "cpu_ram": {"gte": query.min_cpu_ram_gb * CPU_RAM_MB_PER_GB},
        "cuda_max_good": {"gte": query.min_cuda},
        "rentable": {"eq": True},
        "rented": {"eq": False},
        # "external" offers are listings outside vast's own scheduling; the CLI excludes them by default.
        "external": {"eq": False},
    }
    if query.verified_only:
        body["verified"] = {"eq": True}
    if query.exclude_machine_ids:
        body["machine_id"] = {"notin": [_id_value(m) for m in sorted(query.exclude_machine_ids)]}
    if query.min_disk_gb > 0:
        # Prices our disk into dph_total, so the price cap compares what we would really pay.
        body["allocated_storage"] = query.min_disk_gb
    body["order"] = [["dph_total", "asc"]]
    body["limit"] = query.limit
    body["type"] = "on-demand"
    return body


def _number(raw: Mapping[str, Any], key: str, default: float | None = None) -> float:
    value = raw.get(key)
    if value is None:
        if default is None:
            raise ValueError(f"missing {key}")
        return default
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{key} is not a number: {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{key} is not a number: {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{key} is not finite: {value!r}")
    return number


def _ident(raw: Mapping[str, Any], key: str) -> str:
    value = raw.get(key)
    if isinstance(value, bool) or value is None:
        raise ValueError(f"missing {key}")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise ValueError(f"{key} is not an id: {value!r}")


def _optional_text(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    return value if isinstance(value, str) and value else None


def parse_offer(raw: Any) -> Offer:
    """One element of `offers` -> Offer. Raises ValueError naming the bad field."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"offer is not an object: {type(raw).__name__}")
    gpu_name = raw.get("gpu_name")
    if not isinstance(gpu_name, str) or not gpu_name:
        raise ValueError("missing gpu_name")
    reliability_key = "reliability" if raw.get("reliability") is not None else "reliability2"
    verified = raw.get("verified")
    if not isinstance(verified, bool):
        verified = raw.get("verification") == "verified"
    num_gpus = _number(raw, "num_gpus")
    if not num_gpus.is_integer() or num_gpus < 1:
        raise ValueError(f"num_gpus is not a positive integer: {raw.get('num_gpus')!r}")
    return Offer(
        offer_id=_ident(raw, "id"),
        machine_id=_ident(raw, "machine_id"),
        host_id=_ident(raw, "host_id"),
        gpu_name=gpu_name,
        num_gpus=int(num_gpus),
        price_usd_per_hour=_number(raw, "dph_total"),
        # An offer that does not state its reliability is treated as unreliable, not as perfect.
        reliability=_number(raw, reliability_key, 0.0),
        inet_down_mbps=_number(raw, "inet_down", 0.0),
        disk_gb=_number(raw, "disk_space", 0.0),
        cpu_ram_gb=_number(raw, "cpu_ram", 0.0) / CPU_RAM_MB_PER_GB,
        cuda_max_good=_number(raw, "cuda_max_good", 0.0),
        verified=verified,
        geolocation=_optional_text(raw, "geolocation"),
    )


def offer_mismatch(offer: Offer, raw: Mapping[str, Any], query: OfferQuery) -> str | None:
    """Why an offer the API returned does not satisfy the query (None when it does).

    Defence in depth: the API has ignored filters before (an unknown field is only a warning), and a
    bad machine must never come back because a server-side filter was dropped.
    """
    if offer.machine_id in query.exclude_machine_ids:
        return f"machine {offer.machine_id} is excluded"
    checks: list[tuple[bool, str]] = [
        (offer.gpu_name == query.gpu_name, f"gpu_name {offer.gpu_name!r} != {query.gpu_name!r}"),
        (offer.num_gpus == query.num_gpus, f"num_gpus {offer.num_gpus} != {query.num_gpus}"),
        (
            offer.price_usd_per_hour <= query.max_price_usd_per_hour,
            f"dph_total {offer.price_usd_per_hour} > {query.max_price_usd_per_hour}",
        ),
        (offer.reliability >= query.min_reliability, f"reliability {offer.reliability} < {query.min_reliability}"),
        (
            offer.inet_down_mbps >= query.min_inet_down_mbps,
            f"inet_down {offer.inet_down_mbps} < {query.min_inet_down_mbps}",
        ),
        (offer.disk_gb >= query.min_disk_gb, f"disk_space {offer.disk_gb} < {query.min_disk_gb}"),
        (offer.cpu_ram_gb >= query.min_cpu_ram_gb, f"cpu_ram {offer.cpu_ram_gb} GB < {query.min_cpu_ram_gb} GB"),
        (offer.cuda_max_good >= query.min_cuda, f"cuda_max_good {offer.cuda_max_good} < {query.min_cuda}"),
        (offer.verified or not query.verified_only, "not verified"),
        (raw.get("rentable") is not False, "not rentable"),
        # `rented` is no server-side filter: the server drops the key and the official CLI filters the rows
        # itself, a missing or null `rented` counting as False (vast-ai/vast-cli vast.py search__offers, "if
        # 'rented' in query" after the POST, @55679830a2c2adcf5c7fad08bf08717a9591062a).
        (raw.get("rented") is not True, "already rented"),
    ]
    for ok, reason in checks:
        if not ok:
            return reason
    return None


def parse_offers(payload: Any, query: OfferQuery) -> OfferList:
    """The `/bundles/` response -> offers that satisfy `query`, in the API's order.

    A malformed offer is skipped with a warning: one bad listing must not hide the rest of the market.
    A response without an `offers` list is unusable as a whole: ValueError. `truncated: true` (the server cut
    its answer short) is carried on the result: what it lacks may fit, so it is never read as complete.
    """
    if not isinstance(payload, Mapping) or not isinstance(payload.get("offers"), list):
        raise ValueError("response has no 'offers' list")
    offers: list[Offer] = []
    seen: set[str] = set()
    dropped = 0
    for index, raw in enumerate(payload["offers"]):
        try:
            offer = parse_offer(raw)
        except ValueError as exc:
            log.warning("vast.ai: skipping malformed offer #%d: %s", index, exc)
            dropped += 1
            continue
        reason = offer_mismatch(offer, raw, query)
        if reason is not None:
            log.info("vast.ai: dropping offer %s on machine %s: %s", offer.offer_id, offer.machine_id, reason)
            dropped += 1
            continue
        if offer.offer_id in seen:
            continue
        seen.add(offer.offer_id)
        offers.append(offer)
    truncated = payload.get("truncated") is True
    if truncated:
        log.info("vast.ai: the search answer was truncated (%d offers returned, %d kept): not the whole market",
                 len(payload["offers"]), len(offers))
    return OfferList(offers, truncated=truncated, dropped=dropped)


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    """Validate the worker env. Errors name the variable, never its value (it may be the token)."""
    checked: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            # A name such as "-v /:/host" would be read by vast as a docker flag, not a variable.
            raise PermanentMarketplaceError(f"env: {name!r} is not a valid environment variable name")
        if not isinstance(value, str):
            raise PermanentMarketplaceError(f"env: value of {name} is a {type(value).__name__}, not a string")
        bad = sorted({ch for ch in value if not _ENV_VALUE.fullmatch(ch)})
        if bad:
            shown = ", ".join(repr(ch) for ch in bad[:5])
            raise PermanentMarketplaceError(
                f"env: value of {name} contains characters that are unsafe in a docker/shell env ({shown}); "
                "allowed: letters, digits, spaces and _ . / : @ % + = , ~ -"
            )
        checked[name] = value
    return checked


def docker_env_flags(env: Mapping[str, str]) -> str:
    """The same env in vast's CLI/GUI form ("-e K=V -e K2='V 2'"), for templates and humans.

    Values passed `check_env` (no quotes in them), so single quotes around those with spaces suffice.
    """
    return " ".join(
        f"-e {name}='{value}'" if " " in value else f"-e {name}={value}" for name, value in check_env(env).items()
    )


def build_create_body(request: InstanceRequest, runtype: str = DEFAULT_RUNTYPE) -> dict[str, Any]:
    """InstanceRequest -> the `PUT /asks/{id}/` body. Raises PermanentMarketplaceError on bad input."""
    if not request.image:
        raise PermanentMarketplaceError("create: image is empty")
    if not request.label:
        raise PermanentMarketplaceError("create: label is empty (it is how we find our instance again)")
    if request.disk_gb <= 0:
        raise PermanentMarketplaceError(f"create: disk_gb must be positive, got {request.disk_gb}")
    if request.onstart is not None and len(request.onstart) > ONSTART_MAX_CHARS:
        raise PermanentMarketplaceError(
            f"create: onstart is {len(request.onstart)} characters; vast.ai accepts at most {ONSTART_MAX_CHARS}"
        )
    body: dict[str, Any] = {
        "client_id": "me",
        "image": request.image,
        "disk": request.disk_gb,
        "label": request.label,
        "env": check_env(request.env),
        "runtype": runtype,
    }
    if request.onstart is not None:
        body["onstart"] = request.onstart
    if request.image_login is not None:
        body["image_login"] = request.image_login
    return body


def normalise_status(actual_status: Any) -> str:
    """vast's `actual_status` -> one of base.INSTANCE_STATUSES."""
    if actual_status is None:
        # A fresh contract reports no status until its machine picks it up.
        return "loading"
    if not isinstance(actual_status, str):
        return "unknown"
    return _STATUS_MAP.get(actual_status.strip().lower(), "unknown")


def parse_instance(raw: Any) -> Instance:
    """One instance row (v0 or v1 shape) -> Instance. Raises ValueError naming the bad field."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"instance is not an object: {type(raw).__name__}")
    label = raw.get("label")
    price = raw.get("dph_total")
    start = raw.get("start_date")
    return Instance(
        contract_id=_ident(raw, "id"),
        label=label.strip() if isinstance(label, str) and label.strip() else None,
        machine_id=_ident(raw, "machine_id"),
        host_id=_ident(raw, "host_id"),
        status=normalise_status(raw.get("actual_status")),
        gpu_name=_optional_text(raw, "gpu_name"),
        price_usd_per_hour=_number(raw, "dph_total") if price is not None else None,
        image=_optional_text(raw, "image_uuid"),
        status_msg=_optional_text(raw, "status_msg"),
        start_date=_number(raw, "start_date") if start is not None else None,
    )


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is rare for APIs; we fall back to our own backoff)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def retry_delay(attempt: int, policy: RetryPolicy, retry_after: float | None, jitter: float) -> float:
    """Pause before attempt `attempt + 1`. `jitter` in [0, 1) spreads clients that failed together."""
    if retry_after is not None:
        return min(retry_after, policy.max_retry_after_s)
    return backoff_delay(attempt, policy.base_delay_s, policy.max_delay_s, jitter)


def _api_message(payload: Any) -> str | None:
    if isinstance(payload, Mapping):
        for key in ("msg", "error", "detail", "message"):
            value = payload.get(key)
            if isinstance(value, str) and value.strip():
                return value.strip()
    return None


# --------------------------------------------------------------------------------------------------
# Error semantics: from the body, not the status alone

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
    message = _api_message(payload)
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


# --------------------------------------------------------------------------------------------------
# Pacing: per API key, create slower than reads


@dataclass(frozen=True)
class Pacing:
    """How fast one API key may call vast.ai, and how long to wait after a 429.

    vast limits each endpoint per identity (key) with a minimum interval; create at about one per 4.5 s with
    a ~12 s penalty when exceeded, and no Retry-After (issue 15; docs.vast.ai rate limits). Read limits are
    not published: 2 a second with a burst of 2 stays under any "few a second" limit."""

    create_interval_s: float = 5.0
    read_rate_per_s: float = 2.0
    read_burst: int = 2
    #: After a 429 on create without Retry-After: the ~12 s penalty plus a margin (the penalty re-arms on
    #: every early call, so waiting less only makes it longer).
    create_penalty_wait_s: float = 13.0
    #: After a 429 on a read without Retry-After: exponential from this, capped below.
    read_backoff_base_s: float = 2.0
    read_backoff_max_s: float = 30.0
    #: 429s one call tolerates before giving up with a temporary error (a later apply retries).
    max_rate_limited: int = 8
    #: Waits at least this long are said out loud (notify), shorter ones only logged.
    announce_after_s: float = 1.0

    def scaled(self, factor: float) -> Pacing:
        """Every interval times `factor` (tests against the fake in another process: both sides scaled alike)."""
        return replace(self, create_interval_s=self.create_interval_s * factor,
                       read_rate_per_s=self.read_rate_per_s / factor,
                       create_penalty_wait_s=self.create_penalty_wait_s * factor,
                       read_backoff_base_s=self.read_backoff_base_s * factor,
                       read_backoff_max_s=self.read_backoff_max_s * factor,
                       announce_after_s=self.announce_after_s * factor)


class GcraBucket:
    """A token bucket as GCRA: calls go at most `rate` a second with bursts of `burst`, in arrival order.

    `reserve(now)` books the next slot and returns when the caller may go; `block(until)` holds every later
    caller until then (a 429's penalty). Thread-safe; pure arithmetic on the injected clock's readings."""

    def __init__(self, rate_per_s: float, burst: int = 1):
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(f"bad bucket: rate {rate_per_s}/s, burst {burst}")
        self.interval = 1.0 / rate_per_s
        self.tolerance = (burst - 1) * self.interval
        self.tat = float("-inf")  # theoretical arrival time of the next call
        self.blocked_until = float("-inf")
        self.blocked_why = ""  # what the server said when it asked for the longest wait
        self._lock = threading.Lock()

    def reserve(self, now: float) -> float:
        with self._lock:
            go = max(now, self.tat - self.tolerance, self.blocked_until)
            self.tat = max(self.tat, go) + self.interval
            return go

    def block(self, until: float, why: str = "") -> None:
        """Nobody goes before `until`, and then one at a time: no burst right after a penalty."""
        with self._lock:
            if until > self.blocked_until:
                self.blocked_until, self.blocked_why = until, why
            self.tat = max(self.tat, until + self.tolerance)


class KeyPacer:
    """The buckets of one API key: creates, and each read/destroy endpoint class."""

    def __init__(self, pacing: Pacing, clock: Callable[[], float] | None = None):
        self.pacing = pacing
        self.clock = clock
        self._buckets: dict[str, GcraBucket] = {}
        self._lock = threading.Lock()

    def bucket(self, endpoint: str) -> GcraBucket:
        with self._lock:
            if endpoint not in self._buckets:
                if endpoint == ENDPOINT_CREATE:
                    self._buckets[endpoint] = GcraBucket(1.0 / self.pacing.create_interval_s, 1)
                else:
                    self._buckets[endpoint] = GcraBucket(self.pacing.read_rate_per_s, self.pacing.read_burst)
            return self._buckets[endpoint]


ENDPOINT_CREATE = "create"
ENDPOINT_SEARCH = "search"
ENDPOINT_SHOW = "show"
ENDPOINT_LIST = "list"
ENDPOINT_DESTROY = "destroy"

_PACERS: dict[tuple[str, int], KeyPacer] = {}
_PACERS_LOCK = threading.Lock()


def pacer_for(key: str, clock: Callable[[], float], pacing: Pacing) -> KeyPacer:
    """One pacer per (key, clock) in this process: every client of a key shares its budget (Pulumi creates
    slots from several threads; `fleet apply` observes, sweeps and creates with one key)."""
    ident = (hashlib.sha256(key.encode()).hexdigest(), id(clock))
    with _PACERS_LOCK:
        pacer = _PACERS.get(ident)
        # The pacer keeps its clock alive, so no later clock can take its id and inherit its holds (a
        # Retry-After of hours held on one test's virtual clock must not reach another's).
        if pacer is None or pacer.pacing != pacing or pacer.clock is not clock:
            pacer = _PACERS[ident] = KeyPacer(pacing, clock)
        return pacer


#: After an ambiguous create (timeout, reset, 5xx, garbled answer): look for the label at these pauses
#: (seconds, cumulative 120 s - the CLI's own create timeout) before renting again. A create that commits
#: later than that is caught by the slot provider's duplicate check (two instances for one slot).
LABEL_LOOKUP_PAUSES_S: tuple[float, ...] = (0.0, 5.0, 10.0, 15.0, 30.0, 60.0)


# --------------------------------------------------------------------------------------------------
# Imperative shell: HTTP with pacing and retries


@dataclass(frozen=True)
class TimeSource:
    """The clock the pacer reads and the sleep it waits with. Tests swap `TIME` for the fake's virtual clock
    when the client is built deep inside a command (`fleet apply`); everything else passes them directly."""

    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


TIME = TimeSource()


@dataclass(frozen=True)
class _Failure:
    """A retryable failure of one attempt. `maybe_processed`: the server may have acted on it."""

    description: str
    maybe_processed: bool
    retry_after: float | None = None


@dataclass(frozen=True)
class _Reply:
    status: int
    payload: Any


@dataclass(frozen=True)
class _RateLimited:
    retry_after: float | None
    body: str
    code: str | None = None  # the body's `error`, e.g. search_quota_exceeded


class VastAiMarketplace:
    """`base.Marketplace` over vast.ai's REST API (or the strict fake of it on 127.0.0.1 in tests)."""

    def __init__(
        self,
        api_key: str | None = None,
        *,
        key_source: str | None = None,
        base_url: str = DEFAULT_BASE_URL,
        timeouts: Timeouts | None = None,
        retry: RetryPolicy | None = None,
        pacing: Pacing | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
        jitter: Callable[[], float] = random.random,
        notify: Callable[[str], None] | None = None,
        label_lookup_pauses_s: Sequence[float] = LABEL_LOOKUP_PAUSES_S,
        time_scale: float = 1.0,
        runtype: str = DEFAULT_RUNTYPE,
        environ: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ):
        """`key_source` names where the key came from, for the message when vast refuses it. `notify` hears
        every wait worth telling an operator about (pacing, 429s, label lookups); default: the log."""
        key: str | None = api_key
        source = key_source or "the api_key argument"
        if key is None:
            from_env = settings(environ).vast_api_key
            key = from_env.reveal() if from_env else None
            source = key_source or (from_env.source if from_env else f"${VAST_API_KEY_ENV}")
        if key is None or not key.strip():
            raise MarketplaceAuthError(f"no vast.ai API key: pass one or set {VAST_API_KEY_ENV}",
                                       kind="no-key", key_source=source)
        key = key.strip()
        if any(ch.isspace() or not ch.isprintable() for ch in key):
            raise MarketplaceAuthError(f"the vast.ai API key from {source} contains whitespace or control characters",
                                       kind="bad-key", key_source=source)
        self._key = _Secret(key)
        self.key_source = source
        self._base_url = base_url.rstrip("/")
        parts = urlsplit(self._base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"vast.ai base_url {base_url!r} is not an http(s) URL")
        if not self._base_url.endswith("/v0"):
            raise ValueError(f"vast.ai base_url {base_url!r} must end in /v0 (the v1 list endpoint sits beside it)")
        self._v1_url = self._base_url[: -len("/v0")] + "/v1"
        self._retry = retry or RetryPolicy()
        self._timeouts = timeouts or Timeouts()
        if not 0 < time_scale <= 1:
            raise ValueError(f"time_scale must be in (0, 1], got {time_scale}")
        # time_scale < 1 only for a fake in another process (Pulumi's provider host in tests): every pace,
        # penalty and lookup pause shrinks alike, so the fake's equally scaled limits stay binding.
        self._pacing = (pacing or Pacing()).scaled(time_scale) if time_scale != 1 else (pacing or Pacing())
        self._clock = clock or TIME.clock
        self._sleep = sleep or TIME.sleep
        self._jitter = jitter
        self.notify = notify
        self._label_pauses = tuple(p * time_scale for p in label_lookup_pauses_s)
        self._runtype = runtype
        self._pacer = pacer_for(key, self._clock, self._pacing)
        self._http = httpx.Client(
            timeout=self._timeouts.to_httpx(),
            transport=transport,
            headers={"Accept": "application/json", "User-Agent": "gpu-fleet-reconciler"},
            follow_redirects=False,
        )

    def __repr__(self) -> str:
        return f"VastAiMarketplace(base_url={self._base_url!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> VastAiMarketplace:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the port --------------------------------------------------------------------------------

    def search_offers(self, query: OfferQuery) -> Sequence[Offer]:
        reply = self._call("POST", f"{self._base_url}/bundles/", ENDPOINT_SEARCH, json_body=build_search_body(query))
        try:
            return parse_offers(reply.payload, query)
        except ValueError as exc:
            raise TemporaryMarketplaceError(f"vast.ai search returned an unusable response: {exc}") from None

    def create_instance(self, offer_id: str, request: InstanceRequest) -> str:
        """Rent the offer, at most once per label.

        After an answer that may hide a rental (timeout, reset, 5xx, garbled body), the label is looked up
        over a commit window (LABEL_LOOKUP_PAUSES_S, 120 s in all) before renting again; if the list cannot
        be read, we stop rather than risk renting twice."""
        body = build_create_body(request, self._runtype)
        url = f"{self._base_url}/asks/{self._path_id(offer_id, 'offer id')}/"
        failure: _Failure | None = None
        for attempt in range(1, self._retry.max_attempts + 1):
            outcome = self._send("PUT", url, ENDPOINT_CREATE, json_body=body, read_timeout_s=self._timeouts.create_s)
            if isinstance(outcome, _Reply):
                if outcome.status >= 300:
                    raise self._refusal(classify_error(outcome.status, outcome.payload), "PUT", url, offer_id)
                contract_id = self._new_contract(outcome, offer_id)
                if contract_id is not None:
                    return contract_id
                failure = _Failure("vast.ai create returned no new_contract", maybe_processed=True)
            else:
                failure = outcome
            log.warning(
                "vast.ai create on offer %s: %s (attempt %d/%d)",
                offer_id, failure.description, attempt, self._retry.max_attempts,
            )
            if failure.maybe_processed:
                existing = self._await_label(request.label, offer_id, failure.description)
                if existing is not None:
                    return existing.contract_id
            elif attempt < self._retry.max_attempts:
                self._sleep(retry_delay(attempt, self._retry, failure.retry_after, self._jitter()))
        assert failure is not None
        raise TemporaryMarketplaceError(
            f"vast.ai create on offer {offer_id} failed after {self._retry.max_attempts} attempts: "
            f"{failure.description}"
        )

    def list_instances(self) -> Sequence[Instance]:
        return self._list({})

    def instances_labelled(self, labels: Sequence[str]) -> Sequence[Instance]:
        """The account's instances carrying one of `labels` (server-side filter, as the CLI's `--label`)."""
        wanted = set(labels)
        rows = self._list({"label": {"in": sorted(wanted)}})
        return [i for i in rows if i.label in wanted]  # defence: a dropped filter must not widen the answer

    def get_instance(self, contract_id: str) -> Instance | None:
        url = f"{self._base_url}/instances/{self._path_id(contract_id, 'contract id')}/"
        reply = self._call("GET", url, ENDPOINT_SHOW, params={"owner": "me"}, answers=_GONE)
        if reply.status == 404:
            return None  # classified as no-such-instance by its body
        payload = reply.payload
        if not isinstance(payload, Mapping) or "instances" not in payload:
            raise TemporaryMarketplaceError(f"vast.ai instance {contract_id} returned an unusable response")
        row = payload["instances"]
        if isinstance(row, list):
            # Older responses wrapped the one row in a list.
            row = row[0] if row else None
        if row is None:
            return None
        try:
            return parse_instance(row)
        except ValueError as exc:
            raise TemporaryMarketplaceError(f"vast.ai instance {contract_id} is malformed: {exc}") from None

    def destroy_instance(self, contract_id: str) -> None:
        """Destroy; a missing instance is done. 404 `no_such_instance` ("Instance {id} not found.") says so
        (vast-ai/docs api-reference/openapi/yaml/auto_delete_api_v0_instances_id_4ff617.yaml
        @4c1c6573188557cd4a630a578236cdb4f62c9f40); the older `not_found` "Instance not found" names no instance
        and is believed only once show-instance answers `{"instances": null}`."""
        url = f"{self._base_url}/instances/{self._path_id(contract_id, 'contract id')}/"
        reply = self._call("DELETE", url, ENDPOINT_DESTROY, json_body={}, answers=_GONE_ON_DELETE)
        if reply.status == 404:
            error = classify_error(404, reply.payload)
            if error.kind == KIND_INSTANCE_NOT_FOUND and self.get_instance(contract_id) is not None:
                raise TemporaryMarketplaceError(
                    f"vast.ai answered DELETE {urlsplit(url).path} with 404 {error.code} "
                    f"({self._quote(error.message)}), but show-instance still lists it; not reading it as gone")
            log.info("vast.ai: instance %s was already gone", contract_id)
            return
        if isinstance(reply.payload, Mapping) and reply.payload.get("success") is False:
            raise PermanentMarketplaceError(
                f"vast.ai refused to destroy instance {contract_id}: {self._quote(_api_message(reply.payload))}"
            )

    # -- helpers ---------------------------------------------------------------------------------

    def _list(self, select_filters: Mapping[str, Any]) -> list[Instance]:
        instances: list[Instance] = []
        seen_tokens: set[str] = set()
        params: dict[str, str] = {
            "limit": str(INSTANCE_PAGE_LIMIT),
            "order_by": json.dumps([{"col": "id", "dir": "asc"}]),
        }
        if select_filters:
            params["select_filters"] = json.dumps(select_filters)
        for _ in range(MAX_INSTANCE_PAGES):
            reply = self._call("GET", f"{self._v1_url}/instances/", ENDPOINT_LIST, params=params)
            payload = reply.payload
            if not isinstance(payload, Mapping) or not isinstance(payload.get("instances"), list):
                raise TemporaryMarketplaceError("vast.ai instance list returned an unusable response")
            for index, raw in enumerate(payload["instances"]):
                try:
                    instances.append(parse_instance(raw))
                except ValueError as exc:
                    log.warning("vast.ai: skipping malformed instance row #%d: %s", index, exc)
            token = payload.get("next_token")
            if not token:
                return _unique(instances)
            if not isinstance(token, str) or token in seen_tokens:
                raise TemporaryMarketplaceError("vast.ai instance list returned a repeating page token")
            seen_tokens.add(token)
            params = {**params, "after_token": token}
        raise TemporaryMarketplaceError(f"vast.ai instance list did not end after {MAX_INSTANCE_PAGES} pages")

    def _await_label(self, label: str, offer_id: str, why: str) -> Instance | None:
        """The instance an ambiguous create may have rented, looked for over the commit window."""
        waited = 0.0
        for pause in self._label_pauses:
            if pause > 0:
                self._say(f"vast.ai: create on offer {offer_id} for {label} got no clear answer ({why}); "
                          f"{waited:.0f} s after, no instance carries the label yet; looking again in {pause:.0f} s "
                          "(a create can commit late) before renting again")
                self._sleep(pause)
                waited += pause
            try:
                matches = self.instances_labelled([label])
            except MarketplaceAuthError:
                raise
            except MarketplaceError as exc:
                raise TemporaryMarketplaceError(
                    f"vast.ai create on offer {offer_id} had an ambiguous failure and the instance list could not "
                    f"be read to check for label {label}; not retrying, to avoid renting twice: {exc}"
                ) from None
            if matches:
                found = max(matches, key=lambda i: int(i.contract_id) if i.contract_id.isdigit() else 0)
                log.warning("vast.ai create on offer %s: instance %s with label %s exists; not creating again",
                            offer_id, found.contract_id, label)
                return found
        return None

    def _new_contract(self, reply: _Reply, offer_id: str) -> str | None:
        payload = reply.payload
        if not isinstance(payload, Mapping):
            return None
        if payload.get("success") is False:
            error = classify_error(404 if payload.get("error") == "no_such_ask" else 400, payload)
            if error.kind == KIND_OFFER_TAKEN:
                raise OfferTakenError(f"vast.ai: offer {offer_id} was taken: {self._quote(error.message)}")
            raise PermanentMarketplaceError(
                f"vast.ai refused offer {offer_id}: {self._quote(_api_message(payload))}"
            )
        try:
            return _ident(payload, "new_contract")
        except ValueError:
            return None

    def _refusal(self, error: ApiError, method: str, url: str, offer_id: str | None = None) -> MarketplaceError:
        """The exception for a refused call: auth errors stop the run, an offer taken tries the next one."""
        path = urlsplit(url).path
        said = f"HTTP {error.status}: {self._quote(error.message)}"
        if error.kind == KIND_KEY_REFUSED:
            return MarketplaceAuthError(
                f"vast.ai rejected the API key from {self.key_source} ({said}): the key is unknown or was deleted. "
                "Stopping: no slot is dropped, no instance destroyed, nothing recorded. Set a valid key and run again.",
                kind=error.kind, key_source=self.key_source)
        if error.kind == KIND_SESSION_EXPIRED:
            return MarketplaceAuthError(
                f"vast.ai says the session of the API key from {self.key_source} expired ({said}); this 404 does "
                "not mean anything is gone. Stopping: no slot is dropped, no instance destroyed, nothing recorded. "
                "Renew the key (or its 2FA session) and run again.",
                kind=error.kind, key_source=self.key_source)
        if error.kind == KIND_PERMISSION:
            return MarketplaceAuthError(
                f"vast.ai forbids {method} {path} for the API key from {self.key_source} ({said}): a scoped key needs "
                "the permissions misc (search), instance_read (list/show) and instance_write (create/destroy). "
                "Stopping: no slot is dropped, no instance destroyed, nothing recorded.",
                kind=error.kind, key_source=self.key_source)
        if error.kind == KIND_OFFER_TAKEN:
            return OfferTakenError(f"vast.ai: offer {offer_id} is no longer available ({said}); another offer may be")
        if error.kind == KIND_UNEXPLAINED_404:
            return TemporaryMarketplaceError(
                f"vast.ai {method} {path} answered 404 without saying what is missing ({said}); not reading it as "
                "'gone'")
        return PermanentMarketplaceError(f"vast.ai {method} {path} rejected the request ({said})")

    @staticmethod
    def _path_id(value: str, what: str) -> str:
        if not isinstance(value, str) or not _NUMERIC_ID.fullmatch(value):
            raise PermanentMarketplaceError(f"vast.ai {what} must be a number, got {value!r}")
        return value

    def _quote(self, message: str | None) -> str:
        if not message:
            return "(no message)"
        message = message.replace(self._key.reveal(), "<redacted>")
        return message if len(message) <= MAX_QUOTED_MESSAGE else message[:MAX_QUOTED_MESSAGE] + "..."

    def _say(self, message: str) -> None:
        if self.notify is not None:
            self.notify(message)
        else:
            log.warning("%s", message)

    def _call(
        self,
        method: str,
        url: str,
        endpoint: str,
        *,
        params: Mapping[str, str] | None = None,
        json_body: Any = None,
        answers: frozenset[str] = frozenset(),
    ) -> _Reply:
        """One idempotent call with retries: every read, search and destroy may safely be repeated.
        `answers`: error kinds that are an answer, not an error (a 404 "no such instance" to a show)."""
        for attempt in range(1, self._retry.max_attempts + 1):
            outcome = self._send(method, url, endpoint, params=params, json_body=json_body)
            if isinstance(outcome, _Reply):
                if outcome.status < 300:
                    return outcome
                error = classify_error(outcome.status, outcome.payload)
                if error.kind in answers:
                    return _Reply(outcome.status, outcome.payload)
                raise self._refusal(error, method, url)
            path = urlsplit(url).path
            if attempt == self._retry.max_attempts:
                raise TemporaryMarketplaceError(
                    f"vast.ai {method} {path} failed after {attempt} attempts: {outcome.description}"
                )
            delay = retry_delay(attempt, self._retry, outcome.retry_after, self._jitter())
            log.warning(
                "vast.ai %s %s: %s (attempt %d/%d); retrying in %.1fs",
                method, path, outcome.description, attempt, self._retry.max_attempts, delay,
            )
            self._sleep(delay)
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover

    def _pace(self, endpoint: str, method: str, path: str) -> None:
        now = self._clock()
        bucket = self._pacer.bucket(endpoint)
        held = bucket.blocked_until - now
        if held > self._retry.max_retry_after_s:
            # vast asked this key to stay away longer than one call waits (a Retry-After of hours): refuse here,
            # without a request, until it passes; every client of the key in this process shares the hold.
            raise MarketplaceRateLimitedError(
                f"vast.ai {method} {path}: not calling vast.ai again before the wait it asked for ends, in "
                f"{_duration(held)} ({bucket.blocked_why})", retry_after_s=held)
        go = bucket.reserve(now)
        wait = go - now
        if wait <= 0:
            return
        if wait >= self._pacing.announce_after_s:
            what = (f"at most one create per {self._pacing.create_interval_s:g} s per API key"
                    if endpoint == ENDPOINT_CREATE else f"at most {self._pacing.read_rate_per_s:g} {endpoint} calls "
                    "a second per API key")
            self._say(f"vast.ai: waiting {wait:.1f} s before {method} {path} (pacing: {what})")
        self._sleep(wait)

    def _send(
        self,
        method: str,
        url: str,
        endpoint: str,
        *,
        params: Mapping[str, str] | None = None,
        json_body: Any = None,
        read_timeout_s: float | None = None,
    ) -> _Reply | _Failure:
        """Paced sending; waits out 429s (they are never acted on: safe to repeat, even for a create)."""
        path = urlsplit(url).path
        for waits in range(1, self._pacing.max_rate_limited + 2):
            self._pace(endpoint, method, path)
            outcome = self._attempt(method, url, params=params, json_body=json_body, read_timeout_s=read_timeout_s)
            if not isinstance(outcome, _RateLimited):
                return outcome
            if waits > self._pacing.max_rate_limited:
                break
            quota = outcome.code == "search_quota_exceeded"
            if quota or (outcome.retry_after is not None and outcome.retry_after > self._retry.max_retry_after_s):
                raise self._hold(method, path, endpoint, outcome, quota)
            if outcome.retry_after is not None:
                wait, why = min(outcome.retry_after, self._retry.max_retry_after_s), "Retry-After"
            elif endpoint == ENDPOINT_CREATE:
                wait = self._pacing.create_penalty_wait_s + 2.0 * self._jitter()
                why = "no Retry-After; create penalty"
            else:
                wait = backoff_delay(waits, self._pacing.read_backoff_base_s, self._pacing.read_backoff_max_s,
                                     self._jitter())
                why = "no Retry-After; backoff"
            # Every caller of this key waits: the penalty is the key's, not this thread's.
            self._pacer.bucket(endpoint).block(self._clock() + wait)
            self._say(f"vast.ai: {method} {path} was rate limited (HTTP 429: {self._quote(outcome.body)}); waiting "
                      f"{wait:.1f} s ({why}), wait {waits} of {self._pacing.max_rate_limited}")
        raise TemporaryMarketplaceError(
            f"vast.ai {method} {path} is still rate limited after {self._pacing.max_rate_limited} waits; "
            "try again later")

    def _hold(self, method: str, path: str, endpoint: str, outcome: _RateLimited,
              quota: bool) -> MarketplaceRateLimitedError:
        """A 429 asking for a longer wait than one call may take (429 `search_quota_exceeded`: the daily search
        row quota, Retry-After in seconds, possibly hours; issue 23 from vast-ai/docs' current API reference):
        honoured to the second and said, never retried earlier. The key's endpoint is held until then, so no
        later call of this process reaches vast.ai before it (`_pace`); the error carries the delay."""
        wait = outcome.retry_after if outcome.retry_after is not None else QUOTA_WAIT_WITHOUT_RETRY_AFTER_S
        given = f"Retry-After {wait:.0f} s" if outcome.retry_after is not None else \
            f"no Retry-After: waiting {_duration(wait)}"
        why = f"HTTP 429 {outcome.code or 'rate limited'}: {self._quote(outcome.body)}; {given}"
        self._pacer.bucket(endpoint).block(self._clock() + wait, why)
        what = "the daily search quota is used up" if quota else "rate limited for longer than a call waits"
        again = "searching" if endpoint == ENDPOINT_SEARCH else f"calling {endpoint}"
        message = (f"vast.ai {method} {path}: {what} ({why}); not {again} again before it passes, in "
                   f"{_duration(wait)}")
        self._say(message)
        return MarketplaceRateLimitedError(message, retry_after_s=wait)

    def _attempt(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, str] | None = None,
        json_body: Any = None,
        read_timeout_s: float | None = None,
    ) -> _Reply | _Failure | _RateLimited:
        """Send once. Returns the reply (any status), a retryable failure, or a 429."""
        headers = {"Authorization": f"Bearer {self._key.reveal()}"}
        timeout = self._timeouts.to_httpx(read_timeout_s) if read_timeout_s is not None else None
        try:
            if timeout is not None:
                response = self._http.request(method, url, params=params, json=json_body, headers=headers,
                                              timeout=timeout)
            else:
                response = self._http.request(method, url, params=params, json=json_body, headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            # No connection was made: the server never saw the request.
            return _Failure(f"cannot connect ({type(exc).__name__})", maybe_processed=False)
        except httpx.TimeoutException as exc:
            return _Failure(f"no answer in time ({type(exc).__name__})", maybe_processed=True)
        except httpx.TransportError as exc:
            return _Failure(f"connection failed ({type(exc).__name__})", maybe_processed=True)
        status = response.status_code
        payload = _json_or_none(response)
        if status == 429:
            return _RateLimited(parse_retry_after(response.headers.get("Retry-After")),
                                _api_message(payload) or response.text.strip()[:200],
                                classify_error(429, payload).code)
        if status >= 500:
            return _Failure(
                f"server error (HTTP {status})",
                maybe_processed=True,
                retry_after=parse_retry_after(response.headers.get("Retry-After")),
            )
        if status >= 300:
            return _Reply(status, payload if payload is not _UNPARSEABLE else response.text)
        if payload is _UNPARSEABLE:
            return _Failure(f"unparseable response body (HTTP {status})", maybe_processed=True)
        return _Reply(status, payload)


_UNPARSEABLE: Any = object()

#: A 429 `search_quota_exceeded` without its Retry-After (the reference says it carries one): wait an hour rather
#: than try again at once (ASSUMED; the quota is daily, so a longer wait is never wrong, a shorter one hammers).
QUOTA_WAIT_WITHOUT_RETRY_AFTER_S = 3600.0


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (ValueError, UnicodeDecodeError):
        return _UNPARSEABLE


def _unique(instances: list[Instance]) -> list[Instance]:
    """Pages can overlap when instances come and go between requests; keep the first of each id."""
    seen: set[str] = set()
    result: list[Instance] = []
    for instance in instances:
        if instance.contract_id not in seen:
            seen.add(instance.contract_id)
            result.append(instance)
    return result

"""The vast.ai adapter of the marketplace port: the only package that speaks vast.ai's REST API.

Place in the flow: the slot provider (Pulumi's dynamic provider, or `fleet apply` without Pulumi) asks
this client for offers, rents one, polls it and destroys it. Everything above sees only the dataclasses
of `reconciler.domain.marketplace`; HTTP status codes, vast's JSON shapes and retries stop here.

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

Split by concern: `wire` (bodies, parsing: pure), `errors` (what a refusal means: pure), `pacing` (GCRA buckets,
backoff: pure arithmetic), `client` (`VastAiMarketplace`: HTTP, retries, the late-commit window). This package
re-exports their names, so `reconciler.adapters.marketplace.vastai.X` keeps working for every caller (and for
any pickle that names the old module path).
"""

from reconciler.adapters.marketplace.vastai.client import (
    API_KEY_ENV,
    DEFAULT_BASE_URL,
    INSTANCE_PAGE_LIMIT,
    LABEL_LOOKUP_PAUSES_S,
    MAX_INSTANCE_PAGES,
    MAX_QUOTED_MESSAGE,
    QUOTA_WAIT_WITHOUT_RETRY_AFTER_S,
    Timeouts,
    TimeSource,
    VastAiMarketplace,
)
from reconciler.adapters.marketplace.vastai.errors import (
    AUTH_KINDS,
    KIND_INSTANCE_NOT_FOUND,
    KIND_KEY_REFUSED,
    KIND_NO_SUCH_INSTANCE,
    KIND_OFFER_TAKEN,
    KIND_PERMISSION,
    KIND_RATE_LIMITED,
    KIND_REJECTED,
    KIND_SEARCH_QUOTA,
    KIND_SERVER,
    KIND_SESSION_EXPIRED,
    KIND_UNEXPLAINED_404,
    ApiError,
    classify_error,
)
from reconciler.adapters.marketplace.vastai.pacing import (
    ENDPOINT_CREATE,
    ENDPOINT_DESTROY,
    ENDPOINT_LIST,
    ENDPOINT_SEARCH,
    ENDPOINT_SHOW,
    GcraBucket,
    KeyPacer,
    Pacing,
    RetryPolicy,
    pacer_for,
    parse_retry_after,
    retry_delay,
)
from reconciler.adapters.marketplace.vastai.wire import (
    CPU_RAM_MB_PER_GB,
    DEFAULT_RUNTYPE,
    ONSTART_MAX_CHARS,
    build_create_body,
    build_search_body,
    check_env,
    docker_env_flags,
    normalise_status,
    parse_instance,
    parse_offer,
    parse_offers,
    raw_refusal,
)

__all__ = [
    "API_KEY_ENV",
    "AUTH_KINDS",
    "CPU_RAM_MB_PER_GB",
    "DEFAULT_BASE_URL",
    "DEFAULT_RUNTYPE",
    "ENDPOINT_CREATE",
    "ENDPOINT_DESTROY",
    "ENDPOINT_LIST",
    "ENDPOINT_SEARCH",
    "ENDPOINT_SHOW",
    "INSTANCE_PAGE_LIMIT",
    "KIND_INSTANCE_NOT_FOUND",
    "KIND_KEY_REFUSED",
    "KIND_NO_SUCH_INSTANCE",
    "KIND_OFFER_TAKEN",
    "KIND_PERMISSION",
    "KIND_RATE_LIMITED",
    "KIND_REJECTED",
    "KIND_SEARCH_QUOTA",
    "KIND_SERVER",
    "KIND_SESSION_EXPIRED",
    "KIND_UNEXPLAINED_404",
    "LABEL_LOOKUP_PAUSES_S",
    "MAX_INSTANCE_PAGES",
    "MAX_QUOTED_MESSAGE",
    "ONSTART_MAX_CHARS",
    "QUOTA_WAIT_WITHOUT_RETRY_AFTER_S",
    "ApiError",
    "GcraBucket",
    "KeyPacer",
    "Pacing",
    "RetryPolicy",
    "TimeSource",
    "Timeouts",
    "VastAiMarketplace",
    "build_create_body",
    "build_search_body",
    "check_env",
    "classify_error",
    "docker_env_flags",
    "normalise_status",
    "pacer_for",
    "parse_instance",
    "parse_offer",
    "parse_offers",
    "parse_retry_after",
    "raw_refusal",
    "retry_delay",
]

"""The vast.ai client: the `Marketplace` port over vast.ai's REST API (httpx), with pacing, retries and the
commit window of a slow create. Bodies and parsing are `wire`'s, error meaning `errors`', waits `pacing`'s.

Secrets: the API key lives in a masked holder, goes only into the Authorization header, and is scrubbed
from every message; the worker env (it carries the instance token) is never logged.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from reconciler.adapters.closing import Closing
from reconciler.adapters.marketplace.vastai.errors import (
    _GONE,
    _GONE_ON_DELETE,
    KIND_INSTANCE_NOT_FOUND,
    KIND_KEY_REFUSED,
    KIND_OFFER_TAKEN,
    KIND_PERMISSION,
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
    Pacing,
    RetryPolicy,
    pacer_for,
    parse_retry_after,
    retry_delay,
)
from reconciler.adapters.marketplace.vastai.wire import (
    _NUMERIC_ID,
    DEFAULT_RUNTYPE,
    _ident,
    api_message,
    build_create_body,
    build_search_body,
    parse_instance,
    parse_offers,
)
from reconciler.adapters.settings import VAST_API_KEY_ENV, settings
from reconciler.domain.backoff import backoff_delay
from reconciler.domain.marketplace import (
    Instance,
    InstanceRequest,
    MarketplaceAuthError,
    MarketplaceError,
    MarketplaceRateLimitedError,
    Offer,
    OfferQuery,
    OfferTakenError,
    PermanentMarketplaceError,
    TemporaryMarketplaceError,
)

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://console.vast.ai/api/v0"
API_KEY_ENV = VAST_API_KEY_ENV
#: The v1 instance list serves at most 25 rows a page.
INSTANCE_PAGE_LIMIT = 25
#: A list that still has a next page after this many is a server bug, not a fleet.
MAX_INSTANCE_PAGES = 400
#: Longest piece of an API error message quoted in our exceptions.
MAX_QUOTED_MESSAGE = 300


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


#: After an ambiguous create (timeout, reset, 5xx, garbled answer): look for the label at these pauses
#: (seconds, cumulative 120 s - the CLI's own create timeout) before renting again. A create that commits
#: later than that is caught by the slot provider's duplicate check (two instances for one slot).
LABEL_LOOKUP_PAUSES_S: tuple[float, ...] = (0.0, 5.0, 10.0, 15.0, 30.0, 60.0)


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


class VastAiMarketplace(Closing):
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

    # -- the port --------------------------------------------------------------------------------

    def search_offers(self, query: OfferQuery) -> Sequence[Offer]:
        reply = self._call("POST", f"{self._base_url}/bundles/", ENDPOINT_SEARCH, json_body=build_search_body(query))
        try:
            return parse_offers(reply.payload)
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
                f"vast.ai refused to destroy instance {contract_id}: {self._quote(api_message(reply.payload))}"
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
                f"vast.ai refused offer {offer_id}: {self._quote(api_message(payload))}"
            )
        try:
            return _ident(payload, "new_contract")
        except ValueError:
            return None

    def _refusal(self, error: ApiError, method: str, url: str, offer_id: str | None = None) -> MarketplaceError:
        """The exception for a refused call: auth errors stop the run, an offer taken tries the next one."""
        path = urlsplit(url).path
        said = f"HTTP {error.status}: {self._quote(error.message)}"

        def stop(what: str, then: str = "") -> MarketplaceAuthError:
            return MarketplaceAuthError(
                f"{what} Stopping: no slot is dropped, no instance destroyed, nothing recorded.{then}",
                kind=error.kind, key_source=self.key_source)

        if error.kind == KIND_KEY_REFUSED:
            return stop(f"vast.ai rejected the API key from {self.key_source} ({said}): the key is unknown or was "
                        "deleted.", " Set a valid key and run again.")
        if error.kind == KIND_SESSION_EXPIRED:
            return stop(f"vast.ai says the session of the API key from {self.key_source} expired ({said}); this 404 "
                        "does not mean anything is gone.", " Renew the key (or its 2FA session) and run again.")
        if error.kind == KIND_PERMISSION:
            return stop(f"vast.ai forbids {method} {path} for the API key from {self.key_source} ({said}): a scoped "
                        "key needs the permissions misc (search), instance_read (list/show) and instance_write "
                        "(create/destroy).")
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
                                api_message(payload) or response.text.strip()[:200],
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

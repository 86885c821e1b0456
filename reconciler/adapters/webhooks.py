"""Webhooks: fleet events (reconciler/domain/events.py) POSTed as JSON to Slack-compatible incoming webhooks or
to any HTTP receiver ("generic" format), without ever blocking the reconcile loop.

- `notify()` only puts the event on a bounded queue (full: the event is dropped and counted, never waited
  for); one worker thread delivers. Tests drive `deliver_due()` with an injected clock instead of the thread.
- Retries: connection errors, timeouts, 408, 425, 429 and 5xx are retried with jittered exponential backoff
  (capped) until `give_up_after_s` has passed since the event was queued, so a receiver that is down for a
  while gets everything once it is back. Other 4xx are permanent (the receiver refuses it: logged, dropped).
- Once: each (target, event key) is delivered at most once by this process (delivered keys remembered); the
  receiver also gets an `Idempotency-Key` header and field, stable across retries and restarts, so it can
  drop the duplicate that a lost response would cause.
- Secrets: event texts are redacted when the event is built; the URL is a secret (Slack's URL is the
  credential): it lives in the environment, is never logged (targets log by name, error messages have the
  URL masked) and `repr()` of a target hides it.

Configuration (environment, read once by the cli): FLEET_WEBHOOK_URL (+ FLEET_WEBHOOK_FORMAT slack|generic,
FLEET_WEBHOOK_EVENTS comma list) for one target; FLEET_WEBHOOK_<NAME>_URL / _FORMAT / _EVENTS for more.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import queue
import random
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from reconciler.domain.events import EVENT_KINDS, FleetEvent
from reconciler.domain.redact import redact_line

log = logging.getLogger(__name__)

FORMATS = ("slack", "generic")
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
USER_AGENT = "gpu-fleet-webhooks/1"
_ENV_NAME = re.compile(r"^FLEET_WEBHOOK_(?:([A-Z0-9_]+)_)?URL$")


class WebhookConfigError(ValueError):
    """A webhook setting is wrong; the message names the variable (never its URL value)."""


@dataclass(frozen=True)
class WebhookTarget:
    name: str
    url: str = field(repr=False)
    format: str = "generic"
    kinds: frozenset[str] = frozenset(EVENT_KINDS)

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise WebhookConfigError(f"webhook {self.name}: format {self.format!r} is not one of {', '.join(FORMATS)}")
        if not re.match(r"^https?://[^\s/]+", self.url):
            raise WebhookConfigError(f"webhook {self.name}: the URL is not an http(s) URL (value not shown)")
        unknown = sorted(self.kinds - set(EVENT_KINDS))
        if unknown:
            raise WebhookConfigError(f"webhook {self.name}: unknown event kind(s) {', '.join(unknown)} "
                                     f"(known: {', '.join(EVENT_KINDS)})")


def targets_from_env(environ: Mapping[str, str]) -> list[WebhookTarget]:
    """FLEET_WEBHOOK_URL and FLEET_WEBHOOK_<NAME>_URL, each with optional _FORMAT and _EVENTS."""
    out = []
    for key in sorted(environ):
        match = _ENV_NAME.match(key)
        if not match or not environ[key].strip():
            continue
        prefix = key.removesuffix("URL")
        name = (match.group(1) or "default").lower()
        fmt = environ.get(prefix + "FORMAT", "").strip().lower() or (
            "slack" if "hooks.slack.com" in environ[key] else "generic")
        kinds_text = environ.get(prefix + "EVENTS", "").strip()
        kinds = frozenset(k.strip() for k in kinds_text.split(",") if k.strip()) or frozenset(EVENT_KINDS)
        try:
            out.append(WebhookTarget(name, environ[key].strip(), fmt, kinds))
        except WebhookConfigError as exc:
            raise WebhookConfigError(f"{key}: {exc}") from None
    return out


def _slack_escape(text: str) -> str:
    # Slack mrkdwn: &, < and > are control characters (links, mentions) and must be escaped.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_SEVERITY_ICON = {"info": ":information_source:", "warning": ":warning:", "critical": ":rotating_light:"}


def payload(event: FleetEvent, fmt: str) -> dict[str, Any]:
    if fmt == "slack":
        facts = ", ".join(f"{k}={v}" for k, v in event.fields.items() if k not in ("reason",))
        return {
            "text": f"[gpu-fleet] {event.title}",
            "blocks": [
                {"type": "section", "text": {"type": "mrkdwn", "text":
                    f"{_SEVERITY_ICON.get(event.severity, '')} *{_slack_escape(event.kind)}*: "
                    f"{_slack_escape(event.title)}"}},
                {"type": "context", "elements": [{"type": "mrkdwn", "text":
                    _slack_escape(f"{event.at} | {facts} | id {event.idempotency_key}")[:2900]}]},
            ],
        }
    return {"source": "gpu-fleet", "kind": event.kind, "idempotency_key": event.idempotency_key, "at": event.at,
            "severity": event.severity, "title": event.title, "fields": dict(event.fields)}


class Poster(Protocol):
    def __call__(self, url: str, body: bytes, headers: Mapping[str, str]) -> int: ...


class HttpxPoster:
    """POSTs with httpx: short timeouts (a slow receiver must not hold deliveries to others for long)."""

    def __init__(self, timeout_s: float = 5.0):
        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s), follow_redirects=False)

    def __call__(self, url: str, body: bytes, headers: Mapping[str, str]) -> int:
        return self._client.post(url, content=body, headers=dict(headers)).status_code

    def close(self) -> None:
        self._client.close()


@dataclass(order=True)
class _Delivery:
    due: float
    seq: int
    target: WebhookTarget = field(compare=False)
    event: FleetEvent = field(compare=False)
    queued_at: float = field(compare=False, default=0.0)
    attempts: int = field(compare=False, default=0)


@dataclass
class WebhookStats:
    queued: int = 0
    delivered: int = 0
    retried: int = 0
    dropped_full: int = 0
    failed: int = 0  # permanent refusal or gave up
    skipped_duplicate: int = 0


class WebhookNotifier:
    def __init__(self, targets: Iterable[WebhookTarget], *, poster: Poster | None = None,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 max_queue: int = 1000, backoff_s: float = 2.0, max_backoff_s: float = 300.0,
                 give_up_after_s: float = 24 * 3600.0, remember: int = 10_000):
        self.targets = tuple(targets)
        self._poster: Poster = poster if poster is not None else HttpxPoster()
        self._clock = clock
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not a secret
        self._inbox: queue.Queue[FleetEvent] = queue.Queue(maxsize=max_queue)
        self._pending: list[_Delivery] = []
        self._seq = itertools.count()
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._give_up_after_s = give_up_after_s
        self._delivered: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._queued: set[tuple[str, str]] = set()
        self._remember = remember
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = WebhookStats()

    # --- the loop's side: never blocks -----------------------------------------------------------------------

    def notify(self, event: FleetEvent) -> bool:
        """Queue `event` for every target that wants its kind. False: the queue is full and it was dropped."""
        if not any(event.kind in t.kinds for t in self.targets):
            return True
        try:
            self._inbox.put_nowait(event)
        except queue.Full:
            self.stats.dropped_full += 1
            log.warning("webhooks: queue full (%d), dropped %s event %s", self._inbox.maxsize, event.kind,
                        event.idempotency_key)
            return False
        self.stats.queued += 1
        self._wake.set()
        return True

    # --- delivery ------------------------------------------------------------------------------------------

    def _take_inbox(self) -> None:
        now = self._clock()
        while True:
            try:
                event = self._inbox.get_nowait()
            except queue.Empty:
                return
            for target in self.targets:
                ident = (target.name, event.key)
                if event.kind not in target.kinds:
                    continue
                if ident in self._delivered or ident in self._queued:
                    self.stats.skipped_duplicate += 1  # the same fact derived again: one delivery
                    continue
                self._queued.add(ident)
                heapq.heappush(self._pending, _Delivery(now, next(self._seq), target, event, now))

    def next_due(self) -> float | None:
        with self._lock:
            self._take_inbox()
            return self._pending[0].due if self._pending else None

    def deliver_due(self) -> int:
        """Attempt every delivery that is due now; returns how many were delivered."""
        delivered = 0
        with self._lock:
            self._take_inbox()
            now = self._clock()
            due = []
            while self._pending and self._pending[0].due <= now:
                due.append(heapq.heappop(self._pending))
        for d in due:
            if self._attempt(d):
                delivered += 1
        return delivered

    def _attempt(self, d: _Delivery) -> bool:
        ident = (d.target.name, d.event.key)
        d.attempts += 1
        body = json.dumps(payload(d.event, d.target.format), sort_keys=True).encode()
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT,
                   "Idempotency-Key": d.event.idempotency_key}
        problem: str | None
        try:
            status = self._poster(d.target.url, body, headers)
            problem = None if 200 <= status < 300 else f"HTTP {status}"
            retry = status in RETRY_STATUSES
        except Exception as exc:  # connection refused, timeout, DNS: the receiver may come back
            status, retry = 0, True
            problem = f"{type(exc).__name__}: {self._masked(str(exc), d.target)}"
        if problem is None:
            with self._lock:
                self._queued.discard(ident)
                self._delivered[ident] = None
                while len(self._delivered) > self._remember:
                    self._delivered.popitem(last=False)
            self.stats.delivered += 1
            log.info("webhook %s: delivered %s %s (attempt %d)", d.target.name, d.event.kind,
                     d.event.idempotency_key, d.attempts)
            return True
        age = self._clock() - d.queued_at
        if not retry or age >= self._give_up_after_s:
            with self._lock:
                self._queued.discard(ident)
            self.stats.failed += 1
            why = "refused" if not retry else f"gave up after {d.attempts} attempts"
            log.error("webhook %s: %s %s %s: %s", d.target.name, why, d.event.kind, d.event.idempotency_key, problem)
            return False
        delay = min(self._max_backoff_s, self._backoff_s * 2 ** (d.attempts - 1)) * (0.5 + self._rng.random() / 2)
        d.due = self._clock() + delay
        self.stats.retried += 1
        log.warning("webhook %s: %s %s failed (%s), retry %d in %.1fs", d.target.name, d.event.kind,
                    d.event.idempotency_key, problem, d.attempts, delay)
        with self._lock:
            heapq.heappush(self._pending, d)
        return False

    @staticmethod
    def _masked(text: str, target: WebhookTarget) -> str:
        host = re.sub(r"^https?://", "", target.url).split("/", 1)[0]
        return redact_line(text.replace(target.url, "[webhook url]").replace(target.url.split("?")[0],
                                                                               "[webhook url]")).replace(
            host, "[webhook host]")

    def pending(self) -> int:
        with self._lock:
            self._take_inbox()
            return len(self._pending)

    def flush(self, timeout_s: float, sleep: Callable[[float], object] = time.sleep) -> int:
        """For a one-shot command (`fleet apply`): deliver what is queued, retrying until `timeout_s` has passed
        on this notifier's clock; returns how many deliveries are still pending (logged, then given up)."""
        deadline = self._clock() + timeout_s
        while True:
            self.deliver_due()
            due = self.next_due()
            if due is None:
                return 0
            if due > deadline:
                left = self.pending()
                log.warning("webhooks: %d event(s) not delivered before exit (receiver down?)", left)
                return left
            sleep(max(0.0, due - self._clock()))

    # --- the worker thread ----------------------------------------------------------------------------------

    def start(self) -> WebhookNotifier:
        if self._thread is None and self.targets:
            self._thread = threading.Thread(target=self._run, name="fleet-webhooks", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.deliver_due()
            except Exception:  # the worker must outlive any single bad delivery
                log.exception("webhooks: delivery loop error")
            due = self.next_due()
            timeout = None if due is None else max(0.0, due - self._clock())
            self._wake.wait(timeout if timeout is None else min(timeout, 60.0))
            self._wake.clear()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the worker (after one last attempt at what is due); undelivered events are logged."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        left = self.pending()
        if left:
            log.warning("webhooks: stopping with %d undelivered event(s)", left)
        if isinstance(self._poster, HttpxPoster):
            self._poster.close()

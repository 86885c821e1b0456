"""How fast one vast.ai API key may call, and how long to wait after a failure: GCRA buckets per key and endpoint
class, bounded jittered backoff. Pure arithmetic on an injected clock (the client does the waiting).
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from reconciler.domain.backoff import backoff_delay


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

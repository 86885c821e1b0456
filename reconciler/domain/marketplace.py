"""The marketplace port: what the planner and the slot provider need from a GPU rental market.

Adapters: `vastai/` (the real vast.ai REST API over httpx) and `local.py` (declared machines on this
host, for the demo and tests). Both return these dataclasses; nothing above this layer sees HTTP.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from reconciler.domain import errors


class MarketplaceError(errors.FleetError):
    """Base of every marketplace failure. Callers never turn one into a verdict or a kill."""

    reason = errors.MARKETPLACE_UNAVAILABLE


class TemporaryMarketplaceError(MarketplaceError):
    """Worth retrying later: HTTP 429/5xx, timeouts, connection errors, unparseable bodies."""

    temporary = True


class MarketplaceRateLimitedError(TemporaryMarketplaceError):
    """The market asks us to wait longer than one call may (vast: 429 `search_quota_exceeded`, the daily search
    row quota, with `Retry-After` in seconds, possibly hours). `retry_after_s`: how long, from when it said so;
    nobody may call that endpoint again before then (the adapter refuses locally until it passes)."""

    reason = errors.RATE_LIMITED

    def __init__(self, message: str, *, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PermanentMarketplaceError(MarketplaceError):
    """Retrying will not help: request rejected (400), offer gone (404 on create), key refused."""

    temporary = False
    reason = errors.MARKETPLACE_REJECTED


class OfferTakenError(PermanentMarketplaceError):
    """The offer was rented by someone else since the search (vast: 404 `no_such_ask`): try the next offer."""


class MarketplaceAuthError(PermanentMarketplaceError):
    """The market refuses our credentials: unknown/deleted key, expired session, missing permission.

    Stops the whole run: every later call would fail the same way, and a refused read says nothing about
    the instances (vast answers an expired session with 404). Nothing may be dropped, destroyed or recorded
    on it. `key_source` names where the key came from, so the operator knows what to fix."""

    reason = errors.MARKETPLACE_AUTH

    def __init__(self, message: str, *, kind: str, key_source: str):
        super().__init__(message)
        self.kind = kind
        self.key_source = key_source


@dataclass(frozen=True)
class OfferQuery:
    """What a pool asks of the market. `exclude_machine_ids` are the bad-machine records."""

    gpu_name: str
    num_gpus: int = 1
    max_price_usd_per_hour: float = 1.0
    min_reliability: float = 0.95
    min_inet_down_mbps: float = 0.0
    min_disk_gb: float = 0.0
    min_cpu_ram_gb: float = 0.0
    min_cuda: float = 0.0
    verified_only: bool = True
    exclude_machine_ids: frozenset[str] = frozenset()
    limit: int = 64
    #: True: the pool runs on owned hosts (offers of the `hosts` adapter) carrying every one of `host_labels`.
    owned_hosts: bool = False
    host_labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Offer:
    offer_id: str
    machine_id: str
    host_id: str
    gpu_name: str
    num_gpus: int
    price_usd_per_hour: float
    reliability: float
    inet_down_mbps: float = 0.0
    disk_gb: float = 0.0
    cpu_ram_gb: float = 0.0
    cuda_max_good: float = 0.0
    verified: bool = True
    geolocation: str | None = None
    #: One GPU of an owned host (the `hosts` adapter), not a marketplace rental; `labels` are the host's.
    owned: bool = False
    labels: tuple[tuple[str, str], ...] = ()


class OfferList(list[Offer]):
    """Offers as a search returned them, and whether the market cut its answer short (vast: `truncated: true`).

    A truncated answer is never complete: the offers it lacks may fit, so "none of these fits" never means "the
    market has none" (the slot provider says so instead of naming a shortfall). `dropped`: rows the adapter's
    own filters removed (e.g. `rented`, which the server does not filter)."""

    def __init__(self, offers: Iterable[Offer] = (), *, truncated: bool = False, dropped: int = 0):
        super().__init__(offers)
        self.truncated = truncated
        self.dropped = dropped


def is_truncated(offers: Sequence[Offer]) -> bool:
    """Whether the market said this answer was cut short (a plain sequence: a complete answer)."""
    return isinstance(offers, OfferList) and offers.truncated


@dataclass(frozen=True)
class InstanceRequest:
    """Everything needed to start one worker on an offer. `env` carries the instance token: a secret."""

    image: str
    disk_gb: int
    label: str
    env: Mapping[str, str] = field(default_factory=dict)
    onstart: str | None = None
    image_login: str | None = None


@dataclass(frozen=True)
class Instance:
    """A rented instance as the market reports it. `status` is normalised: see `INSTANCE_STATUSES`."""

    contract_id: str
    label: str | None
    machine_id: str
    host_id: str
    status: str
    gpu_name: str | None = None
    price_usd_per_hour: float | None = None
    image: str | None = None
    status_msg: str | None = None
    start_date: float | None = None

    @property
    def is_dead(self) -> bool:
        return self.status in DEAD_INSTANCE_STATUSES


#: Every status an instance can have (vast's `actual_status`, normalised: null/created -> loading):
#: loading (provisioning, image pull), scheduling (waiting for the machine's resources), running, rebooting
#: (transient), frozen (paused, GPU still billed), stopped (halted, storage still billed), exited (the
#: container's process ended), offline (host disconnected), unknown (no recent heartbeat from the host).
INSTANCE_STATUSES = ("loading", "scheduling", "running", "rebooting", "frozen", "stopped", "exited", "offline",
                     "unknown")
#: Statuses after which the instance will not run our worker again on its own.
DEAD_INSTANCE_STATUSES = frozenset({"stopped", "exited", "offline"})


class Marketplace(Protocol):
    """The five calls a slot needs. Implementations raise MarketplaceError subclasses only."""

    def search_offers(self, query: OfferQuery) -> Sequence[Offer]:
        """Offers fitting `query`; an `OfferList` with `truncated` when the market cut its answer short."""
        ...

    def create_instance(self, offer_id: str, request: InstanceRequest) -> str:
        """Rent the offer; return the new contract (instance) id."""
        ...

    def list_instances(self) -> Sequence[Instance]: ...

    def get_instance(self, contract_id: str) -> Instance | None:
        """None when the market no longer knows the instance (destroyed)."""
        ...

    def destroy_instance(self, contract_id: str) -> None:
        """Idempotent: destroying an instance that is already gone is not an error."""
        ...
